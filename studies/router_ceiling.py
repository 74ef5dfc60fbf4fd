"""How high can a router go that knows only which subject (or category) a question belongs to?

    .venv/bin/python -m studies.router_ceiling        # ~1 min → table, studies/results/router_ceiling.json

Issue 18 asks for APGR >= 0.67 on MMLU with each subject group held out whole. The one signal the learned
routers found on MMLU is the subject (bench/README.md, "Routing and cascades"): trained on a random split
they reach 0.669, on a held-out group no better than length. This measures the ceiling of that signal on the
held-out data itself, with nothing to learn:

- **group oracle (in-sample):** every question scored by its own subject's mean gain (strong − weak correct),
  computed on the very questions scored. No router that gives one score per subject can beat it.
- **group halves:** the subject means computed on a random half of the group, scored on the other half
  (the subject known exactly, its difficulty estimated from data; 20 seeded splits, mean).
- **length** (the shipped heuristic) and the per-question oracle (strong − weak itself: the end of the scale);
  and length inside each subject (the median over subjects of its APGR there): a signal beyond the subject.

MT-Bench gets the same with its 8 categories, GSM8K (no subjects) length and the oracle only. Intervals:
1,000 bootstrap resamplings of the questions, the in-sample means recomputed on each.
"""

import json

import numpy as np

from bench.lib.routellm_data import GROUPS, Records, load_gsm8k, load_mt_bench, load_records, subject_groups
from bench.lib.routing_curves import bootstrap_apgr, routing_curve
from studies import RESULTS

SAMPLES = 1000
SPLITS = 20


def subject_means(labels: np.ndarray, gain: np.ndarray, fit: np.ndarray) -> np.ndarray:
    """Each question's score: the mean gain of its label over the questions in `fit` (0 if none there)."""
    means = {x: gain[fit & (labels == x)].mean() if (fit & (labels == x)).any() else 0.0 for x in set(labels)}
    return np.array([means[x] for x in labels])


def interval(values: np.ndarray) -> list[float]:
    return [round(float(v), 4) for v in np.percentile(values, [2.5, 97.5])]


def in_sample_oracle(labels: np.ndarray, weak: np.ndarray, strong: np.ndarray) -> dict:
    """APGR of the per-label mean gain scored on the same questions, with a bootstrap that recomputes it."""
    gain, everything = strong - weak, np.ones(len(weak), dtype=bool)
    point = routing_curve(subject_means(labels, gain, everything), weak, strong).apgr()
    rng = np.random.default_rng(0)
    samples = []
    for i in range(SAMPLES):
        p = rng.integers(0, len(weak), len(weak))
        scores = subject_means(labels[p], gain[p], everything)
        samples.append(routing_curve(scores, weak[p], strong[p], seed=i).apgr())
    return {"apgr": round(point, 4), "interval": interval(np.array(samples))}


def halves(labels: np.ndarray, weak: np.ndarray, strong: np.ndarray) -> dict:
    """Subject means from one random half, APGR on the other; mean and range over seeded splits."""
    rng, gain, values = np.random.default_rng(1), strong - weak, []
    for _ in range(SPLITS):
        fit = rng.random(len(weak)) < 0.5
        scores = subject_means(labels, gain, fit)
        values.append(routing_curve(scores[~fit], weak[~fit], strong[~fit]).apgr())
    return {"apgr": round(float(np.mean(values)), 4), "range": [round(min(values), 4), round(max(values), 4)]}


def scored(scores: np.ndarray, weak: np.ndarray, strong: np.ndarray) -> dict:
    return {"apgr": round(routing_curve(scores, weak, strong).apgr(), 4),
            "interval": interval(bootstrap_apgr(scores, weak, strong, samples=SAMPLES))}  # fmt: skip


def within_labels(labels: np.ndarray, scores: np.ndarray, weak: np.ndarray, strong: np.ndarray) -> float:
    """The median over labels of the score's APGR among that label's questions (labels with a gain only)."""
    values = [routing_curve(scores[labels == x], weak[labels == x], strong[labels == x]).apgr()
              for x in sorted(set(labels)) if (strong - weak)[labels == x].mean() != 0]  # fmt: skip
    return round(float(np.median(values)), 4)


def task_row(records: Records, labels: np.ndarray | None) -> dict:
    weak, strong = records.weak, records.strong
    length = np.log([len(p) for p in records.prompts])
    row = {"questions": len(weak), "labels": 0 if labels is None else len(set(labels)),
           "length": scored(length, weak, strong),
           "oracle": round(routing_curve(strong - weak, weak, strong).apgr(), 4)}  # fmt: skip
    if labels is not None:
        row |= {
            "group_oracle": in_sample_oracle(labels, weak, strong),
            "halves": halves(labels, weak, strong),
            "length_within": within_labels(labels, length, weak, strong),
        }
    return row


def main() -> dict:
    mmlu = load_records()
    groups = subject_groups(mmlu.subjects)
    rows = {f"MMLU {g}": task_row(mmlu.take(groups == g), mmlu.subjects[groups == g]) for g in GROUPS}
    rows["MMLU, all (random split)"] = task_row(mmlu, mmlu.subjects)
    mt_bench = load_mt_bench()
    rows["MT-Bench"] = task_row(mt_bench, mt_bench.subjects)
    rows["GSM8K"] = task_row(load_gsm8k(), None)
    print(f"{'task':26} {'n':>6} {'labels':>6} {'length':>22} {'label oracle (in-sample)':>26} "
          f"{'label means, halves':>22} {'length within':>13} {'oracle':>7}")  # fmt: skip
    for name, row in rows.items():
        cells = [f"{row['length']['apgr']:.3f} {row['length']['interval']}"]
        if "group_oracle" in row:
            cells += [f"{row['group_oracle']['apgr']:.3f} {row['group_oracle']['interval']}",
                      f"{row['halves']['apgr']:.3f} {row['halves']['range']}", f"{row['length_within']:.3f}"]  # fmt: skip
        else:
            cells += ["—", "—", "—"]
        print(f"{name:26} {row['questions']:>6} {row['labels']:>6} {cells[0]:>22} {cells[1]:>26} {cells[2]:>22} "
              f"{cells[3]:>13} {row['oracle']:>7.3f}")  # fmt: skip
    mean = float(np.mean([rows[f"MMLU {g}"]["group_oracle"]["apgr"] for g in GROUPS]))
    print(
        f"mean over the four held-out MMLU groups of the in-sample subject oracle: {mean:.3f} (target 0.67)"
    )
    result = {"rows": rows, "mmlu_group_oracle_mean": round(mean, 4), "samples": SAMPLES, "splits": SPLITS}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "router_ceiling.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
