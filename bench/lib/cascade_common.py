"""Helpers shared by the cascade and router benchmarks and their builders in training/: fitting, the live
record, the cascade confidence's features and fit, results.

A leaf of bench/ (issue 42): it imports only bench's data leaves (routellm_data, trivia_data), so
cascade_eval, cascade_live, cascade_curves and cascade_alias (and training/'s train_cascade_confidence and
train_router), which used to import each other in a circle, all import from here instead.
"""

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.routellm_data import RESULTS
from bench.lib.trivia_data import group, is_correct, load_questions, prompt
from routing.config import ConfidenceConfig
from routing.escalation import EscalationShare
from routing.learned import ANSWER_FEATURES, AnswerModel, LogisticModel, answer_features

RECORD = RESULTS / "cascade_live_record.json"


def fit(features: np.ndarray, labels: np.ndarray, c: float, uses_logprobs: bool) -> LogisticModel:
    """Standardise, then L2-regularised logistic regression predicting labels == 1 (small is good)."""
    mean = features.mean(axis=0)
    scale = features.std(axis=0) + 1e-6
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=c, max_iter=2000).fit((features - mean) / scale, labels)
    return LogisticModel(
        model.coef_[0].astype(np.float32), float(model.intercept_[0]), mean, scale, uses_logprobs
    )


def fit_within_subject(
    features: np.ndarray, weak: np.ndarray, strong: np.ndarray, subjects: np.ndarray, c: float
) -> LogisticModel:
    """The gain (strong − weak) fitted on within-subject differences only: features and gains centred per
    subject, ridge (alpha = 1/c), so between-subject differences (what an embedding learns) take no part.
    Stored as a LogisticModel for P(the weak answer is good enough): a 1-d logistic fit of "escalating
    would not gain" on the gain score sets its scale and bias (scale forced negative: more gain, less
    confidence), so the ranking is the gain score's."""
    from sklearn.linear_model import LogisticRegression, Ridge

    mean = features.mean(axis=0)
    scale = features.std(axis=0) + 1e-6
    z = (features - mean) / scale
    gain = strong - weak
    z_within, gain_within = z.copy(), gain.astype(np.float64).copy()
    for subject in np.unique(subjects):
        rows = subjects == subject
        z_within[rows] -= z[rows].mean(axis=0)
        gain_within[rows] -= gain[rows].mean()
    coef = Ridge(alpha=1.0 / c, fit_intercept=False).fit(z_within, gain_within).coef_
    score = z @ coef
    calib = LogisticRegression(max_iter=1000).fit(score[:, None] / (score.std() + 1e-9), gain <= 0)
    slope = min(float(calib.coef_[0, 0]), -1e-3) / (score.std() + 1e-9)
    return LogisticModel((coef * slope).astype(np.float32), float(calib.intercept_[0]), mean, scale, False)


def embed_minilm(prompts: list[str]) -> np.ndarray:
    """The serving encoder's sentence vectors (cache/encoder.py: MiniLM, first 128 tokens, ONNX when
    available), so a router trained here sees the embeddings the gateway computes. Cached by the caller."""
    from cache.encoder import build_encoder

    print(f"embedding {len(prompts)} prompts with MiniLM (cached afterwards)...", file=sys.stderr)
    encoder = build_encoder(None, threads=min(os.cpu_count() or 1, 2))
    batches = [encoder.vectors(prompts[i : i + 32]) for i in range(0, len(prompts), 32)]
    return np.concatenate(batches) if batches else np.zeros((0, encoder.dim), np.float32)


def write(mode: str, payload: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"cascade_eval_{mode}.json"
    path.write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {path}")


def write_live(result: dict) -> None:
    """bench/results/cascade_eval_live.json for TriviaQA, cascade_eval_live_<set>.json for the others."""
    write("live" if result.get("set", "trivia_qa") == "trivia_qa" else f"live_{result['set']}", result)


def record_path(name: str = "trivia_qa") -> Path:
    """The live record of a question set (TriviaQA keeps the original file name)."""
    return RECORD if name == "trivia_qa" else RESULTS / f"cascade_live_record_{name}.json"


def load_record(name: str = "trivia_qa") -> dict[str, Any]:
    """The saved record, each answer re-graded by the current checker (the grading is not frozen in it)."""
    saved = json.loads(record_path(name).read_text())
    questions = {q["id"]: q for q in load_questions(name)}
    for answers in saved["answers"].values():
        for qid, answer in answers.items():
            answer["correct"] = is_correct(questions[qid], answer["text"])
    return saved


def escalations(scores: np.ndarray, rule: ConfidenceConfig) -> np.ndarray:
    """The gateway's decisions on `scores` in the order given: True where the cascade escalates. With
    `escalate_share`, the threshold is decided before each score joins the window, as in routing/cascade.py."""
    window = None
    if rule.escalate_share is not None:
        window = EscalationShare(rule.escalate_share, rule.share_window, rule.share_warmup, rule.threshold)
    mask = np.zeros(len(scores), dtype=bool)
    for i, value in enumerate(scores):
        mask[i] = value < (rule.threshold if window is None else window.threshold())
        if window is not None:
            window.record(float(value))
    return mask


# The cascade confidence (routing/models/cascade_confidence.npz): its features and fit, shared by its
# builder (training/train_cascade_confidence.py) and the benchmarks that score it without saving it.
C = 1.0  # the cascade confidence's regularisation (fixed: nothing is tuned)
COLUMNS = ("mean", "min", "first", "first_margin", "mean_margin")


def design(
    questions: list[dict], answers: dict[str, dict], columns: tuple[str, ...] = COLUMNS
) -> tuple[np.ndarray, np.ndarray]:
    """Features (COLUMNS) and labels (small answer correct) for the questions, from the small model's answers."""
    rows = [answers[q["id"]] for q in questions]
    x = np.stack(
        [
            answer_features(prompt(q), r["logprobs"], r["margins"])
            for q, r in zip(questions, rows, strict=True)
        ]
    )
    index = [ANSWER_FEATURES.index(name) for name in columns]
    return x[:, index].astype(np.float64), np.array([r["correct"] for r in rows], dtype=float)


def fit_answer_model(x: np.ndarray, y: np.ndarray) -> AnswerModel:
    return AnswerModel(fit(x, y, c=C, uses_logprobs=True), columns=COLUMNS)


def leave_one_site_out(questions: list[dict], answers: dict[str, dict]) -> np.ndarray:
    """P(small correct) for every question from a model trained on the other quiz sites only."""
    x, y = design(questions, answers)
    sites = np.array([group(q) for q in questions])
    scores = np.zeros(len(y))
    for site in np.unique(sites):
        held = sites == site
        model = fit_answer_model(x[~held], y[~held])
        scores[held] = model.head.predict(x[held])
    return scores


def transferred(questions: list[dict], answers: dict[str, dict]) -> np.ndarray:
    """P(small correct) from the model fit on every TriviaQA answer: a set it never saw is scored unchanged."""
    x, _ = design(questions, answers)
    saved = load_record("trivia_qa")
    trivia = load_questions("trivia_qa")
    return fit_answer_model(*design(trivia, saved["answers"][saved["small"]])).head.predict(x)


def family(name: str) -> str:
    """Sets drawn from one source count as one when held out (basic_skills, 2 and 3: AllenAI's basic skills)."""
    return name.rstrip("0123456789")
