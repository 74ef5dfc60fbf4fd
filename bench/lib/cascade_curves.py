"""Quality against escalation share and cost for a live cascade, computed offline from the record.

Escalating the share r of least confident small answers: accuracy = the large model's answer on the
escalated questions, the small one's elsewhere; cost = every small attempt plus the large attempts
(what the gateway's accounting charges). Random escalation at the same share: the expected line, its
spread over 1,000 random orderings. Intervals: bootstrap 95 % over questions (1,000 resamplings).
APGR (bench/lib/routing_curves.py) summarises a curve: 0.5 is random escalation, 1.0 the oracle.
"""

from typing import Any

import numpy as np

from bench.lib.cascade_common import leave_one_site_out, transferred
from bench.lib.routing_curves import bootstrap_apgr, interval, random_apgr, routing_curve
from routing.confidence import mean_logprob

RATES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
SAMPLES = 1000


def costs(answers: list[dict], price: tuple[float, float]) -> np.ndarray:
    return np.array(
        [(a["prompt_tokens"] * price[0] + a["completion_tokens"] * price[1]) / 1e6 for a in answers]
    )


def outcomes(saved: dict[str, Any], questions: list[dict]) -> tuple[list[dict], np.ndarray, np.ndarray, np.ndarray,
                                                                     np.ndarray]:  # fmt: skip
    """Per question of a live record: the small model's answers, both models' correctness (0/1) and costs."""
    small, large = (saved["answers"][saved[k]] for k in ("small", "large"))
    rows_s, rows_l = [small[q["id"]] for q in questions], [large[q["id"]] for q in questions]
    weak = np.array([r["correct"] for r in rows_s], float)
    strong = np.array([r["correct"] for r in rows_l], float)
    prices = saved["prices"]
    return rows_s, weak, strong, costs(rows_s, prices[saved["small"]]), costs(rows_l, prices[saved["large"]])


def escalated(confidence: np.ndarray, rate: float) -> np.ndarray:
    """A mask of the round(rate·n) least confident questions (ties in question order)."""
    order = np.argsort(confidence, kind="stable")
    mask = np.zeros(len(confidence), dtype=bool)
    mask[order[: int(round(rate * len(confidence)))]] = True
    return mask


def point(mask: np.ndarray, weak: np.ndarray, strong: np.ndarray, picks: np.ndarray) -> dict[str, float]:
    """Accuracy with its interval, and paired differences (same resampled questions) against the large model
    alone, the small one alone and random escalation's expected accuracy at the same share."""
    correct = np.where(mask, strong, weak)
    rate = mask.mean()
    low, high = interval(correct[picks].mean(axis=1))
    result = {"accuracy": float(correct.mean()), "low": low, "high": high}
    for name, other in (("large", strong), ("small", weak), ("random", (1 - rate) * weak + rate * strong)):
        gain = (correct - other)[picks].mean(axis=1)
        result |= {f"vs_{name}": float((correct - other).mean()), f"vs_{name}_low": interval(gain)[0],
                   f"vs_{name}_high": interval(gain)[1]}  # fmt: skip
    return result


def evaluate(
    saved: dict[str, Any], questions: list[dict], transfer: bool = False, threshold: float | None = None
) -> dict[str, Any]:
    """The curves; `transfer`: the learned confidence is the one fit on TriviaQA, never on this set, and
    `threshold` the gateway's fixed operating point for it (escalate when P(small correct) < threshold)."""
    small = saved["answers"][saved["small"]]
    rows_s, weak, strong, cost_s, cost_l = outcomes(saved, questions)
    confidence = {
        "mean_logprob": np.array([mean_logprob(r["logprobs"]) for r in rows_s]),
        **(
            {"learned (fit on TriviaQA)": transferred(questions, small)}
            if transfer
            else {"learned (leave-one-site-out)": leave_one_site_out(questions, small)}
        ),  # fmt: skip
    }
    picks = np.random.default_rng(0).integers(0, len(weak), size=(SAMPLES, len(weak)))
    rng = np.random.default_rng(1)
    table: dict[str, list[dict]] = {}
    for name, score in confidence.items():
        table[name] = []
        for rate in RATES:
            mask = escalated(score, rate)
            cost = (cost_s.sum() + cost_l[mask].sum()) / cost_l.sum()
            table[name].append({"rate": rate, "cost": float(cost), **point(mask, weak, strong, picks)})
    table["random"] = [_random_point(rate, weak, strong, cost_s, cost_l, rng) for rate in RATES]
    summary = {name: _apgr(score, weak, strong) for name, score in confidence.items()}
    summary["random"] = dict(
        zip(("apgr", "low", "high"), (0.5, *interval(random_apgr(weak, strong, SAMPLES))), strict=True)
    )
    for name, score in confidence.items():
        replicates = [_auroc(score[p], weak[p]) for p in picks[:300]]
        summary[name] |= {"auroc": _auroc(score, weak), "auroc_interval": interval(np.array(replicates))}
    result = {"questions": len(weak), "small_accuracy": float(weak.mean()), "large_accuracy": float(strong.mean()),
              "small_cost_share": float(cost_s.sum() / cost_l.sum()), "seconds": saved.get("seconds"),
              "disagreements": {"small_wrong_large_right": int(((1 - weak) * strong).sum()),
                                "small_right_large_wrong": int((weak * (1 - strong)).sum())},
              "curves": table, "summary": summary, "operating_points": _targets(table, strong.mean())}  # fmt: skip
    if transfer and threshold is not None:
        mask = confidence["learned (fit on TriviaQA)"] < threshold
        cost = (cost_s.sum() + cost_l[mask].sum()) / cost_l.sum()
        result["threshold_point"] = {"threshold": threshold, "rate": float(mask.mean()), "cost": float(cost),
                                     **point(mask, weak, strong, picks)}  # fmt: skip
    print_result(result)
    return result


def _random_point(rate: float, weak: np.ndarray, strong: np.ndarray, cost_s: np.ndarray, cost_l: np.ndarray,
                  rng: np.random.Generator) -> dict[str, float]:  # fmt: skip
    accuracies = [
        np.where(escalated(rng.random(len(weak)), rate), strong, weak).mean() for _ in range(SAMPLES)
    ]
    low, high = interval(np.array(accuracies))
    expected = (1 - rate) * weak.mean() + rate * strong.mean()
    cost = (cost_s.sum() + rate * cost_l.sum()) / cost_l.sum()
    return {"rate": rate, "cost": float(cost), "accuracy": float(expected), "low": low, "high": high}


def _apgr(score: np.ndarray, weak: np.ndarray, strong: np.ndarray) -> dict[str, float]:
    apgr = routing_curve(-score, weak, strong).apgr()
    low, high = interval(bootstrap_apgr(-score, weak, strong, samples=300))
    return {"apgr": apgr, "low": low, "high": high}


def _auroc(score: np.ndarray, labels: np.ndarray) -> float:
    """P(a correct small answer scores above a wrong one), ties half."""
    ranks = np.argsort(np.argsort(score, kind="stable"), kind="stable") + 1.0
    positives = labels.sum()
    return float(
        (ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * (len(labels) - positives))
    )


def _targets(table: dict[str, list[dict]], large_accuracy: float) -> dict[str, dict]:
    """Per method: the cheapest grid point at or above the large model's accuracy, and the best point."""
    out = {}
    for name, points in table.items():
        if name == "random":
            continue
        matching = [p for p in points if p["accuracy"] >= large_accuracy and p["rate"] < 1.0]
        beating = [p for p in points if p["vs_large"] > 0 and p["vs_small"] > 0]
        out[name] = {"cheapest_matching_large": min(matching, key=lambda p: p["cost"]) if matching else None,
                     "best": max(points, key=lambda p: p["accuracy"]),
                     "beats_both_at": [p["rate"] for p in beating]}  # fmt: skip
    return out


def print_result(result: dict[str, Any]) -> None:
    print(f"\n{result['questions']} questions: SmolLM2 {result['small_accuracy']:.3f}, Gemma {result['large_accuracy']:.3f}"
          f" correct; {result['disagreements']}; small attempt = {result['small_cost_share']:.3f} of Gemma's cost")  # fmt: skip
    names = list(result["curves"])
    print("escalated  " + "  ".join(f"{n[:26]:>30}" for n in names))
    for i, rate in enumerate(RATES):
        cells = [result["curves"][n][i] for n in names]
        print(f"{rate:>8.0%}   " + "  ".join(
            f"{c['accuracy']:.3f} [{c['low']:.3f},{c['high']:.3f}] ${c['cost']:.2f}" for c in cells))  # fmt: skip
    print("\npaired gain over random escalation at the same share [95 %]:")
    for i, rate in enumerate(RATES[1:-1], start=1):
        cells = [result["curves"][n][i] for n in names if n != "random"]
        print(f"{rate:>8.0%}   " + "  ".join(
            f"{c['vs_random']:+.3f} [{c['vs_random_low']:+.3f},{c['vs_random_high']:+.3f}]" for c in cells))  # fmt: skip
    print("\ncost = share of Gemma-only cost; APGR [95 %] / AUROC:")
    for name, s in result["summary"].items():
        print(
            f"  {name:32} APGR {s['apgr']:.3f} [{s['low']:.3f}, {s['high']:.3f}]"
            + (
                f"  AUROC {s['auroc']:.3f} [{s['auroc_interval'][0]:.3f}, {s['auroc_interval'][1]:.3f}]"
                if "auroc" in s
                else ""
            )
        )
    if fixed := result.get("threshold_point"):
        print(f"  the gateway's threshold {fixed['threshold']}: {fixed['rate']:.1%} escalated, accuracy "
              f"{fixed['accuracy']:.4f} [{fixed['low']:.3f}, {fixed['high']:.3f}] at cost {fixed['cost']:.2f}; vs Gemma "
              f"{fixed['vs_large']:+.4f} [{fixed['vs_large_low']:+.3f}, {fixed['vs_large_high']:+.3f}], vs random "
              f"{fixed['vs_random']:+.4f} [{fixed['vs_random_low']:+.3f}, {fixed['vs_random_high']:+.3f}]")  # fmt: skip
    for name, t in result["operating_points"].items():
        print(f"  {name}: cheapest point >= Gemma: {t['cheapest_matching_large']}; best: {t['best']}")
