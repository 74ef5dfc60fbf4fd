"""Train the shipped cascade confidence: P(SmolLM2's answer is correct) from the answer's own signals.

    .venv/bin/python -m training.train_cascade_confidence           # → routing/models/cascade_confidence.npz
    .venv/bin/python -m training.train_cascade_confidence --out P   # the same fit, written to P instead
    .venv/bin/python -m training.train_cascade_confidence --cross   # fit on one recorded set, AUROC on the other
    .venv/bin/python -m training.train_cascade_confidence --sets    # every recorded set held out in turn

Reads the live record (bench/results/cascade_live_record.json, made by `bench.cascade_eval live`), takes
the answer's own token signals from routing.learned.answer_features (COLUMNS: mean/min token logprob, the
first token's logprob and top-1 − top-2 margin, the mean margin) and fits an L2 logistic regression (C = 1,
fixed: nothing is tuned; the features and the fit are bench/lib/cascade_common.py's, which the benchmarks share). The shipped file is fit on every question; the figures in studies/README.md come from
the same fit done leave-one-quiz-site-out (bench/lib/cascade_curves.py), so no question is scored by a model that
saw its site, and from the TriviaQA fit scored unchanged on basic_skills.

Answer and prompt length, the other two answer_features, are left out since the ninth session: they describe
a task's prompt and answer format, not the answer's quality, and the model that used them ranked SmolLM2's
basic_skills answers backwards (AUROC 0.438, studies/README.md).
"""

import argparse
import json
from pathlib import Path

import numpy as np

from bench.lib.cascade_common import (
    COLUMNS,
    C,
    design,
    family,
    fit,
    fit_answer_model,
    leave_one_site_out,
    load_record,
    record_path,
    transferred,
)
from bench.lib.routellm_data import RESULTS
from bench.lib.trivia_data import SETS, load_questions
from routing.config import MODELS_DIR
from routing.learned import ANSWER_FEATURES

MODEL_PATH = MODELS_DIR / "cascade_confidence.npz"


def cross_sets() -> None:
    """AUROC for "the small answer is right" on each recorded set, fit on the other one: the shipped columns,
    all seven answer_features, and the unfitted mean logprob."""
    from sklearn.metrics import roc_auc_score

    sets = {}
    for name in ("trivia_qa", "basic_skills"):
        saved = load_record(name)
        sets[name] = (load_questions(name), saved["answers"][saved["small"]])
    for train, test in (("trivia_qa", "basic_skills"), ("basic_skills", "trivia_qa")):
        row = []
        for label, columns in (("shipped columns", COLUMNS), ("all seven", ANSWER_FEATURES)):
            x, y = design(*sets[train], columns)
            x_test, y_test = design(*sets[test], columns)
            row.append(
                f"{label} {roc_auc_score(y_test, fit(x, y, c=C, uses_logprobs=True).predict(x_test)):.3f}"
            )
        x_test, y_test = design(*sets[test], ("mean",))
        row.append(f"mean logprob {roc_auc_score(y_test, x_test[:, 0]):.3f}")
        print(f"fit on {train}, scored on {test}: " + ", ".join(row))


def leave_one_set_out(per_set: int = 400, samples: int = 1000) -> dict:
    """AUROC for "the small answer is right" on each recorded set: the shipped model (fit on TriviaQA; on TriviaQA
    itself leave-one-quiz-site-out), a model fit on the other sources (`per_set` answers of each, so no set outweighs the rest; nothing of the held-out
    set's source), and the unfitted mean logprob; bootstrap 95 % intervals over the held-out questions."""
    from sklearn.metrics import roc_auc_score

    names = [n for n in SETS if record_path(n).exists()]
    data = {}
    for name in names:
        saved, questions = load_record(name), load_questions(name)
        answers = saved["answers"][saved["small"]]
        x, y = design(questions, answers)
        shipped = (
            leave_one_site_out(questions, answers) if name == "trivia_qa" else transferred(questions, answers)
        )
        data[name] = (x, y, design(questions, answers, ("mean",))[0][:, 0], shipped)
    rng, result = np.random.default_rng(0), {}
    for name in names:
        x, y, mean, shipped = data[name]
        train = [k for k in names if family(k) != family(name)]
        picks = [rng.permutation(len(data[k][1]))[:per_set] for k in train]
        pooled = fit_answer_model(np.concatenate([data[k][0][p] for k, p in zip(train, picks, strict=True)]),
                                  np.concatenate([data[k][1][p] for k, p in zip(train, picks, strict=True)]))  # fmt: skip
        scores = {
            "shipped (TriviaQA)": shipped,
            "other sources": pooled.head.predict(x),
            "mean logprob": mean,
        }
        draws = [d for d in rng.integers(0, len(y), size=(samples, len(y))) if 0 < y[d].mean() < 1]
        result[name] = {"questions": len(y), "accuracy": round(float(y.mean()), 4), "trained_on": train} | {
            label: [round(roc_auc_score(y, v), 4)]
            + np.round(np.percentile([roc_auc_score(y[d], v[d]) for d in draws], [2.5, 97.5]), 4).tolist()
            for label, v in scores.items()
        }
    print(f"{'held out':18} {'n':>5} {'right':>6} " + " ".join(f"{k:>24}" for k in scores))
    for name, row in result.items():
        cells = [f"{row[k][0]:.3f} [{row[k][1]:.3f}, {row[k][2]:.3f}]" for k in scores]
        print(
            f"{name:18} {row['questions']:>5} {row['accuracy']:>6.3f} " + " ".join(f"{c:>24}" for c in cells)
        )
    (RESULTS / "cascade_confidence_sets.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=MODEL_PATH, help="where to write the model (shipped: default)"
    )
    parser.add_argument("--cross", action="store_true", help="cross-set AUROC only; the model is not written")
    parser.add_argument(
        "--sets", action="store_true", help="each recorded set held out; the model is not written"
    )
    args = parser.parse_args(argv)
    if args.cross:
        cross_sets()
        return
    if args.sets:
        leave_one_set_out()
        return
    saved = load_record()
    questions = load_questions()
    x, y = design(questions, saved["answers"][saved["small"]])
    model = fit_answer_model(x, y)
    model.save(args.out)
    weights = dict(zip(COLUMNS, np.round(model.head.weights.astype(float), 3).tolist(), strict=True))
    print(f"fit on {len(y)} answers ({int(y.sum())} correct); standardised weights {weights}")
    print(f"saved {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
