"""The cross-task table: routers scored on tasks (or MMLU subject groups) that played no part in training them.

    .venv/bin/python -m bench.cascade_eval replay

What is used for what:
- MMLU held out by subject group: for each of the four groups, the candidate is chosen by
  leave-one-group-out over the OTHER three groups, trained on those three, and scored on the held-out one
  (nested; the held-out group is used for nothing else).
- MT-Bench: the router chosen by leave-one-group-out over all four MMLU groups and trained on all of MMLU
  (the shipped routing/models/router_lr.npz, loaded from disk) is scored on MT-Bench, which is used for
  no choice at all.
Baselines on the same questions: random orderings and the length heuristic (longer → strong model).
Intervals: bootstrap 95 % over the held-out questions (1,000 resamplings); random: 1,000 random orderings.
"""

import hashlib
import inspect
from pathlib import Path

import numpy as np

from bench.routellm_data import Records, cached_embeddings, load_records
from bench.routellm_tasks import subject_groups
from bench.router_selection import TaskData, nested_heldout, strong_need
from bench.routing_curves import bootstrap_apgr, interval, random_apgr, routing_curve
from routing import features
from routing.features import text_features
from routing.learned import TextRouter, load_model


def task_data(records: Records, embed: "callable", groups: np.ndarray) -> TaskData:  # type: ignore[valid-type]
    version = hashlib.sha256(inspect.getsource(features).encode()).hexdigest()[:8]
    text = cached_embeddings(records.prompts, text_features, kind=f"textfeatures-{version}")
    emb = cached_embeddings(records.prompts, embed)
    return TaskData(text, emb, records.weak, records.strong, groups)


def mmlu_data(embed: "callable") -> TaskData:  # type: ignore[valid-type]
    records = load_records()
    return task_data(records, embed, subject_groups(records.subjects))


def rows_for(task: str, need: np.ndarray, data: TaskData, lengths: np.ndarray, label: str) -> list[dict]:
    """random, length and learned rows for one held-out set (bootstrap replicates kept for averaging)."""
    weak, strong = data.weak, data.strong
    scored = {"length heuristic": lengths, label: need}
    rows = [_row(task, "random", 0.5, random_apgr(weak, strong))]
    for name, scores in scored.items():
        rows.append(_row(task, name, routing_curve(scores, weak, strong).apgr(),
                         bootstrap_apgr(scores, weak, strong)))  # fmt: skip
    return rows


def _row(task: str, router: str, apgr: float, replicates: np.ndarray) -> dict:
    low, high = interval(replicates)
    return {"task": task, "router": router, "apgr": round(apgr, 4), "ci_low": round(low, 4),
            "ci_high": round(high, 4), "_replicates": replicates}  # fmt: skip


def mmlu_heldout_rows(data: TaskData) -> tuple[list[dict], dict[str, str]]:
    """Nested leave-one-group-out rows per group, then the mean of the four groups."""
    rows, chosen_names = [], {}
    for group, (chosen, need) in nested_heldout(data).items():
        held = data.take(data.group == group)
        chosen_names[group] = chosen.name
        rows += rows_for(f"MMLU {group} (held out)", need, held, held.text[:, 0], "learned (nested)")
    for router in ("random", "length heuristic", "learned (nested)"):
        picked = [r for r in rows if r["router"] == router]
        replicates = np.mean([r["_replicates"] for r in picked], axis=0)
        apgr = 0.5 if router == "random" else float(np.mean([r["apgr"] for r in picked]))
        rows.append(_row("MMLU mean of 4 held-out groups", router, apgr, replicates))
    return rows, chosen_names


def unseen_task_rows(task: str, records: Records, embed: "callable", model_path: Path) -> list[dict]:  # type: ignore[valid-type]
    """The shipped router file, unchanged, on a task it never saw."""
    router = load_model(model_path)
    if not isinstance(router, TextRouter):
        raise TypeError(f"{model_path} is not a TextRouter")
    data = task_data(records, embed, np.array([task] * len(records.prompts)))
    return rows_for(task, strong_need(router, data), data, data.text[:, 0], "shipped router")


def print_rows(rows: list[dict]) -> None:
    print(f"\n{'task':<34} {'router':<18} {'APGR':>6}  95% interval")
    for row in rows:
        print(
            f"{row['task']:<34} {row['router']:<18} {row['apgr']:>6.3f}  {row['ci_low']:.3f}–{row['ci_high']:.3f}"
        )


def public(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]
