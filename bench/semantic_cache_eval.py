"""Semantic cache quality on labeled question pairs (tests/data/semantic_pairs.jsonl).

For each pair: cosine similarity of the MiniLM embeddings, and whether the hard-negative guard lets the
pair through. Sweeps the threshold with and without the guard and prints precision, recall, F1 and the
false-hit rate per negative kind, for the dev split (used to design the guard and pick the threshold)
and the held-out split (never looked at while designing). Also prints a leave-one-check-out ablation.

    .venv/bin/python bench/semantic_cache_eval.py [--pairs PATH] [--min-precision 0.99]
Writes bench/results/semantic_cache_eval.json.
"""

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cache.embedder import SentenceEmbedder, load_sentence_model  # noqa: E402
from cache.guard import CHECK_NAMES, conflict, parse  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
THRESHOLDS = [round(t, 2) for t in np.arange(0.50, 0.99, 0.01)]


@dataclass
class Pair:
    a: str
    b: str
    kind: str
    split: str
    label: int
    similarity: float
    blocked_by: str | None  # the guard check that refused the pair


def load_pairs(path: Path, embedder: SentenceEmbedder) -> list[Pair]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    texts = sorted({r["a"] for r in rows} | {r["b"] for r in rows})
    vectors = dict(zip(texts, embedder.encode(texts), strict=True))
    return [
        Pair(
            r["a"], r["b"], r["kind"], r["split"], r["label"], float(vectors[r["a"]] @ vectors[r["b"]]), None
        )
        for r in rows
    ]


def guarded(pairs: list[Pair], checks: frozenset[str] | None) -> list[Pair]:
    return [replace(p, blocked_by=conflict(parse(p.a), parse(p.b), checks)) for p in pairs]


def scores(pairs: list[Pair], threshold: float, guarded: bool) -> dict[str, float]:
    hit = [p.similarity >= threshold and not (guarded and p.blocked_by) for p in pairs]
    tp = sum(bool(h and p.label == 1) for h, p in zip(hit, pairs, strict=True))
    fp = sum(bool(h and p.label == 0) for h, p in zip(hit, pairs, strict=True))
    positives = sum(p.label == 1 for p in pairs)
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / positives if positives else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    result = {"threshold": threshold, "precision": precision, "recall": recall, "f1": f1, "false_hits": fp}
    for kind in sorted({p.kind for p in pairs if p.label == 0}):
        of_kind = [(h, p) for h, p in zip(hit, pairs, strict=True) if p.kind == kind]
        result[f"fhr_{kind}"] = sum(h for h, _ in of_kind) / len(of_kind)
    return result


def best_threshold(pairs: list[Pair], guarded: bool, min_precision: float) -> float:
    """The threshold with the highest recall whose precision reaches the target (else best F0.5)."""
    rows = [scores(pairs, t, guarded) for t in THRESHOLDS]
    good = [r for r in rows if r["precision"] >= min_precision]
    pick = max(good, key=lambda r: (r["recall"], r["threshold"])) if good else max(rows, key=_f_half)
    return pick["threshold"]


def _f_half(row: dict[str, float]) -> float:
    p, r = row["precision"], row["recall"]
    return 1.25 * p * r / (0.25 * p + r) if p + r else 0.0


def print_table(title: str, rows: list[dict[str, float]]) -> None:
    kinds = [k for k in rows[0] if k.startswith("fhr_")]
    print(f"\n{title}")
    header = f"{'thr':>5} {'guard':>5} {'P':>6} {'R':>6} {'F1':>6} {'FP':>4} " + " ".join(
        f"{k[4:][:6]:>6}" for k in kinds
    )
    print(header)
    for r in rows:
        cells = " ".join(f"{r[k]:6.2f}" for k in kinds)
        print(
            f"{r['threshold']:5.2f} {r['guard']:>5} {r['precision']:6.3f} {r['recall']:6.3f} "
            f"{r['f1']:6.3f} {r['false_hits']:4d} {cells}"
        )


def sweep(pairs: list[Pair], thresholds: list[float]) -> list[dict[str, float]]:
    rows = []
    for threshold in thresholds:
        for guarded in (False, True):
            rows.append({**scores(pairs, threshold, guarded), "guard": "on" if guarded else "off"})
    return rows


def ablation(pairs: list[Pair], threshold: float) -> list[dict[str, object]]:
    rows = []
    for dropped in (None, *CHECK_NAMES):
        checked = guarded(pairs, frozenset(CHECK_NAMES) - {dropped})
        rows.append({"without": dropped or "-", **scores(checked, threshold, True)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=Path, default=ROOT / "tests/data/semantic_pairs.jsonl")
    parser.add_argument("--min-precision", type=float, default=0.99)
    args = parser.parse_args()
    embedder = SentenceEmbedder(load_sentence_model(None, torch_threads=1))
    pairs = guarded(load_pairs(args.pairs, embedder), None)
    report: dict[str, object] = {"pairs": len(pairs)}
    for with_guard in (False, True):
        dev = [p for p in pairs if p.split == "dev"]
        chosen = best_threshold(dev, with_guard, args.min_precision)
        name = "guard" if with_guard else "plain"
        report[f"{name}_threshold"] = chosen
        for split in ("dev", "heldout"):
            report[f"{name}_{split}"] = scores([p for p in pairs if p.split == split], chosen, with_guard)
    shown = sorted({0.7, 0.75, 0.8, 0.85, 0.9, 0.95, report["plain_threshold"], report["guard_threshold"]})
    for split in ("dev", "heldout"):
        rows = sweep([p for p in pairs if p.split == split], shown)
        print_table(f"== {split}: {sum(p.split == split for p in pairs)} pairs ==", rows)
        report[f"sweep_{split}"] = rows
    print(f"\nthreshold chosen on dev for precision >= {args.min_precision}:")
    for name in ("plain", "guard"):
        chosen, held = report[f"{name}_threshold"], report[f"{name}_heldout"]
        print(f"  {name:5} t={chosen:.2f}  held-out P={held['precision']:.3f} R={held['recall']:.3f}")
    report["ablation_dev"] = ablation([p for p in pairs if p.split == "dev"], report["guard_threshold"])
    print("\nablation on dev at the guard threshold (each check removed in turn):")
    for row in report["ablation_dev"]:
        print(
            f"  without {row['without']:9} P={row['precision']:.3f} R={row['recall']:.3f} FP={row['false_hits']}"
        )
    out = ROOT / "bench/results/semantic_cache_eval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
