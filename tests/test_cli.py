"""The command line: help, and the guard against exposing the default master key."""

import os
import subprocess
import sys


def llmgw(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gateway.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


def test_help_lists_the_subcommands() -> None:
    out = llmgw("--help").stdout
    assert all(name in out for name in ("serve", "engine", "migrate", "keys"))


def test_serving_beyond_loopback_with_the_default_master_key_is_refused() -> None:
    env = {k: v for k, v in os.environ.items() if k != "LLMGW_MASTER_KEY"}
    result = llmgw("serve", "--host", "0.0.0.0", "--port", "1", env=env)
    assert result.returncode == 2 and "LLMGW_MASTER_KEY" in result.stderr


def test_a_settings_mistake_is_one_short_message_and_exit_2(tmp_path) -> None:
    """A misspelt or invalid setting stops the gateway with the setting named, not a traceback (and a
    misspelt key is an error: before, LLMGW_CACHE__SEMANTIC=false was silently ignored)."""
    typo = tmp_path / "typo.yaml"
    typo.write_text("databse_url: postgresql://db/llmgw\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("models: [\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    cases = [
        ({"LLMGW_CACHE__SEMANTIC": "false"}, "cache.semantic"),
        ({"LLMGW_ENGINE__DTPYE": "int8"}, "engine.dtpye"),
        ({"LLMGW_PORT": "74408"}, "port"),
        ({"LLMGW_PORT": "abc"}, "port"),
        ({"LLMGW_CONFIG_FILE": str(typo)}, "databse_url"),
        ({"LLMGW_CONFIG_FILE": str(broken)}, "not valid YAML"),
        ({"LLMGW_CONFIG_FILE": str(tmp_path / "missing.yaml")}, "cannot be read"),
    ]
    for env, named in cases:
        for command in (("serve",), ("keys", "list")):
            result = llmgw(*command, env={**base, **env})
            assert result.returncode == 2, (env, command, result.stderr[-500:])
            assert named in result.stderr and "Traceback" not in result.stderr, (env, result.stderr)
            assert len(result.stderr.splitlines()) <= 3


def test_settings_read_the_usual_spellings() -> None:
    from gateway.settings import Settings

    assert Settings(redis_url="").redis_url is None  # LLMGW_REDIS_URL= means no Redis
    assert Settings(database_url="postgres://u@db/x").database_url == "postgresql+asyncpg://u@db/x"
    assert Settings(database_url="postgresql://u@db/x").database_url == "postgresql+asyncpg://u@db/x"


def test_a_database_that_cannot_be_used_is_one_line_without_its_password(tmp_path) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    for url in ("postgresql://postgres:hunter2@127.0.0.1:1/x", f"sqlite+aiosqlite:///{tmp_path}/none.db"):
        env = {**base, "LLMGW_DATABASE_URL": url, "LLMGW_POLICIES__AUTO_MIGRATE": "false"}
        for command in (
            (("keys", "list"), ("migrate",)) if url.startswith("postgresql") else (("keys", "list"),)
        ):
            result = llmgw(*command, env=env)
            assert result.returncode == 1 and "the database cannot be used" in result.stderr, result.stderr
            assert "hunter2" not in result.stderr and "Traceback" not in result.stderr


def test_serve_with_a_database_it_cannot_reach_says_so_in_one_line_and_exits_3() -> None:
    """Before: uvicorn printed Starlette's 150-line traceback of the failed start-up (and with several workers
    the parent exited 0)."""
    import json
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    deployment = {"name": "d", "model": "m", "base_url": "http://127.0.0.1:9/v1"}  # no embedded engine
    env = {
        **base,
        "LLMGW_DATABASE_URL": "postgresql://postgres:hunter2@127.0.0.1:1/x",
        "LLMGW_MODELS": json.dumps([{"name": "m", "deployments": [deployment]}]),
        "LLMGW_PORT": str(port),
    }
    for workers in ("1", "2"):
        result = llmgw("serve", env={**env, "LLMGW_WORKERS": workers})
        assert result.returncode == 3, (workers, result.stderr[-800:])
        assert "the database cannot be used" in result.stderr and "Connection refused" in result.stderr
        assert "Traceback" not in result.stderr and "hunter2" not in result.stderr
        assert len(result.stderr.splitlines()) < 25, result.stderr
