"""The `engine` command line: subcommand registration and an offline `generate` on the packaged model."""

import argparse

import pytest

from backends.local_engine import cli


def test_a_registered_subcommand_is_dispatched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_COMMANDS", dict(cli._COMMANDS))
    seen: list[argparse.Namespace] = []

    def configure(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--port", type=int, default=1)

    @cli.command("serve", "serve it", configure)
    def serve(args: argparse.Namespace) -> int:
        seen.append(args)
        return 7

    assert cli.main(["serve", "--port", "9"]) == 7
    assert seen[0].port == 9


def test_unknown_subcommand_exits_with_usage() -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["nope"])
    assert exit_info.value.code == 2


def test_generate_answers_offline(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["generate", "What is the capital of France?", "--max-tokens", "12", "--dtype", "int8"])
    assert code == 0
    assert "Paris" in capsys.readouterr().out
