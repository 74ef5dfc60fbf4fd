"""Semantic cache quality on labeled question pairs, at the shipped operating point, beside the baselines.

Each pair is (stored question, new question, label 1 = one answer serves both). A pair is a hit when the
lookup would serve it: cosine ≥ the policy's candidate threshold, and then
  verifier  — the shipped learned verifier at the threshold the calibration table gives for the
              precision target (default policy: 0.99), no exact-rule conflict (numbers, units);
  cosine    — cosine ≥ 0.75 alone (the old default threshold, guard off);
  old guard — cosine ≥ 0.75 and the old rule guard (cache/guard.py) finds no conflict.
Sets (none of them is used for training or for choosing any threshold):
  heldout   — the grouped held-out split of bench/lib/verifier_pairs.py (other subjects, families and
              rewrite templates than training and calibration);
  project   — tests/data/semantic_pairs.jsonl, written by hand in an earlier session (both its splits);
  extra     — every bench/data/*/pairs.jsonl (or --pairs FILE ...: jsonl with a, b, label, kind); today
              bench/data/paws_sample/, 340 PAWS pairs written and labeled by others (its README).
Precision, recall and each kind's false-hit rate come with 95 % bootstrap intervals (pairs resampled).

    LLMGW_ROUTELLM_EVAL_DIR=../shared/routellm_eval python -m bench.semantic_cache_eval [--pairs FILE ...]
        [--model DIR] [--compare DIR ...]
    python -m bench.semantic_cache_eval http [--pairs FILE ...] [--name NAME]   # through the HTTP API
--model: the verifier to evaluate (default: the shipped cache/verifier_model/); --compare: other verifiers
(e.g. the previous one, `git show`n into a folder) in the same run, their rows prefixed with the folder's
name. Each verifier reads questions encoded as it was trained (normalised text or not).
Writes bench/results/semantic_cache_eval.json. `http`: the shipped cache's quality seen from outside, through a
fresh gateway's HTTP API (bench/lib/semantic_cache_http.py; writes semantic_cache_http.json).
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from bench.lib.verifier_pairs import build, encode_all, load_set, shipped_encoder
from cache.alignment import pair_features
from cache.config import CachePolicy
from cache.encoder import EncodedQuestion
from cache.guard import conflict, parse
from cache.verifier import MODEL_DIR, Verifier, exact_conflict

ROOT = Path(__file__).resolve().parents[1]
OLD_THRESHOLD = 0.75
BOOTSTRAP = 1000
OTHER_TARGETS = (0.95, 0.99)  # what a policy's semantic_min_precision gives instead


def set_name(path: Path) -> str:
    """bench/data/NAME/pairs.jsonl is NAME; any other file is its own stem (two files of one folder no longer
    share a name and overwrite each other's rows)."""
    return path.parent.name if path.name == "pairs.jsonl" else path.stem


def decisions(
    rows: list[dict],
    encoded: dict[str, EncodedQuestion],
    verifier: Verifier,
    policy: CachePolicy,
    prefix: str = "",
) -> dict[str, np.ndarray]:
    """Hits per lookup; the baselines (cosine, old guard) only for the verifier without a prefix."""
    cosine = np.array([float(encoded[r["a"]].vector @ encoded[r["b"]].vector) for r in rows])
    guard_ok = np.array([conflict(parse(r["a"]), parse(r["b"])) is None for r in rows])
    rules_ok = np.array([not exact_conflict(encoded[r["a"]], encoded[r["b"]]) for r in rows])
    if verifier.cross is not None:  # a cross-encoder folder reads both texts, one pair per lookup
        prob = np.concatenate([verifier.scores([encoded[r["a"]]], encoded[r["b"]]) for r in rows])
    else:
        prob = verifier.probabilities(
            np.stack([pair_features(encoded[r["a"]], encoded[r["b"]]) for r in rows])
        )
    candidate = (cosine >= policy.similarity_threshold) & rules_ok
    shipped = {
        f"{prefix}verifier": candidate & (prob >= verifier.threshold_for(policy.semantic_min_precision))
    }
    stricter = {
        f"{prefix}verifier@{target}": candidate & (prob >= verifier.threshold_for(target))
        for target in OTHER_TARGETS
        if target != policy.semantic_min_precision
    }
    if prefix:
        return {**shipped, **stricter}
    return {
        **shipped,
        **stricter,
        "cosine": cosine >= OLD_THRESHOLD,
        "old guard": (cosine >= OLD_THRESHOLD) & guard_ok,
    }


def agreement(hits: dict[str, np.ndarray], prefixes: list[str]) -> dict[str, np.ndarray]:
    """`prefix`∧model: a hit where the compared verifier and the main one both serve, target by target."""
    return {
        f"{prefix}{lookup}∧model": hits[lookup] & hits[prefix + lookup]
        for prefix in prefixes
        for lookup in list(hits)
        if lookup.startswith("verifier") and prefix + lookup in hits
    }


def scores(hit: np.ndarray, labels: np.ndarray, kinds: np.ndarray, rng: np.random.Generator) -> dict:
    def point(idx: np.ndarray) -> dict[str, float]:
        h, y, k = hit[idx], labels[idx], kinds[idx]
        tp, fp = int((h & (y == 1)).sum()), int((h & (y == 0)).sum())
        out = {"precision": tp / (tp + fp) if tp + fp else 1.0, "recall": tp / max(int((y == 1).sum()), 1)}
        for kind in negative_kinds:
            of_kind = (k == kind) & (y == 0)
            out[f"fhr_{kind}"] = float(h[of_kind].mean()) if of_kind.any() else float("nan")
        return out

    negative_kinds = sorted({str(k) for k, y in zip(kinds, labels, strict=True) if y == 0})
    everything = np.arange(len(hit))
    result = {name: {"value": value} for name, value in point(everything).items()}
    samples = [point(rng.integers(0, len(hit), len(hit))) for _ in range(BOOTSTRAP)]
    for name in result:
        values = np.array([s[name] for s in samples], dtype=float)
        values = values[~np.isnan(values)]
        result[name]["ci"] = (
            [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))] if len(values) else None
        )
    result["hits"] = int(hit.sum())
    result["pairs"] = len(hit)
    return result


def print_set(name: str, results: dict[str, dict]) -> None:
    first = next(iter(results.values()))
    kinds = [k for k in first if k.startswith("fhr_")]
    print(f"\n== {name}: {first['pairs']} pairs ==")
    width = max(14, *(len(lookup) for lookup in results))
    print(f"{'lookup':{width}} {'precision':>20} {'recall':>20}  false-hit rate by kind")
    for lookup, r in results.items():
        cells = "  ".join(f"{k[4:]}={r[k]['value']:.2f}" for k in kinds if not np.isnan(r[k]["value"]))
        print(f"{lookup:{width}} {_fmt(r['precision']):>20} {_fmt(r['recall']):>20}  {cells}")


def _fmt(cell: dict) -> str:
    low, high = cell["ci"] or (float("nan"), float("nan"))
    return f"{cell['value']:.3f} [{low:.3f},{high:.3f}]"


def main() -> None:
    if sys.argv[1:2] == ["http"]:  # the same quality seen from outside, through a gateway's HTTP API
        from bench.lib.semantic_cache_http import main as http_main

        http_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pairs", type=Path, nargs="*", default=sorted((ROOT / "bench/data").glob("*/pairs.jsonl"))
    )
    trained = json.loads((MODEL_DIR / "verifier.json").read_text())["trained"]  # the held-out split's size
    parser.add_argument(
        "--per-subject",
        type=int,
        default=trained["per_subject"],
        help="default: as the shipped verifier was trained",
    )
    parser.add_argument("--min-precision", type=float, default=CachePolicy().semantic_min_precision)
    parser.add_argument("--model", type=Path, default=MODEL_DIR, help="the verifier (default: shipped)")
    parser.add_argument("--compare", type=Path, nargs="*", default=[], help="other verifiers, same run")
    parser.add_argument("--agree", action="store_true",
                        help="also each compared verifier and --model together: a hit only where both serve")  # fmt: skip
    args = parser.parse_args()
    sets = {
        "heldout": [{"a": p.a, "b": p.b, "label": p.label, "kind": p.kind} for p in build(0, args.per_subject) if p.split == "heldout"],
        "project": load_set(ROOT / "tests/data/semantic_pairs.jsonl"),
    }  # fmt: skip
    for path in args.pairs:
        sets[set_name(path)] = load_set(path)
    policy = CachePolicy(semantic_min_precision=args.min_precision)
    verifiers = {"": Verifier.load(args.model), **{f"{d.name}:": Verifier.load(d) for d in args.compare}}
    encoders = {flag: shipped_encoder(flag) for flag in {v.normalise_text for v in verifiers.values()}}
    rng = np.random.default_rng(0)
    report: dict[str, object] = {
        "model": str(args.model), "min_precision": policy.semantic_min_precision,
        **{f"{prefix}threshold": v.threshold_for(policy.semantic_min_precision) for prefix, v in verifiers.items()},
    }  # fmt: skip
    for name, rows in sets.items():
        labels, kinds = np.array([r["label"] for r in rows]), np.array([r["kind"] for r in rows])
        texts = [t for r in rows for t in (r["a"], r["b"])]
        encoded = {flag: encode_all(encoder, texts) for flag, encoder in encoders.items()}
        hits = {
            lookup: hit
            for prefix, v in verifiers.items()
            for lookup, hit in decisions(rows, encoded[v.normalise_text], v, policy, prefix).items()
        }
        if args.agree:
            hits.update(agreement(hits, [f"{d.name}:" for d in args.compare]))
        report[name] = {lookup: scores(hit, labels, kinds, rng) for lookup, hit in hits.items()}
        print_set(name, report[name])
    for prefix, v in verifiers.items():
        print(f"\n{prefix or args.model.name + ':'} threshold {v.threshold_for(policy.semantic_min_precision):.2f}"
              f" for precision target {policy.semantic_min_precision}")  # fmt: skip
    out = ROOT / "bench/results/semantic_cache_eval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
