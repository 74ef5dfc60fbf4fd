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

from bench.cascade_common import fit, fit_within_subject  # noqa: F401 (the router's fitting, kept importable here)
from bench.routellm_data import RESULTS


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
