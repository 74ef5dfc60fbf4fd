"""`vllm serve`'s command line, served by `llmgw engine serve` (CI's stand-in for vllm/vllm-openai).

docker-compose.yml's vLLM commands run unchanged: the model is positional, the flags are vLLM's. A model that is
not a local file or folder (a Hugging Face id: no download here) is replaced by the packaged SmolLM2, served
under --served-model-name. GPU-only flags are accepted and ignored on the CPU; a flag this stand-in does not
know is an error (exit 2), as it is for vLLM.
"""

import argparse
import os
import sys
from pathlib import Path


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vllm serve (llmgw engine stand-in)")
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--model", dest="model_flag", default=None)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="0.0.0.0")  # vLLM listens on every interface by default
    parser.add_argument("--port", default="8000")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--max-model-len", default=None)
    parser.add_argument("--max-num-seqs", default=None)
    parser.add_argument("--max-num-batched-tokens", default=None)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)  # no GPU: ignored
    return parser.parse_args(argv)


def engine_argv(args: argparse.Namespace) -> list[str]:
    if args.tensor_parallel_size != 1:
        sys.exit(
            "vllm serve stand-in: --tensor-parallel-size > 1 needs GPUs; the CPU engine runs one process"
        )
    argv = ["llmgw", "engine", "serve", "--host", args.host, "--port", args.port]
    model = args.model or args.model_flag
    if model and Path(model).exists():
        argv += ["--model", model]
    elif model:
        print(
            f"vllm serve stand-in: {model} is not a local path; serving the packaged SmolLM2", file=sys.stderr
        )
    argv += ["--served-model-name", args.served_model_name or model or "smollm2"]
    if args.enable_prefix_caching is not None:
        argv += ["--enable-prefix-caching", str(args.enable_prefix_caching).lower()]
    for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
        if getattr(args, name) is not None:
            argv += ["--" + name.replace("_", "-"), getattr(args, name)]
    return argv


if __name__ == "__main__":
    command = engine_argv(parse(sys.argv[1:]))
    print("vllm serve stand-in:", " ".join(command), file=sys.stderr, flush=True)
    os.execvp(command[0], command)
