"""`llmgw keys create|list|revoke` and the benchmark provisioning helper."""

import asyncio
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from policies.cli import main
from policies.directory import Directory
from policies.keys import hash_key
from policies.migrate import main as migrate_main
from policies.policy import Limits, Policy
from policies.provision import open_store, provision_virtual_key
from tests.policies_support import Database, database_fixture, make_settings  # noqa: F401


async def test_keys_create_list_revoke(database, capsys):
    settings = make_settings(database)
    await _in_thread(
        main, ["keys", "create", "--tenant", "acme", "--create-tenant", "--name", "ci"], settings
    )
    created = capsys.readouterr().out
    secret = re.search(r"key: (\S+)", created).group(1)
    key_id = re.search(r"id: (\S+)", created).group(1)
    assert await _in_thread(main, ["keys", "list", "--tenant", "acme"], settings) == 0
    listed = capsys.readouterr().out
    assert key_id in listed and "active" in listed and secret not in listed
    assert await _in_thread(main, ["keys", "revoke", key_id], settings) == 0
    assert "revoked" in capsys.readouterr().out
    assert await _in_thread(main, ["keys", "revoke", "key_nope"], settings) == 1


def test_keys_with_redis_away_still_succeed_and_say_so(tmp_path, capsys):
    """The key is stored: exit 0 with a warning, not a traceback and exit 1 (a script would retry and mint
    a second key). Without auto-migration, the command does not upgrade the schema either."""
    database = tmp_path / "k.db"
    assert migrate_main(["--database-url", f"sqlite+aiosqlite:///{database}"]) == 0
    settings = make_settings(Database(f"sqlite+aiosqlite:///{database}", None))
    settings.redis_url = "redis://127.0.0.1:1/0"  # nothing listens there
    assert main(["keys", "create", "--tenant", "t2", "--create-tenant"], settings) == 0
    out, err = capsys.readouterr()
    assert "key: " in out and "warning" in err and "Traceback" not in err
    fresh = tmp_path / "fresh.db"
    settings = make_settings(Database(f"sqlite+aiosqlite:///{fresh}", None))
    settings.policies.auto_migrate = False
    with pytest.raises(Exception, match="no such table"):  # no schema: the command fails, creates none
        main(["keys", "list"], settings)
    tables = sqlite3.connect(fresh).execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
    assert ("alembic_version",) not in tables


async def test_provision_virtual_key_for_benchmarks(database):
    settings = make_settings(database)
    secret = await provision_virtual_key(settings, "bench", Policy(key_limits=Limits(rpm=10)))
    async with open_store(settings) as store:
        directory = Directory(store, [])
        await directory.reload()
    entry = directory.lookup(hash_key(secret))
    assert entry.principal.tenant_id == "bench" and entry.policy.key_limits.rpm == 10


async def _in_thread(function, argv, settings):
    """The CLI runs its own event loop, so call it off this test's loop."""
    return await asyncio.to_thread(function, argv, settings)


def test_migrate_main_upgrades_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    database = tmp_path / "m.db"
    assert migrate_main(["--database-url", f"sqlite+aiosqlite:///{database}"]) == 0
    tables = sqlite3.connect(database).execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
    assert {"tenants", "api_keys", "policies", "usage_records", "alembic_version"} <= {
        name for (name,) in tables
    }


def test_replicas_migrating_a_fresh_database_together_all_succeed(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'race.db'}"
    code = f"from policies.migrate import upgrade; upgrade({url!r})"
    root = Path(__file__).resolve().parents[1]
    runs = [
        subprocess.Popen([sys.executable, "-c", code], cwd=root, stderr=subprocess.PIPE) for _ in range(3)
    ]
    assert [(run.wait(timeout=120), run.stderr.read()) for run in runs] == [(0, b"")] * 3
