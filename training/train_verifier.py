"""Trains the semantic-cache verifier and writes its weights and calibration to cache/verifier_model/.

1. builds the labeled pairs (bench/lib/verifier_pairs.py: templates + MMLU stems, grouped train / calib /
   heldout splits; the hand-written pairs of bench/data/verifier_hand/ in train and calib), adds
   train-only pairs (training/verifier_augment.py) and the naturally written pairs of
   training/verifier_natural.py (train and calib by cluster; `--holdout-source S` puts the whole source S in
   heldout instead, and the model then never sees it: the held-out evaluation of issue 40);
2. encodes every question once, one per forward pass and in its normalised form (cache.encoder.normalise),
   with the shipped MiniLM (sentence + word vectors) and computes the alignment features (cache/alignment.py);
3. fits gradient-boosted trees (scikit-learn) on the train split only, exported to numpy arrays (run
   as one ONNX tree ensemble by cache/verifier.py);
4. calibration table: precision and recall of the whole lookup (cosine ≥ candidate threshold, exact rules
   (numbers, units) agree, verifier ≥ t) on the calib split for every t, with its counts; the gateway picks
   t from it per precision target (cache.verifier.threshold_for);
5. prints the held-out split at the default target (never used for any choice above).

    LLMGW_ROUTELLM_EVAL_DIR=../shared/routellm_eval python -m training.train_verifier [--per-subject 20]
    # the shipped weights (2026-12-04: no natural pairs, the first 29 features; training/README.md):
    LLMGW_ROUTELLM_EVAL_DIR=../shared/routellm_eval python -m training.train_verifier --no-natural --features 29
Takes a few minutes on 2 cores (most of it encoding). Writes bench/results/train_verifier.json (with `--out D`:
D/train_verifier.json).
"""

import argparse
import json
import pickle
import time
from pathlib import Path

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier

from bench.lib.verifier_pairs import Pair, build, encode_all, form, shipped_encoder
from cache.alignment import FEATURES, pair_features
from cache.config import CachePolicy, CacheSettings
from cache.encoder import EncodedQuestion
from cache.verifier import MODEL_DIR, exact_conflict
from training.verifier_augment import augment
from training.verifier_natural import SOURCES, natural_pairs

ROOT = Path(__file__).resolve().parents[1]
CANDIDATE_THRESHOLD = 0.6  # cosine below which the index does not even propose a candidate
DEFAULT_TARGET = CachePolicy().semantic_min_precision
ENCODER = "onnx-int8" if CacheSettings().onnx_int8 else "onnx-fp32"  # what the calibration was measured on


CACHE_FORMAT = "one-per-pass, keyed by encoded form"  # pickles of other layouts are not reused


def _encoded(pairs: list[Pair], cache: Path | None) -> dict[str, EncodedQuestion]:
    """Encodings of every question of `pairs`; `cache` keeps them by encoded form between runs (a pickle
    written by an older version of this script, batched or keyed by raw text, is ignored)."""
    encoder = shipped_encoder()
    texts = {t for p in pairs for t in (p.a, p.b)}
    stored = pickle.loads(cache.read_bytes()) if cache and cache.exists() else {}
    known: dict[str, EncodedQuestion] = (
        stored.get("encoded", {}) if stored.get("format") == CACHE_FORMAT else {}
    )
    missing = [t for t in texts if form(encoder, t) not in known]
    if missing:
        known.update({q.text: q for q in encode_all(encoder, missing).values()})
        if cache:
            cache.write_bytes(pickle.dumps({"format": CACHE_FORMAT, "encoded": known}))
    return {t: known[form(encoder, t)] for t in texts}


def featurize(
    pairs: list[Pair], encoded: dict[str, EncodedQuestion]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features, labels, and whether the lookup would even ask the verifier (candidate, no exact-rule conflict)."""
    features = np.stack([pair_features(encoded[p.a], encoded[p.b]) for p in pairs])
    labels = np.array([p.label for p in pairs])
    eligible = np.array(
        [
            features[i, 0] >= CANDIDATE_THRESHOLD and not exact_conflict(encoded[p.a], encoded[p.b])
            for i, p in enumerate(pairs)
        ]
    )
    return features, labels, eligible


def curve(prob: np.ndarray, labels: np.ndarray, eligible: np.ndarray) -> list[dict[str, float]]:
    points = []
    positives = max(int(labels.sum()), 1)
    for t in np.round(np.arange(0.05, 1.0, 0.01), 2):
        hit = eligible & (prob >= t)
        tp, fp = int((hit & (labels == 1)).sum()), int((hit & (labels == 0)).sum())
        points.append(
            {"threshold": float(t), "precision": tp / (tp + fp) if tp + fp else 1.0, "recall": tp / positives,
             "hits": tp + fp, "false_hits": fp}
        )  # fmt: skip
    return points


def split_reports(
    prob: np.ndarray, labels: np.ndarray, eligible: np.ndarray, split: np.ndarray, threshold: float
) -> dict[str, dict[str, float]]:
    """Precision, recall and false hits of the whole lookup at `threshold` on calib and heldout (printed)."""
    report = {}
    for name in ("calib", "heldout"):
        mask = split == name
        hit = eligible[mask] & (prob[mask] >= threshold)
        y = labels[mask]
        tp, fp = int((hit & (y == 1)).sum()), int((hit & (y == 0)).sum())
        report[name] = {
            "precision": tp / max(tp + fp, 1),
            "recall": tp / max(int(y.sum()), 1),
            "false_hits": fp,
        }
        print(
            f"{name:8} t={threshold:.2f} P={report[name]['precision']:.3f} R={report[name]['recall']:.3f} FP={fp}"
        )
    return report


def export(
    model: HistGradientBoostingClassifier,
    calibration: list[dict[str, float]],
    info: dict,
    folder: Path = MODEL_DIR,
    width: int = len(FEATURES),
) -> None:
    """The trees as padded arrays (trees × nodes) for cache.verifier.Trees."""
    trees = [predictors[0].nodes for predictors in model._predictors]
    width = max(len(t) for t in trees)

    def padded(field: str, dtype: type) -> np.ndarray:
        out = np.zeros((len(trees), width), dtype=dtype)
        for i, nodes in enumerate(trees):
            out[i, : len(nodes)] = nodes[field]
        return out

    arrays = {
        "feature": padded("feature_idx", np.int64), "threshold": padded("num_threshold", np.float64),
        "left": padded("left", np.int64), "right": padded("right", np.int64),
        "missing_left": padded("missing_go_to_left", bool), "leaf": padded("is_leaf", bool),
        "value": padded("value", np.float64),
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(folder / "verifier.npz", **arrays)
    meta = {"features": list(FEATURES[:width]), "baseline": float(np.ravel(model._baseline_prediction)[0]),
            "candidate_threshold": CANDIDATE_THRESHOLD, "encoder": ENCODER, "normalise_text": True,
            "calibration": calibration, "trained": info}  # fmt: skip
    (folder / "verifier.json").write_text(json.dumps(meta, indent=1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--per-subject", type=int, default=20, help="MMLU questions per subject (shipped: 20)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, help="keep the encodings in this pickle between runs")
    parser.add_argument(
        "--out", type=Path, default=MODEL_DIR, help="where to write the weights (shipped: default)"
    )
    parser.add_argument(
        "--no-hand",
        action="store_true",
        help="without bench/data/verifier_hand/'s pairs (train + calib; the shipped weights have them)",
    )
    parser.add_argument("--no-augment", action="store_true", help="without verifier_augment.py's pairs")
    parser.add_argument("--no-natural", action="store_true", help="without verifier_natural.py's pairs")
    parser.add_argument(
        "--features", type=int, default=len(FEATURES), help="use the first N features (shipped weights: 29)"
    )
    parser.add_argument(
        "--holdout-source", choices=SOURCES, help="a natural source kept out of train and calib"
    )
    parser.add_argument(
        "--natural-weight", type=float, default=3.0, help="training weight of a natural pair (others: 1)"
    )
    args = parser.parse_args(argv)
    started = time.time()
    pairs = build(args.seed, args.per_subject, not args.no_hand)
    augmented = [] if args.no_augment else augment(pairs, args.seed)  # train split only
    pairs += augmented
    natural = [] if args.no_natural else natural_pairs(args.seed, args.holdout_source)
    pairs += natural
    encoded = _encoded(pairs, args.cache)
    encoded_s = time.time() - started
    features, labels, eligible = featurize(pairs, encoded)
    features = features[:, : args.features]
    split = np.array([p.split for p in pairs])
    train = split == "train"
    model = HistGradientBoostingClassifier(
        max_iter=300, learning_rate=0.05, max_leaf_nodes=15, random_state=args.seed
    )
    is_natural = np.array([i >= len(pairs) - len(natural) for i in range(len(pairs))])
    weights = np.where(is_natural, args.natural_weight, 1.0)
    model.fit(features[train], labels[train], sample_weight=weights[train])
    prob = model.predict_proba(features)[:, 1]
    calib = split == "calib"
    calibration = curve(prob[calib], labels[calib], eligible[calib])
    info = {"pairs": {s: int((split == s).sum()) for s in ("train", "calib", "heldout")}, "seed": args.seed,
            "augmented": len(augmented), "natural": {s: int((split[is_natural] == s).sum()) for s in ("train", "calib", "heldout")},
            "holdout_source": args.holdout_source, "natural_weight": args.natural_weight,
            "per_subject": args.per_subject, "encode_s": round(encoded_s, 1), "total_s": round(time.time() - started, 1)}  # fmt: skip
    export(model, calibration, info, args.out, args.features)
    from cache.verifier import Verifier

    shipped = Verifier.load(args.out)
    assert np.allclose(shipped.probabilities(features[:500]), prob[:500], atol=1e-6), (
        "export differs from sklearn"
    )
    threshold = shipped.threshold_for(DEFAULT_TARGET)
    report = {"info": info, "threshold": threshold, **split_reports(prob, labels, eligible, split, threshold)}
    if args.holdout_source:
        held = is_natural & (split == "heldout")
        report["heldout_source"] = {
            "source": args.holdout_source,
            **split_reports(prob[held], labels[held], eligible[held], split[held], threshold)["heldout"],
        }
    out = (
        ROOT / "bench/results/train_verifier.json"
        if args.out == MODEL_DIR
        else args.out / "train_verifier.json"
    )
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out} and {out} in {time.time() - started:.0f}s (encoding {encoded_s:.0f}s)")


if __name__ == "__main__":
    main()
