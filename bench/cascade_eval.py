"""Cascade and learned-router evaluation: quality against cost.

    .venv/bin/python -m bench.cascade_eval replay   # the cross-task table (bench/lib/cross_task.py)
    .venv/bin/python -m bench.cascade_eval live     # SmolLM2 → Gemma 3 on TriviaQA through the gateway (bench/lib/cascade_live.py)
    .venv/bin/python -m bench.cascade_eval alias    # a cascade alias live beside its replay (bench/lib/cascade_alias.py)

replay: the router chosen by cross-task validation, scored on MMLU subject groups held out (nested), on
MT-Bench (unseen: chosen on MMLU only) and on GSM8K (never used), beside random routing and the length
heuristic, with bootstrap 95 % intervals, then every candidate's table; writes
bench/results/cascade_eval_replay.json. Needs the shared RouteLLM records (LLMGW_ROUTELLM_EVAL_DIR). In a fresh
checkout it first computes the candidates' held-out scores (about a minute: MiniLM embeddings, cached after).
"""

import argparse
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bench.lib.cascade_common import embed_minilm, write, write_live
from bench.lib.cross_task import (
    candidate_rows,
    load_heldout,
    mmlu_data,
    mmlu_heldout_rows,
    other_task_data,
    print_rows,
    public,
    rows_for,
    save_heldout,
    shipped_need,
)
from bench.lib.routellm_data import REPO, RESULTS, load_mt_bench
from bench.lib.routellm_gsm8k import gsm8k_rows
from bench.lib.router_selection import (
    CANDIDATES,
    TEXT_CANDIDATES,
    UNSEEN,
    HeldOut,
    TaskData,
    add_unseen_scores,
    choose,
    group_apgr,
    logo_scores,
    task_sets,
    train_candidate,
)
from routing.config import MODELS_DIR
from routing.learned import TextRouter

ROUTER_PATH = MODELS_DIR / "router_lr.npz"


@dataclass(frozen=True)
class RouterFiles:
    """Where a training run leaves its router, held-out scores and selection. No tag: the shipped router;
    a tag (a study, e.g. all of MMLU without embeddings) keeps its router under bench/results instead."""

    tag: str = ""

    def _name(self, stem: str, ext: str) -> str:
        return f"{stem}-{self.tag}.{ext}" if self.tag else f"{stem}.{ext}"

    @property
    def router(self) -> Path:
        return RESULTS / self._name("router_lr", "npz") if self.tag else ROUTER_PATH

    @property
    def logo(self) -> Path:
        return RESULTS / self._name("router_logo_scores", "npz")

    @property
    def selection(self) -> Path:
        return RESULTS / self._name("router_selection", "json")

    @property
    def replay_mode(self) -> str:
        return f"replay-{self.tag}" if self.tag else "replay"


def compute_heldout(
    with_embeddings: bool, per_group: int | None, files: RouterFiles
) -> tuple[HeldOut, TaskData, TaskData]:
    """Every candidate's scores on each MMLU group held out and on MT-Bench, saved for `replay`."""
    candidates = CANDIDATES if with_embeddings else TEXT_CANDIDATES
    embed = embed_minilm if with_embeddings else None
    data, other = mmlu_data(embed, per_group), other_task_data(load_mt_bench(), embed)
    heldout = logo_scores(data, candidates)
    add_unseen_scores(heldout, data, other, candidates)
    save_heldout(heldout, files.logo)
    return heldout, data, other


def train_replay_router(
    with_embeddings: bool = True,
    per_group: int | None = None,
    rule: str = "mean",
    files: RouterFiles = RouterFiles(),
) -> tuple[TextRouter, dict]:
    """The shipped router: the candidate chosen by `rule` (bench/router_selection.choose) on the 4 held-out
    MMLU groups (and MT-Bench for maximin), then fit on all of MMLU. Saves the held-out scores for `replay`."""
    candidates = CANDIDATES if with_embeddings else TEXT_CANDIDATES
    heldout, data, other = compute_heldout(with_embeddings, per_group, files)
    apgr = group_apgr(heldout, data, other)
    chosen = next(c for c in candidates if c.name == choose(apgr, rule=rule))
    print(
        f"chosen: {chosen.name} (held-out APGR {json.dumps({t: round(v, 4) for t, v in apgr[chosen.name].items()})})"
    )
    table = {name: {g: round(v, 4) for g, v in groups.items()} for name, groups in apgr.items()}
    selection = {"chosen": chosen.name, "rule": rule,
                 "per_group": per_group, "heldout_apgr": table}  # fmt: skip
    return train_candidate(chosen, data), selection


def _saved_heldout(per_group: int | None, files: RouterFiles) -> tuple[HeldOut, str]:
    """The held-out scores and rule of the last training run; in a fresh checkout (the scores are not
    committed) they are computed again as `train_router router` does, the router file left as it is."""
    if not files.router.exists() or not files.selection.exists():
        sys.exit("run `python -m training.train_router router` first (router + leave-one-group-out scores)")
    selection = json.loads(files.selection.read_text())
    if files.logo.exists():
        return load_heldout(files.logo), selection.get("rule", "mean")
    names = selection["heldout_apgr"]
    print(f"no {files.logo.name}: computing the held-out scores of {len(names)} candidates", file=sys.stderr)
    return compute_heldout(_uses_embeddings(names), per_group, files)[0], selection.get("rule", "mean")


def _uses_embeddings(candidates: Iterable[str]) -> bool:
    return any("minilm" in name or "pca" in name for name in candidates)


def replay(per_group: int | None = None, files: RouterFiles = RouterFiles()) -> None:
    heldout_scores, rule = _saved_heldout(per_group, files)
    embed = embed_minilm if _uses_embeddings(heldout_scores) else None
    data, mt_bench = mmlu_data(embed, per_group), load_mt_bench()
    other = other_task_data(mt_bench, embed)
    apgr = group_apgr(heldout_scores, data, other)
    heldout, chosen = mmlu_heldout_rows(data, heldout_scores, apgr, rule)
    chosen[UNSEEN] = choose(apgr, leave_out=UNSEEN, rule=rule)
    task = "MT-Bench (unseen, MMLU-trained)"
    unseen = rows_for(task, heldout_scores[chosen[UNSEEN]][UNSEEN], other, other.text[:, 0], "learned")
    shipped = shipped_need(files.router, mt_bench, embed_minilm)
    used = "used in the choice" if rule == "maximin" else "unseen"
    unseen += rows_for(f"MT-Bench ({used})", shipped, other, other.text[:, 0], "shipped router")[-1:]
    unseen += gsm8k_rows(files.router)
    print_rows(heldout + unseen)
    print(f"\ncandidate chosen ({rule}) without each held-out task:", json.dumps(chosen))
    candidates = candidate_rows(heldout_scores, task_sets(data, other))
    print(f"\n{'candidate':<44} {'MMLU groups (mean) [95 %]':>26} {'MT-Bench [95 %]':>22}")
    for row in candidates:
        low, high = row["mmlu_mean_ci"]
        mlow, mhigh = row[f"{UNSEEN}_ci"]
        print(f"{row['candidate']:<44} {row['mmlu_mean']:.3f} [{low:.3f}, {high:.3f}]"
              f"        {row[UNSEEN]:.3f} [{mlow:.3f}, {mhigh:.3f}]")  # fmt: skip
    write(files.replay_mode, {"rows": public(heldout + unseen), "rule": rule, "choices_per_task": chosen,
                              "router": str(files.router.relative_to(REPO)), "candidates": candidates})  # fmt: skip


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=["replay", "live", "alias"])
    parser.add_argument(
        "--per-group", type=int, default=None, help="replay: the MMLU sample train_router used"
    )
    parser.add_argument("--tag", default="", help="replay: the study `train_router router --tag` wrote")
    args, rest = parser.parse_known_args()
    if args.mode == "replay":
        replay(args.per_group, RouterFiles(args.tag))
    elif args.mode == "alias":
        from bench.lib.cascade_alias import main as alias_main

        alias_main(rest)
    else:
        from bench.lib.cascade_live import main as live_main

        write_live(live_main(rest))


if __name__ == "__main__":
    main()
