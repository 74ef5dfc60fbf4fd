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
