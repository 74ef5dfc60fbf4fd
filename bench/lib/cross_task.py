"""The cross-task table: routers scored on tasks (or MMLU subject groups) that played no part in training them.

    .venv/bin/python -m bench.cascade_eval replay

What is used for what:
- Every candidate is trained on three MMLU groups and scored on the fourth (leave-one-group-out), and
  trained on all of MMLU and scored on MT-Bench (training/train_router.py saves these scores). The choice
  (bench/router_selection.choose, rule "mean" or "maximin") never sees the task whose figure it gives:
- MMLU group g: the candidate chosen on the OTHER three groups (and MT-Bench under maximin); g's own
  score takes no part in the choice (the models scored on the other groups did see g's questions).
- MT-Bench: the candidate chosen on the four MMLU groups only, trained on all of MMLU. The shipped
  routing/models/router_lr.npz is that one under "mean"; under "maximin" it is chosen on all five tasks,
  so its MT-Bench row is then no unseen-task figure.
Baselines on the same questions: random orderings and the length heuristic (longer → strong model).
Intervals: bootstrap 95 % over the held-out questions (500 resamplings); random: 500 random orderings.
"""

import hashlib
import inspect
from pathlib import Path

import numpy as np

from bench.lib.routellm_data import Records, cached_embeddings, load_records, subject_groups
from bench.lib.router_selection import UNSEEN, HeldOut, TaskData, choose, strong_need
from bench.lib.routing_curves import bootstrap_apgr, interval, random_apgr, routing_curve
from routing import features
from routing.features import text_features
from routing.learned import TextRouter, load_model

SAMPLES = 500


def task_data(records: Records, embed: "callable | None", groups: np.ndarray) -> TaskData:  # type: ignore[valid-type]
    """embed None: no embeddings (a zero column), for text-only routers."""
    version = hashlib.sha256(inspect.getsource(features).encode()).hexdigest()[:8]
    text = cached_embeddings(records.prompts, text_features, kind=f"textfeatures-{version}")
    emb = (
        np.zeros((len(records.prompts), 1), np.float32)
        if embed is None
        else cached_embeddings(records.prompts, embed, kind="minilm128")
    )
    return TaskData(text, emb, records.weak, records.strong, groups, records.subjects)


def mmlu_sample(per_group: int | None = None) -> tuple[Records, np.ndarray]:
    """MMLU's records and subject groups; per_group: a seeded sample of that many questions from each group
    (embedding all 14k MMLU prompts takes ~30 CPU-minutes); None = every question."""
    records = load_records()
    groups = subject_groups(records.subjects)
    if per_group is not None:
        rng = np.random.default_rng(18)
        keep = np.zeros(len(groups), dtype=bool)
        for group in sorted(set(groups.tolist())):
            members = np.flatnonzero(groups == group)
            keep[rng.choice(members, size=min(per_group, len(members)), replace=False)] = True
        records, groups = records.take(keep), groups[keep]
    return records, groups


def mmlu_data(embed: "callable | None", per_group: int | None = None) -> TaskData:  # type: ignore[valid-type]
    records, groups = mmlu_sample(per_group)
    return task_data(records, embed, groups)


def other_task_data(records: Records, embed: "callable | None") -> TaskData:  # type: ignore[valid-type]
    """A task other than MMLU (MT-Bench), all under the task key UNSEEN."""
    return task_data(records, embed, np.array([UNSEEN] * len(records.prompts)))


def rows_for(task: str, need: np.ndarray, data: TaskData, lengths: np.ndarray, label: str) -> list[dict]:
    """random, length and learned rows for one held-out set (bootstrap replicates kept for averaging)."""
    weak, strong = data.weak, data.strong
    scored = {"length heuristic": lengths, label: need}
    rows = [_row(task, "random", 0.5, random_apgr(weak, strong, SAMPLES))]
    for name, scores in scored.items():
        rows.append(_row(task, name, routing_curve(scores, weak, strong).apgr(),
                         bootstrap_apgr(scores, weak, strong, SAMPLES)))  # fmt: skip
    return rows


def _row(task: str, router: str, apgr: float, replicates: np.ndarray) -> dict:
    low, high = interval(replicates)
    return {"task": task, "router": router, "apgr": round(apgr, 4), "ci_low": round(low, 4),
            "ci_high": round(high, 4), "_replicates": replicates}  # fmt: skip


def mmlu_heldout_rows(
    data: TaskData, heldout: HeldOut, apgr: dict[str, dict[str, float]], rule: str = "mean"
) -> tuple[list[dict], dict[str, str]]:
    """Per group: the candidate chosen on every other task's held-out APGR (`apgr`, bench/lib/router_selection
    group_apgr), scored on this group by its model trained without it; then the mean of the four groups."""
    rows, chosen_names = [], {}
    for group in sorted(set(data.group.tolist())):
        held = data.take(data.group == group)
        chosen_names[group] = choose(apgr, leave_out=group, rule=rule)
        need = heldout[chosen_names[group]][group]
        rows += rows_for(f"MMLU {group} (held out)", need, held, held.text[:, 0], "learned")
    for router in ("random", "length heuristic", "learned"):
        picked = [r for r in rows if r["router"] == router]
        replicates = np.mean([r["_replicates"] for r in picked], axis=0)
        apgr_mean = 0.5 if router == "random" else float(np.mean([r["apgr"] for r in picked]))
        rows.append(_row("MMLU mean of 4 held-out groups", router, apgr_mean, replicates))
    return rows, chosen_names


def save_heldout(heldout: HeldOut, path: Path) -> None:
    np.savez_compressed(
        path, **{f"{name}|{group}": v for name, groups in heldout.items() for group, v in groups.items()}
    )


def load_heldout(path: Path) -> HeldOut:
    heldout: HeldOut = {}
    with np.load(path) as data:
        for key in data.files:
            name, group = key.rsplit("|", 1)
            heldout.setdefault(name, {})[group] = data[key]
    return heldout


def shipped_need(model_path: Path, records: Records, embed: "callable") -> np.ndarray:  # type: ignore[valid-type]
    """The shipped router file, unchanged, on another task's questions."""
    router = load_model(model_path)
    if not isinstance(router, TextRouter):
        raise TypeError(f"{model_path} is not a TextRouter")
    return strong_need(router, other_task_data(records, embed if router.embedding != "none" else None))


def candidate_rows(heldout: HeldOut, tasks: dict[str, TaskData], samples: int = SAMPLES) -> list[dict]:
    """Every candidate: mean held-out APGR over the MMLU groups and its MT-Bench APGR, bootstrap 95 %."""
    rows = []
    for name, per_task in heldout.items():
        groups = [t for t in per_task if t != UNSEEN]
        boot = {t: bootstrap_apgr(per_task[t], tasks[t].weak, tasks[t].strong, samples) for t in per_task}
        apgr = {t: routing_curve(per_task[t], tasks[t].weak, tasks[t].strong).apgr() for t in per_task}
        row = {"candidate": name, **{t: round(v, 4) for t, v in apgr.items()}}
        row["mmlu_mean"] = round(float(np.mean([apgr[t] for t in groups])), 4)
        row["mmlu_mean_ci"] = [round(v, 4) for v in interval(np.mean([boot[t] for t in groups], axis=0))]
        if UNSEEN in per_task:
            row[f"{UNSEEN}_ci"] = [round(v, 4) for v in interval(boot[UNSEEN])]
        rows.append(row)
    return sorted(rows, key=lambda r: -r["mmlu_mean"])


def print_rows(rows: list[dict]) -> None:
    print(f"\n{'task':<34} {'router':<18} {'APGR':>6}  95% interval")
    for row in rows:
        print(
            f"{row['task']:<34} {row['router']:<18} {row['apgr']:>6.3f}  {row['ci_low']:.3f}–{row['ci_high']:.3f}"
        )


def public(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]
