"""The client table of issue 14: closed-loop clients against `llmgw engine serve`, beside llama-server.

Each setting gets its own server; 1 / 4 / 16 / 32 clients each send short text prompts for 64-token answers
(`ignore_eos`, greedy, streamed), one request per client (at least 4 in all). Also batch-1 decode in-process (the
engine loop without HTTP) for the default settings. With `--llama-server PATH` llama.cpp's server is measured
first with the same client and prompts (bench/lib/llama_cpp.py). Run through `bench/engine_serving.py --only clients`.
"""

import os
import statistics
import time
from dataclasses import asdict, dataclass, field

import aiohttp

LLAMA_SERVER = {1: 114.0, 4: 185.0, 16: 238.0}  # llama-server -np 16 -t 2, SmolLM2-135M Q4_1 (issue 14)
REFERENCE = "llama-server"  # the label of the measured llama-server rows (bench/lib/llama_cpp.py)
CLIENTS = (1, 4, 16, 32)
ANSWER_TOKENS = 64
TOPICS = ["a lighthouse", "the moon", "a red bicycle", "rain in April", "an old library", "a mountain road",
          "a small robot", "the sea at night"]  # fmt: skip
SETTINGS = {  # label -> engine settings (the environment's LLMGW_ENGINE__* names)
    "default": {},
    "fp16 t1": {"dtype": "fp16", "num_threads": 1},
    "fp16 t2": {"dtype": "fp16", "num_threads": 2},
    "int8 t1": {"dtype": "int8", "num_threads": 1},
    "int8 t2": {"dtype": "int8", "num_threads": 2},
    "int4 t1": {"dtype": "int4", "num_threads": 1},
    "int4 t2": {"dtype": "int4", "num_threads": 2},
    "kv fp32": {"kv_cache_dtype": "fp32"},  # the default's KV pool before 2026-12-04
    # the default's thread rule before 2026-12-04 (sixth session)
    "fixed threads": {"adaptive_threads": False},
    # int4 through torch's packed kernel and the model's own forward: the default before the AVX2 kernels
    # and the one-call step (cpu_kernels.py, cpu_decode.py; 2026-12-04, seventh session)
    "torch int4": {"int4_cpu_kernel": "torch"},
    # our kernels with their AVX2 tiles on a CPU that has AVX-512 VNNI (the default there since the eighth session)
    "avx2 tiles": {"int4_cpu_kernel": "avx2"},
    # adaptive threads that give up the second thread only for a neighbour above 0.9 of a core (default 0.5)
    "yield 0.9": {"threads_yield_above": 0.9},
}


@dataclass
class ClientRow:
    setting: str
    clients: int
    requests: int
    output_tok_s: float
    decode_tok_s_per_client: float
    ttft_p50: float
    load: float = field(default_factory=lambda: os.getloadavg()[0])


def prompts(count: int) -> list[str]:
    return [f"Write a short story about {TOPICS[i % len(TOPICS)]} (story {i})." for i in range(count)]


async def client_rows(server, setting: str, send, drive) -> list[ClientRow]:
    """`send(server, http, prompt, max_tokens)` -> a result with ttft, e2e (seconds) and tokens."""
    rows = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as http:
        await send(server, http, "Warm up.", ANSWER_TOKENS)
        for clients in CLIENTS:
            work = prompts(max(4, clients))
            results, wall = await drive(lambda p: send(server, http, p, ANSWER_TOKENS), work, clients)
            decode = [(r.tokens - 1) / (r.e2e - r.ttft) for r in results if r.tokens > 1 and r.e2e > r.ttft]
            rows.append(
                ClientRow(
                    setting,
                    clients,
                    len(work),
                    sum(r.tokens for r in results) / wall,
                    statistics.mean(decode),
                    statistics.median(r.ttft for r in results),
                )
            )
            print_client_row(rows[-1])
    return rows


def print_client_row(row: ClientRow) -> None:
    quoted = LLAMA_SERVER.get(row.clients)
    beside = f"{quoted:>8.0f}" if quoted else f"{'-':>8}"
    print(f"{row.setting:<12} {row.clients:>7} {row.output_tok_s:>9.1f} {beside} {row.decode_tok_s_per_client:>9.1f} "
          f"{row.ttft_p50:>8.3f} {row.load:>5.1f}", flush=True)  # fmt: skip


def print_pivot(rows: list[ClientRow], labels: list[str]) -> None:
    """Output tok/s, one column per setting (llama-server's measured one first when it ran), loads beside."""
    print("\n| clients | llama-server (issue) | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 2) + "|")
    for clients in CLIENTS:
        cells = [f"{r.output_tok_s:.1f} ({r.load:.1f})" for label in labels for r in rows
                 if r.setting == label and r.clients == clients]  # fmt: skip
        quoted = LLAMA_SERVER.get(clients)
        print(f"| {clients} | {quoted if quoted else '-'} | " + " | ".join(cells) + " |")


def in_process_batch1(settings: dict) -> dict:
    """Batch-1 decode tok/s of the engine loop itself (no HTTP), same prompt and answer length."""
    from backends.local_engine.config import EngineSettings
    from backends.local_engine.engine.threads import configure_openmp

    configure_openmp(EngineSettings(**settings).adaptive_threads)  # before torch starts; no-op after
    from backends.local_engine.engine.sampling_params import SamplingParams
    from backends.local_engine.server.serve import load_local_engine

    engine = load_local_engine(EngineSettings(**settings)).engine.engine
    ids = engine.runner.tokenizer.encode(prompts(1)[0])
    rates = []
    for _ in range(3):
        engine.add_request(ids, SamplingParams(max_tokens=ANSWER_TOKENS, temperature=0, ignore_eos=True))
        engine.step()  # prefill + first token
        start, tokens = time.perf_counter(), 0
        while engine.has_work:
            tokens += sum(len(out.new_token_ids) for out in engine.step())
        rates.append(tokens / (time.perf_counter() - start))
    return {"decode_tok_s": statistics.median(rates), "load": os.getloadavg()[0]}


async def clients_scenario(server_factory, send, drive, labels: list[str], reference=None) -> dict:
    """The table for each setting in `labels`; `reference()`, if given, starts llama-server (measured first)."""
    print(
        f"{'setting':<12} {'clients':>7} {'out tok/s':>9} {'issue':>8} {'dec/client':>9} {'ttft p50':>8} {'load':>5}"
    )
    rows: list[ClientRow] = []
    starts = [(REFERENCE, reference)] if reference else []
    starts += [(label, lambda label=label: server_factory(**SETTINGS[label])) for label in labels]
    for label, start in starts:
        server = start()
        try:
            await server.wait_ready()
            rows += await client_rows(server, label, send, drive)
        finally:
            server.stop()
    print_pivot(rows, [label for label, _ in starts])
    best = max(labels, key=lambda label: _mean_throughput(rows, label))
    batch1 = in_process_batch1(SETTINGS["default"])
    served = next(
        (r.decode_tok_s_per_client for r in rows if r.setting == "default" and r.clients == 1), None
    )
    print(f"best setting: {best}; batch-1 decode, default settings: in-process {batch1['decode_tok_s']:.1f} tok/s, "
          f"through the server {served or float('nan'):.1f} tok/s (load {batch1['load']:.1f})")  # fmt: skip
    measured = {r.clients: r.output_tok_s for r in rows if r.setting == REFERENCE}
    return {
        "rows": [asdict(r) for r in rows],
        "llama_server": LLAMA_SERVER,
        "llama_server_measured": measured or None,
        "best": best,
        "batch1_in_process": batch1,
        "batch1_served_decode_tok_s": served,
    }


def _mean_throughput(rows: list[ClientRow], label: str) -> float:
    return statistics.mean(r.output_tok_s for r in rows if r.setting == label)
