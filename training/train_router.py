"""Train the learned router (MMLU replay) as a logistic model; the cascade confidence has its own command.

    .venv/bin/python -m training.train_router router [--no-embeddings] [--per-group N] [--rule mean|maximin] [--tag T]
        # → routing/models/router_lr.npz, bench/results/router_selection.json + router_logo_scores.npz;
        #   with --tag T a study: bench/results/router_lr-T.npz, router_selection-T.json, router_logo_scores-T.npz
    .venv/bin/python -m training.train_router cascade   # = python -m training.train_cascade_confidence

The candidates, their cross-task scores and the choice are bench/'s (cascade_eval.train_replay_router,
router_selection, cross_task), which the maintained `bench.cascade_eval replay` scores; this writes the file.
scikit-learn is used at training time only; serving reads the weights with numpy (routing/learned.py).
"""

import argparse
import json
import os

from bench.lib.routellm_data import RESULTS


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
        from training.train_cascade_confidence import main as train_cascade_confidence

        train_cascade_confidence([])


if __name__ == "__main__":
    main()
