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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "99999"], "port 99999 is outside 1-65535"),
        (["--port", "0"], "port 0 is outside 1-65535"),
        (["--dtype", "int3"], "invalid choice: 'int3'"),
        (["--kv-cache-dtype", "fp8"], "invalid choice: 'fp8'"),
        (["--max-num-seqs", "many"], "invalid int value: 'many'"),
    ],
)
def test_serve_refuses_bad_options_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", *argv])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error


def test_serve_refuses_a_bad_setting_from_the_environment_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMGW_ENGINE__DTYPE", "int3")
    assert cli.main(["serve", "--port", "1"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "llmgw engine serve: dtype: Input should be 'fp32', 'bf16', 'fp16', 'int8' or 'int4'"
    )


def test_serve_options_keep_their_types_and_zero_is_a_value() -> None:
    from backends.local_engine.server.serve import settings_from

    args = cli.build_parser().parse_args(
        ["serve", "--port", "65535", "--max-num-seqs", "0", "--dtype", "fp32"]
    )
    assert args.port == 65535
    settings = settings_from(args, {"LLMGW_ENGINE__MAX_NUM_SEQS": "7"})
    assert settings.max_num_seqs == 0 and settings.dtype == "fp32"
