"""The engine pool behind one gateway alias that engine_routing, trace_replay and admission_replay share.

The gateway's config (one alias `pool` over engine servers, declared an engine pool and scraped every 0.5 s),
waiting for its /health/ready, one streamed `/v1/completions` request timed client-side (TTFT, tokens,
`x-served-by`, cached tokens), a random-weight HF folder for a GPU without real weights, and SmolLM2's
tokenizer.json to carry there; the pool's command-line options and its engine servers.
"""

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.lib import trace_data as td
from bench.lib.engine_http import EngineServer
from bench.lib.harness import HF_CACHE, ROOT

KEY = "sk-bench-routing"


async def wait_ready(session: aiohttp.ClientSession, url: str, timeout: float = 60) -> None:
    """Until the gateway's /health/ready answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with session.get(url + "/health/ready") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{url}/health/ready never answered 200")


def gateway_config(engines: list[EngineServer], strategy: str) -> dict[str, Any]:
    deployments = [
        {"name": f"engine-{i}", "base_url": f"{e.url}/v1", "model": "m", "read_timeout_s": 900}
        for i, e in enumerate(engines)
    ]
    return {
        "master_key": KEY,
        "database_url": f"sqlite+aiosqlite:///{tempfile.mkdtemp(prefix='llmgw-routing-')}/llmgw.db",  # empty
        "models": [{"name": "pool", "deployments": deployments}],
        "routing": {"engine_pools": ["pool"], "strategies": {"pool": strategy}, "scrape_interval_s": 0.5,
                    "health_checks": False},
        "cache": {"enabled": False},
        "observability": {"tenant_label": False},
    }  # fmt: skip


async def one_request(
    session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int, model: str = "pool"
) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
    start = time.perf_counter()
    ttft, tokens, usage = None, 0, {}
    async with session.post(url + "/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:300]}")
        served = response.headers.get("x-served-by", "?")
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                ttft = ttft if ttft is not None else time.perf_counter() - start
                tokens += 1
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"ttft": ttft, "served": served, "tokens": tokens, "latency": time.perf_counter() - start,
            "prompt_tokens": usage.get("prompt_tokens", 0), "cached_tokens": cached}  # fmt: skip


def random_model_folder(shape: str, folder: Path, tokenizer_dir: Path, dtype: str) -> str:
    """A random-weight HF folder of `shape` (the GPU has no real weights), with a carried tokenizer."""
    import shutil

    import torch
    from tokenizers import Tokenizer

    from bench.lib.engine_gpu_models import build_hf

    vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    torch_dtype = torch.bfloat16 if dtype in ("bf16", "int8", "int4") else torch.float32
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_hf(shape, device, torch_dtype, vocab_size=vocab)
    model.save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, folder / name)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the engines that load it share the card with this process
    return str(folder)


def export_tokenizer(folder: Path) -> None:
    """Write SmolLM2's tokenizer (from the packaged GGUF) as tokenizer.json, to carry to a GPU machine."""
    from backends.local_engine.loading.loader import load_gguf, packaged_model_path
    from backends.local_engine.loading.tokenizer import load_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    load_tokenizer(load_gguf(packaged_model_path()).tokenizer).backend.save(str(folder / "tokenizer.json"))


def add_pool_arguments(add: Any, kv_mb: int, batched_tokens: int) -> None:
    """The engine pool's options, shared with bench/admission_replay.py."""
    add("--replicas", type=int, default=2, help="engines in the pool")
    add("--device", default="cpu", help="cuda: every engine on the one GPU")
    add("--dtype", default="int4")
    add(
        "--random-shape",
        default=None,
        help="random weights of a bench.lib.engine_gpu_models shape, e.g. llama-1b",
    )
    add("--tokenizer-dir", default=".gpu/tokenizer", help="tokenizer.json for --random-shape")
    add("--kv-mb", type=int, default=kv_mb, help="each engine's KV cache")
    add("--threads", type=int, default=1)
    add("--batched-tokens", type=int, default=batched_tokens)
    add("--max-num-seqs", type=int, default=None, help="each engine's running-batch limit (default: its own)")
    add("--traces-dir", default=str(td.TRACES), help="folder of the traces (../shared/traces)")
    add("--aiperf", default=str(ROOT / "build" / "aiperf-venv" / "bin" / "aiperf"), help="AIPerf's command")
    add("--tokenizer", default=str(HF_CACHE), help="HF cache with SmolLM2's tokenizer, for AIPerf")


def pool_engines(args: argparse.Namespace, max_model_len: int, **extra: object) -> list[EngineServer]:
    """`--replicas` engine servers (engine settings `extra` on top); with `--random-shape`, one random-weight
    folder that all of them load."""
    settings: dict[str, Any] = dict(served_model_name="m", dtype=args.dtype, device=args.device,
                                    kv_cache_memory_mb=args.kv_mb, num_threads=args.threads,
                                    max_model_len=max_model_len, max_num_batched_tokens=args.batched_tokens)  # fmt: skip
    if args.max_num_seqs:
        settings["max_num_seqs"] = args.max_num_seqs
    settings.update(extra)
    if args.random_shape:
        folder = Path(args.work_dir) / args.random_shape
        settings["model"] = random_model_folder(
            args.random_shape, folder, Path(args.tokenizer_dir), args.dtype
        )
    return [EngineServer(**settings) for _ in range(args.replicas)]


async def restart_pool(engines: list[EngineServer], args: argparse.Namespace, max_model_len: int,
                       **extra: object) -> None:  # fmt: skip
    """Stops `engines` and puts in their place a fresh pool of `pool_engines(args, …, **extra)`, ready."""
    for engine in engines:
        engine.stop()
    engines[:] = pool_engines(args, max_model_len, **extra)
    for engine in engines:
        await engine.wait_ready(timeout=900)
