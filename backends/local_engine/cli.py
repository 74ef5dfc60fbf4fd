"""`engine` command line: `generate "prompt"` runs one chat turn on the local engine and prints the answer.

Subcommands register themselves with `@command(name, help, configure)`; `main(argv)` dispatches.
`llmgw engine ...` delegates here; standalone: `python -m backends.local_engine.cli generate "Hi"`.
"""

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine.sampling_params import SamplingParams

Handler = Callable[[argparse.Namespace], int]
Configure = Callable[[argparse.ArgumentParser], None]
_COMMANDS: dict[str, tuple[str, Configure, Handler]] = {}


def command(name: str, help: str, configure: Configure) -> Callable[[Handler], Handler]:
    """Register a subcommand: `configure` adds its arguments, the decorated function runs it."""

    def register(handler: Handler) -> Handler:
        _COMMANDS[name] = (help, configure, handler)
        return handler

    return register


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmgw engine", description="The local inference engine.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, configure, handler) in _COMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        configure(sub)
        sub.set_defaults(handler=handler)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return args.handler(args)


# --- generate ----------------------------------------------------------------------------------------


def _generate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the user message (the model's chat template is applied)")
    parser.add_argument("--model", type=Path, default=None, help="GGUF file or HF folder (default: SmolLM2)")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16", "int8", "int4"], default="fp32")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--system", default=None, help="optional system message")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")


@command("generate", "Generate an answer to one prompt, offline, and print it.", _generate_arguments)
def generate_command(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from backends.local_engine.engine.model_runner import ModelRunner  # heavy import: only when used

    settings = EngineSettings(
        model=args.model,
        dtype=args.dtype,
        num_threads=args.threads,
        device=args.device,
        kv_cache_memory_mb=64,
    )
    runner = ModelRunner(settings)
    messages = [{"role": "user", "content": args.prompt}]
    if args.system:
        messages.insert(0, {"role": "system", "content": args.system})
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
    )
    generate(runner, runner.tokenizer.encode_chat(messages), params, settings.max_model_len, sys.stdout)
    sys.stdout.write("\n")
    return 0


def generate(runner, prompt_ids: list[int], params: SamplingParams, max_model_len: int, out: TextIO) -> str:
    """Run one sequence to completion, streaming its text to `out`; returns the finish reason.

    The sequence is alone, so it simply owns the first blocks of the KV pool.
    """
    from backends.local_engine.engine.detokenizer import IncrementalDetokenizer
    from backends.local_engine.engine.sampler import Sampler
    from backends.local_engine.engine.sequence import ScheduledSeq, Sequence

    limit = min(max_model_len, runner.num_blocks * runner.block_size)
    if len(prompt_ids) >= limit:
        raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the limit is {limit}")
    seq = Sequence(list(prompt_ids), params)
    seq.block_table = list(
        range(math.ceil(min(len(prompt_ids) + params.max_tokens, limit) / runner.block_size))
    )
    detokenizer = IncrementalDetokenizer(runner.tokenizer, prompt_ids, params)
    sampler, stop_ids = Sampler(), _stop_token_ids(runner.eos_token_ids, params)
    while True:
        logits = runner.execute([ScheduledSeq(seq, seq.num_uncomputed_tokens)])[0].logits
        seq.num_computed_tokens = len(seq)
        token_id = sampler.sample(logits[-1:], [seq]).token_ids[0]
        if token_id in stop_ids:
            out.write(detokenizer.flush())
            return "stop"
        seq.append_token(token_id)
        out.write(detokenizer.add(token_id))
        out.flush()
        if detokenizer.stopped:
            return "stop"
        if len(seq.output_ids) >= params.max_tokens or len(seq) >= limit:
            out.write(detokenizer.flush())
            return "length"


def _stop_token_ids(eos_token_ids: tuple[int, ...], params: SamplingParams) -> set[int]:
    return set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))


# --- serve -------------------------------------------------------------------------------------------


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    from backends.local_engine.server.serve import add_arguments

    add_arguments(parser)


@command(
    "serve", "Serve the OpenAI-compatible API (settings: --options or LLMGW_ENGINE__*).", _serve_arguments
)
def serve_command(args: argparse.Namespace) -> int:
    from backends.local_engine.server.serve import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
