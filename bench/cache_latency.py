"""Cache latency, measured in-process (the stage's own CPU; the lead's HTTP harness is separate):

1. exact-hit path: ExactCacheStage answering from the in-process store, per request;
2. semantic lookup (FAISS search + guard, embedding excluded) p50/p99 at 1k, 10k, 100k entries in one
   namespace, for IndexFlatIP and IndexHNSWFlat, with HNSW recall@1 against the exact flat search;
3. miss overhead: the cache stages on a miss minus the embedding time.

    .venv/bin/python bench/cache_latency.py [--sizes 1000 10000 100000] [--queries 300]
Writes bench/results/cache_latency.json.
"""

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import faiss
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cache.config import CacheSettings  # noqa: E402
from cache.embedder import SentenceEmbedder, load_sentence_model  # noqa: E402
from cache.entry import CacheEntry  # noqa: E402
from cache.guard import conflict, parse  # noqa: E402
from cache.service import CacheService  # noqa: E402
from cache.store import MemoryStore  # noqa: E402
from cache.vector_index import SemanticIndex  # noqa: E402
from tests.cache_helpers import Upstream, ctx_for, pipeline  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def percentiles(samples_s: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples_s)
    return {"p50_ms": statistics.median(ms), "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))]}


async def exact_hit(n: int) -> dict[str, float]:
    service = CacheService(CacheSettings(semantic_enabled=False), MemoryStore())
    handler = pipeline(service, Upstream())
    await handler(ctx_for())
    await service.settle()
    samples = []
    for _ in range(n):
        ctx = ctx_for()
        start = time.perf_counter()
        reply = await handler(ctx)
        samples.append(time.perf_counter() - start)
        assert reply.headers["x-cache-status"] == "hit"
    return percentiles(samples)


def filled_index(kind: str, vectors: np.ndarray, questions: list[str]) -> SemanticIndex:
    index = SemanticIndex(vectors.shape[1], kind, hnsw_m=16, ef_search=64)
    for i, vector in enumerate(vectors):
        index.on_added(
            CacheEntry(f"k{i}", "t", "m", "chat", {}, time.time() + 3600, 0.0, "ns", questions[i], vector)
        )
    return index


def semantic_lookup(index: SemanticIndex, queries: np.ndarray, texts: list[str]) -> tuple[dict, list[str]]:
    samples, best = [], []
    for vector, text in zip(queries, texts, strict=True):
        start = time.perf_counter()
        question = parse(text)
        found = index.search("ns", vector, 4, 0.0)
        next((n for n in found if not conflict(question, parse(n.item.question))), None)
        samples.append(time.perf_counter() - start)
        best.append(found[0].item.key if found else "")
    return percentiles(samples), best


def corpus(embedder: SentenceEmbedder, size: int) -> tuple[np.ndarray, list[str]]:
    """Real question embeddings from the eval data, plus small perturbations of them to reach `size`."""
    rows = [json.loads(line) for line in (ROOT / "tests/data/semantic_pairs.jsonl").read_text().splitlines()]
    texts = sorted({r["a"] for r in rows} | {r["b"] for r in rows})
    base = embedder.encode(texts)
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(texts), size)
    vectors = base[picks] + rng.normal(0, 0.03, (size, base.shape[1])).astype(np.float32)
    faiss.normalize_L2(vectors)
    return vectors, [texts[i] for i in picks]


class TimedEmbedder:
    """Wraps the real embedder and records how long each embedding took inside the request."""

    def __init__(self, inner: SentenceEmbedder) -> None:
        self.inner, self.dim, self.last = inner, inner.dim, 0.0

    async def embed(self, text: str) -> np.ndarray:
        start = time.perf_counter()
        vector = await self.inner.embed(text)
        self.last = time.perf_counter() - start
        return vector

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.inner.encode(texts)

    async def aclose(self) -> None:
        pass


async def miss_overhead(embedder: SentenceEmbedder, n: int) -> dict[str, float]:
    timed = TimedEmbedder(embedder)
    service = CacheService(CacheSettings(), MemoryStore(), SemanticIndex(embedder.dim, "hnsw"), timed)
    handler = pipeline(service, Upstream())
    overhead, embed_only = [], []
    for i in range(n):
        start = time.perf_counter()
        await handler(ctx_for(question=f"What is the population of city number {i}?"))
        overhead.append(time.perf_counter() - start - timed.last)
        embed_only.append(timed.last)
    await service.settle()
    return {**percentiles(overhead), "embed_p50_ms": percentiles(embed_only)["p50_ms"]}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    faiss.omp_set_num_threads(1)
    embedder = SentenceEmbedder(load_sentence_model(None, torch_threads=1))
    report: dict[str, object] = {"exact_hit": await exact_hit(2000)}
    print(f"exact-hit stage path: {report['exact_hit']}")
    report["miss_overhead_beyond_embedding"] = await miss_overhead(embedder, 100)
    print(f"miss overhead beyond embedding: {report['miss_overhead_beyond_embedding']}")
    print(f"\n{'entries':>8} {'index':>6} {'p50 ms':>8} {'p99 ms':>8} {'recall@1':>9} {'build s':>8}")
    for size in args.sizes:
        vectors, texts = corpus(embedder, size + args.queries)
        stored, queries = vectors[:size], vectors[size:]
        results = {}
        for kind in ("flat", "hnsw"):
            start = time.perf_counter()
            index = filled_index(kind, stored, texts[:size])
            build = time.perf_counter() - start
            stats, best = semantic_lookup(index, queries, texts[size:])
            results[kind] = {**stats, "build_s": build, "best": best}
        exact = results["flat"]["best"]
        for kind, stats in results.items():
            stats["recall_at_1"] = sum(a == b for a, b in zip(stats.pop("best"), exact, strict=True)) / len(
                exact
            )
            print(
                f"{size:8d} {kind:>6} {stats['p50_ms']:8.3f} {stats['p99_ms']:8.3f} "
                f"{stats['recall_at_1']:9.3f} {stats['build_s']:8.1f}"
            )
        report[f"semantic_{size}"] = results
    out = ROOT / "bench/results/cache_latency.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    asyncio.run(main())
