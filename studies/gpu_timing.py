"""GPU timing helpers and the Llama-3 projection shapes shared by the GPU studies (a leaf: imports no study).

Moved out of engine_gpu_profile.py and engine_gpu_skinny.py, which imported each other (issue 42).
"""

import statistics

import torch

SHAPES = {  # projection -> (N, K)
    "llama-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
                 "lm_head": (128256, 4096)},
    "llama-1b": {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192),
                 "lm_head": (128256, 2048)},
}  # fmt: skip


def replay_ms(graph: torch.cuda.CUDAGraph, repeats: int = 200) -> float:
    """Mean GPU time of one replay over `repeats` back-to-back replays (events around all)."""
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def graph_us(fn, weights: list[torch.Tensor], calls: int, replays: int = 7) -> float:  # noqa: ANN001
    """Per-launch µs of `calls` back-to-back launches of fn(weight) cycling through `weights`, in a graph."""
    fn(weights[0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(weights[i % len(weights)])
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(times)
