"""A fixed confidence threshold against `escalate_share`, replayed on the four recorded live cascades.

    .venv/bin/python -m studies.cascade_share        # → table, studies/results/cascade_share.json

The gateway's `auto` cascade (bench/cascade_live.yaml) escalates when the shipped learned confidence (fit on
TriviaQA) is below 0.08. Its share of escalations, and so its cost, depends on the traffic. With
`confidence.escalate_share` the threshold is that quantile of the last `share_window` scores
(routing/escalation.py, the class the gateway runs). Each recorded set (SmolLM2 → Gemma 3 answers through the
gateway) is replayed in 20 seeded random orders, question by question. The threshold is decided before each
score joins the window, as in the gateway. Reported: the share escalated (of all questions, and of those
after the first `share_warmup`, which the fixed threshold decides), accuracy and cost (Gemma alone = 1), mean
and [min, max] over the orders. A last row replays the four sets one after another, as traffic
that changes kind, with a 500-score window.
"""

import json
import sys

import numpy as np

from bench.lib.cascade_common import escalations, transferred
from bench.lib.cascade_curves import outcomes
from bench.lib.cascade_live import learned_threshold, load_record
from bench.lib.trivia_data import load_questions
from routing.config import ConfidenceConfig
from studies import RESULTS

SETS = ("trivia_qa", "entity_questions", "basic_skills", "lambada")
SHARES = (0.2, 0.4, 0.6)
ORDERS = 20


def load(name: str) -> dict[str, np.ndarray]:
    """Per question: the shipped confidence, both models' correctness and costs."""
    saved, questions = load_record(name), load_questions(name)
    _, weak, strong, cost_s, cost_l = outcomes(saved, questions)
    score = transferred(questions, saved["answers"][saved["small"]])  # TriviaQA: the set the model was fit on
    return {"score": score, "weak": weak, "strong": strong, "cost_s": cost_s, "cost_l": cost_l}


def replay(data: dict[str, np.ndarray], order: np.ndarray, share: float | None, fixed: float) -> dict:
    """Escalation decisions in `order`; `share` None is the fixed threshold."""
    rule = ConfidenceConfig(method="learned", threshold=fixed, escalate_share=share)
    mask = np.zeros(len(order), dtype=bool)
    mask[order] = escalations(data["score"][order], rule)
    correct = np.where(mask, data["strong"], data["weak"])
    cost = (data["cost_s"].sum() + data["cost_l"][mask].sum()) / data["cost_l"].sum()
    after = mask[order][rule.share_warmup :].mean()  # once the window, not `fixed`, decides
    return {"share": float(mask.mean()), "after_warmup": float(after), "accuracy": float(correct.mean()),
            "cost": float(cost)}  # fmt: skip


def summarise(runs: list[dict]) -> dict:
    return {k: [float(np.mean([r[k] for r in runs])), float(min(r[k] for r in runs)),
                float(max(r[k] for r in runs))] for k in ("share", "after_warmup", "accuracy", "cost")}  # fmt: skip


def main() -> dict:
    fixed = learned_threshold("bench/cascade_live.yaml") or 0.08
    sets = {name: load(name) for name in SETS}
    sets["all four, one after another"] = {
        k: np.concatenate([sets[n][k] for n in SETS]) for k in sets[SETS[0]]
    }
    bounds = np.cumsum([0] + [len(sets[n]["score"]) for n in SETS])
    result: dict = {"fixed_threshold": fixed, "orders": ORDERS, "rows": {}}
    print(f"{'set':28} {'rule':22} {'escalated':>21} {'after warm-up':>21} {'accuracy':>21} {'cost':>21}")
    for name, data in sets.items():
        rng = np.random.default_rng(0)
        if name in SETS:
            orders = [rng.permutation(len(data["score"])) for _ in range(ORDERS)]
        else:  # each set's questions shuffled within the set, the sets in sequence
            spans = list(zip(bounds[:-1], bounds[1:], strict=True))
            orders = [
                np.concatenate([lo + rng.permutation(hi - lo) for lo, hi in spans]) for _ in range(ORDERS)
            ]
        rows = {"fixed": summarise([replay(data, o, None, fixed) for o in orders])}
        for share in SHARES:
            rows[f"share {share:.1f}"] = summarise([replay(data, o, share, fixed) for o in orders])
        rows["models alone"] = {"small_accuracy": float(data["weak"].mean()),
                                "large_accuracy": float(data["strong"].mean())}  # fmt: skip
        result["rows"][name] = rows
        for rule, row in rows.items():
            if rule == "models alone":
                continue
            label = f"threshold {fixed}" if rule == "fixed" else f"escalate_share {rule[6:]}"
            cells = [f"{row[k][0]:.3f} [{row[k][1]:.3f},{row[k][2]:.3f}]"
                     for k in ("share", "after_warmup", "accuracy", "cost")]  # fmt: skip
            print(f"{name:28} {label:22} " + " ".join(f"{c:>21}" for c in cells))
        print(f"{'':28} {'SmolLM2 / Gemma alone':22} {'':>43} "
              f"{rows['models alone']['small_accuracy']:.3f} / {rows['models alone']['large_accuracy']:.3f}")  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "cascade_share.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
