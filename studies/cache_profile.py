"""In-process breakdown of one semantic lookup, on the questions of bench/cache_latency.py: the cache is
filled with the stored questions (encoded as the gateway encodes them), then each look-alike is encoded,
searched in an HNSW index and its candidates judged, each part timed on its own:

  tokenize       the MiniLM tokenizer (one question)
  forward        the int8 ONNX transformer on those ids (1 thread)
  word_vectors   mean pooling, word grouping, normalisation on the forward's states (`_question`)
  encode         all of `encode` (tokenize + forward + word_vectors), timed as one call
  search         the FAISS HNSW search (default settings: M 16, efSearch 64, 4 candidates, cosine ≥ 0.6)
  verify         judge_all as the service calls it (features + trees + exact rules), the new question
                 not seen before, the stored ones analysed already (as in the gateway)
  question_words the new question's own word analysis (`words_of`, uncached), a part of verify
  verify_prepared judge_all again once that analysis is cached (the branch semspeed makes it while the
                 worker runs the transformer, so this is its lookup's part on the event loop)
  features       the pair features for all candidates, the word analysis cached (a part of verify)
  trees          the verifier's trees on those features (ONNX Runtime, a part of verify)
  hop            a no-op round trip event loop → the encoder's worker thread (nice 10) → event loop

Only APIs that main has too are used, so the same script profiles either tree (A/B: PYTHONPATH).

    python -m studies.cache_profile [--requests 150] [--fill 300] [--name NAME]
Writes studies/results/cache_profile[_NAME].json.
"""

import argparse
import asyncio
import os
import time
from typing import Any

import numpy as np

from bench.cache_latency import percentiles, questions, sample
from studies import write_json


def _timed(fn: Any, *args: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def _features(pair_features: Any, candidates: list[Any], new: Any) -> list[np.ndarray]:
    return [pair_features(c, new) for c in candidates]


def breakdown(stored: list[str], asked: list[str]) -> dict[str, Any]:
    from bench.lib.verifier_pairs import shipped_encoder
    from cache import encoder as encoder_module
    from cache.alignment import pair_features, words_of
    from cache.config import CachePolicy, CacheSettings
    from cache.entry import CacheEntry
    from cache.vector_index import SemanticIndex
    from cache.verifier import load_verifier

    settings, policy = CacheSettings(), CachePolicy()
    encoder = shipped_encoder()
    verifier = load_verifier()
    assert verifier is not None
    threshold = verifier.threshold_for(policy.semantic_min_precision)
    index = SemanticIndex(encoder.dim, settings.index, settings.hnsw_m, settings.hnsw_ef_search)
    for n, question in enumerate(stored):
        encoded = encoder.encode([question])[0]
        entry = CacheEntry(f"k{n}", "t", "m", "chat", {}, time.time() + 3600, namespace="ns",
                           question=question, vector=encoded.vector, encoded=encoded)  # fmt: skip
        index.on_added(entry)
        words_of(encoded.text, encoded.words)  # stored questions come analysed (at their own lookup)
    tokenizer, transformer = encoder._tokenizer, encoder._transformer  # noqa: SLF001 (profiling)
    parts: dict[str, list[float]] = {k: [] for k in ("tokenize", "forward", "encode", "search", "verify")}
    parts |= {"question_words": [], "verify_prepared": [], "word_vectors": [], "features": [], "trees": []}
    counts = []
    for question in [*asked[:5], *asked]:  # the first five warm the caches and are not kept
        t_tok, encodings = _timed(tokenizer.encode_batch, [question])
        ids = np.asarray([encodings[0].ids], dtype=np.int64)
        t_fwd, hidden = _timed(transformer, ids, np.ones_like(ids))
        t_vec, _ = _timed(encoder_module._question, question, encodings[0], hidden[0])
        t_enc, (new,) = _timed(encoder.encode, [question])
        t_search, found = _timed(
            index.search, "ns", new.vector, settings.candidates, policy.similarity_threshold
        )
        candidates = [n.item.encoded for n in found]
        t_verify, _ = _timed(verifier.judge_all, candidates, new, threshold)
        t_words, _ = _timed(words_of.__wrapped__, new.text, new.words)
        t_prepared, _ = _timed(verifier.judge_all, candidates, new, threshold)
        t_feat, features = _timed(_features, pair_features, candidates, new)
        t_trees = _timed(verifier.probabilities, np.stack(features))[0] if features else 0.0
        for name, value in (("tokenize", t_tok), ("forward", t_fwd), ("word_vectors", t_vec), ("encode", t_enc),
                            ("search", t_search), ("verify", t_verify), ("question_words", t_words),
                            ("verify_prepared", t_prepared), ("features", t_feat), ("trees", t_trees)):  # fmt: skip
            parts[name].append(value)
        counts.append(len(candidates))
    report = {name: percentiles(values[5:]) for name, values in parts.items()}
    report["hop"] = percentiles(asyncio.run(_hops(200)))
    report["candidates_mean"] = float(np.mean(counts[5:]))
    return report


async def _hops(n: int) -> list[float]:
    from concurrent.futures import ThreadPoolExecutor

    from cache.embedder import _lower_priority

    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(1, initializer=_lower_priority, initargs=(10,)) as executor:
        await loop.run_in_executor(executor, int)
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            await loop.run_in_executor(executor, int)
            samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--fill", type=int, default=300)
    parser.add_argument("--name", default="", help="suffix of the results file (cache_profile_NAME.json)")
    args = parser.parse_args()
    stored, asked = sample(*questions(), args.fill, args.requests)
    report = breakdown(stored, asked)
    report["load_average"] = os.getloadavg()
    print(f"{'part':14} {'p50 ms':>8} {'p99 ms':>8}")
    for name, row in report.items():
        if isinstance(row, dict):
            print(f"{name:14} {row['p50_ms']:8.3f} {row['p99_ms']:8.3f}")
    print(f"candidates per lookup {report['candidates_mean']:.2f}; load {report['load_average']}")
    print(f"wrote {write_json('cache_profile' + (f'_{args.name}' if args.name else ''), report)}")


if __name__ == "__main__":
    main()
