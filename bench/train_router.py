"""Train the learned router (MMLU replay) as a logistic model; the cascade confidence has its own command.

    .venv/bin/python -m bench.train_router router [--no-embeddings] [--per-group N] [--rule mean|maximin] [--tag T]
        # → routing/models/router_lr.npz, bench/results/router_selection.json + router_logo_scores.npz;
        #   with --tag T a study: bench/results/router_lr-T.npz, router_selection-T.json, router_logo_scores-T.npz
    .venv/bin/python -m bench.train_router cascade   # = python -m bench.train_cascade_confidence

scikit-learn is used here only; serving reads the weights with numpy (routing/learned.py).
"""

import argparse
import json
import os

import numpy as np
from sklearn.linear_model import LogisticRegression, Ridge

from bench.routellm_data import RESULTS
from routing.learned import LogisticModel


def fit(features: np.ndarray, labels: np.ndarray, c: float, uses_logprobs: bool) -> LogisticModel:
    """Standardise, then L2-regularised logistic regression predicting labels == 1 (small is good)."""
    mean = features.mean(axis=0)
    scale = features.std(axis=0) + 1e-6
    model = LogisticRegression(C=c, max_iter=2000).fit((features - mean) / scale, labels)
    return LogisticModel(
        model.coef_[0].astype(np.float32), float(model.intercept_[0]), mean, scale, uses_logprobs
    )


def fit_within_subject(
    features: np.ndarray, weak: np.ndarray, strong: np.ndarray, subjects: np.ndarray, c: float
) -> LogisticModel:
    """The gain (strong − weak) fitted on within-subject differences only: features and gains centred per
    subject, ridge (alpha = 1/c), so between-subject differences (what an embedding learns) take no part.
    Stored as a LogisticModel for P(the weak answer is good enough): a 1-d logistic fit of "escalating
    would not gain" on the gain score sets its scale and bias (scale forced negative: more gain, less
    confidence), so the ranking is the gain score's."""
    mean = features.mean(axis=0)
    scale = features.std(axis=0) + 1e-6
    z = (features - mean) / scale
    gain = strong - weak
    z_within, gain_within = z.copy(), gain.astype(np.float64).copy()
    for subject in np.unique(subjects):
        rows = subjects == subject
        z_within[rows] -= z[rows].mean(axis=0)
        gain_within[rows] -= gain[rows].mean()
    coef = Ridge(alpha=1.0 / c, fit_intercept=False).fit(z_within, gain_within).coef_
    score = z @ coef
    calib = LogisticRegression(max_iter=1000).fit(score[:, None] / (score.std() + 1e-9), gain <= 0)
    slope = min(float(calib.coef_[0, 0]), -1e-3) / (score.std() + 1e-9)
    return LogisticModel((coef * slope).astype(np.float32), float(calib.intercept_[0]), mean, scale, False)


def choose_c(train_x: np.ndarray, train_y: np.ndarray, score: "callable", seed: int = 0) -> float:  # type: ignore[valid-type]
    """Pick the regularisation by a validation slice of the training part: higher score(model, x, idx) wins."""
    rng = np.random.default_rng(seed)
    index = rng.permutation(len(train_y))
    cut = int(len(index) * 0.8)
    fit_idx, val_idx = index[:cut], index[cut:]
    results = {
        c: score(fit(train_x[fit_idx], train_y[fit_idx], c, False), val_idx) for c in (0.001, 0.01, 0.1, 1.0)
    }
    return max(results, key=results.get)


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser()
    parser.add_argument("which", choices=["router", "cascade"])
    parser.add_argument("--no-embeddings", action="store_true", help="router: text-feature candidates only")
    parser.add_argument(
        "--per-group", type=int, default=None, help="router: MMLU questions sampled per group"
    )
    parser.add_argument(
        "--rule", choices=["mean", "maximin"], default="mean",
        help="router: mean held-out MMLU-group APGR, or maximin against length over the groups and MT-Bench",
    )  # fmt: skip
    parser.add_argument("--tag", default="", help="router: a study, kept under bench/results (not shipped)")
    args = parser.parse_args()
    if args.which == "router":
        from bench.cascade_eval import RouterFiles, train_replay_router

        files = RouterFiles(args.tag)
        RESULTS.mkdir(parents=True, exist_ok=True)
        model, selection = train_replay_router(not args.no_embeddings, args.per_group, args.rule, files)
        model.save(files.router)
        files.selection.write_text(json.dumps(selection, indent=2))
        print("saved")
    else:
        from bench.train_cascade_confidence import main as train_cascade_confidence

        train_cascade_confidence([])


if __name__ == "__main__":
    main()
