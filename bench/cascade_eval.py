"""Cascade and learned-router evaluation: quality against cost.

    .venv/bin/python -m bench.cascade_eval replay   # the cross-task table (bench/cross_task.py)
    .venv/bin/python -m bench.cascade_eval live     # SmolLM2 → Gemma 3 on TriviaQA through the gateway (bench/cascade_live.py)

replay: the router chosen by cross-task validation, scored on MMLU subject groups held out (nested) and on
MT-Bench (unseen), beside random routing and the length heuristic, with bootstrap 95 % intervals; writes
bench/results/cascade_eval_replay.json. Needs the shared RouteLLM records (LLMGW_ROUTELLM_EVAL_DIR).
"""

import argparse
import json
import os
import sys

import numpy as np

from bench.cross_task import (
    load_heldout,
    mmlu_data,
    mmlu_heldout_rows,
    print_rows,
    public,
    save_heldout,
    unseen_task_rows,
)
from bench.routellm_data import RESULTS
from bench.routellm_tasks import load_mt_bench
from bench.router_selection import (
    CANDIDATES,
    TEXT_CANDIDATES,
    choose,
    group_apgr,
    logo_scores,
    train_candidate,
)
from routing.config import MODELS_DIR
from routing.learned import TextRouter

ROUTER_PATH = MODELS_DIR / "router_lr.npz"
LOGO_PATH = RESULTS / "router_logo_scores.npz"


def embed_minilm(prompts: list[str]) -> np.ndarray:
    """The serving encoder's sentence vectors (cache/encoder.py: MiniLM, first 128 tokens, ONNX when
    available), so a router trained here sees the embeddings the gateway computes. Cached by the caller."""
    from cache.encoder import build_encoder

    print(f"embedding {len(prompts)} prompts with MiniLM (cached afterwards)...", file=sys.stderr)
    encoder = build_encoder(None, threads=min(os.cpu_count() or 1, 2))
    batches = [encoder.vectors(prompts[i : i + 32]) for i in range(0, len(prompts), 32)]
    return np.concatenate(batches) if batches else np.zeros((0, encoder.dim), np.float32)


def train_replay_router(
    with_embeddings: bool = True, per_group: int | None = None
) -> tuple[TextRouter, dict]:
    """The shipped router: the candidate with the best mean leave-one-group-out APGR over the 4 MMLU groups,
    then fit on all of MMLU. Saves the held-out scores for `replay`."""
    candidates = CANDIDATES if with_embeddings else TEXT_CANDIDATES
    data = mmlu_data(embed_minilm if with_embeddings else None, per_group)
    heldout = logo_scores(data, candidates)
    save_heldout(heldout, LOGO_PATH)
    apgr = group_apgr(heldout, data)
    chosen = next(c for c in candidates if c.name == choose(apgr))
    means = {name: round(float(np.mean(list(v.values()))), 4) for name, v in apgr.items()}
    print(f"chosen: {chosen.name} (mean held-out-group APGR {means[chosen.name]:.4f})")
    table = {name: {g: round(v, 4) for g, v in groups.items()} for name, groups in apgr.items()}
    selection = {"chosen": chosen.name, "per_group": per_group, "mean_logo_apgr": means, "logo_apgr": table}
    return train_candidate(chosen, data), selection


def replay(per_group: int | None = None) -> None:
    if not ROUTER_PATH.exists() or not LOGO_PATH.exists():
        sys.exit("run `python -m bench.train_router router` first (router + leave-one-group-out scores)")
    heldout_scores = load_heldout(LOGO_PATH)
    with_embeddings = any("minilm" in name or "pca" in name for name in heldout_scores)
    data = mmlu_data(embed_minilm if with_embeddings else None, per_group)
    heldout, chosen = mmlu_heldout_rows(data, heldout_scores)
    unseen = unseen_task_rows("MT-Bench (unseen, MMLU-trained)", load_mt_bench(), embed_minilm, ROUTER_PATH)
    print_rows(heldout + unseen)
    print("\ncandidate chosen without each held-out group:", json.dumps(chosen))
    write(
        "replay", {"rows": public(heldout + unseen), "choices_per_group": chosen, "router": str(ROUTER_PATH)}
    )


def write(mode: str, payload: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"cascade_eval_{mode}.json"
    path.write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {path}")


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=["replay", "live"])
    parser.add_argument(
        "--per-group", type=int, default=None, help="replay: the MMLU sample train_router used"
    )
    args, rest = parser.parse_known_args()
    if args.mode == "replay":
        replay(args.per_group)
    else:
        from bench.cascade_live import main as live_main

        result = live_main(rest)
        write("live" if result.get("set", "trivia_qa") == "trivia_qa" else f"live_{result['set']}", result)


if __name__ == "__main__":
    main()
