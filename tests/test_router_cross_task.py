"""The cross-task router: text features, the TextRouter file format, selection by held-out groups."""

import asyncio

import numpy as np
import pytest

from bench.cascade_eval import RouterFiles
from bench.lib.cross_task import candidate_rows
from bench.lib.router_selection import (
    LENGTH_HEURISTIC,
    UNSEEN,
    Candidate,
    TaskData,
    add_unseen_scores,
    choose,
    heldout_apgr,
    logo_scores,
    select,
    strong_need,
    task_sets,
    train_candidate,
)
from bench.lib.routing_curves import bootstrap_apgr, interval, random_apgr, routing_curve
from routing.confidence import Learned
from routing.config import MODELS_DIR
from routing.features import MULTIPLE_CHOICE_FEATURES, TEXT_FEATURES, text_features
from routing.learned import TextRouter, load_model


def test_text_features_measure_length_numbers_and_code() -> None:
    rows = text_features(
        ["Hi.", "Compute 12 * 7 + 3 = ? Then solve x^2 = 49.", "def f():\n    return {1: 2};"]
    )
    names = {name: rows[:, i] for i, name in enumerate(TEXT_FEATURES)}
    assert rows.shape == (3, len(TEXT_FEATURES)) and rows.dtype == np.float32
    assert names["log_chars"][1] > names["log_chars"][0]
    assert names["log_numbers"][1] > 0 == names["log_numbers"][0]
    assert names["log_math_symbols"][1] > names["log_math_symbols"][0]
    assert names["log_code_markers"][2] > names["log_code_markers"][1]
    assert names["log_lines"][2] > 0 and text_features([]).shape == (0, len(TEXT_FEATURES))


def test_text_features_mark_open_writing_explanations_and_questions() -> None:
    rows = text_features(["Write a short poem about the sea.", "Why is the sky blue? Explain.", "2 + 2"])
    names = {name: rows[:, i] for i, name in enumerate(TEXT_FEATURES)}
    assert names["log_creative_words"].tolist()[0] > 0 == names["log_creative_words"][2]
    assert names["log_explain_words"][1] > names["log_explain_words"][0] == 0
    assert names["log_question_marks"][1] > 0 == names["log_question_marks"][2]


def test_multiple_choice_features_read_parts_negation_catch_all_and_options() -> None:
    mc = "Statement 1 | A group is abelian. Statement 2 | Rings are fields.\nA. True, True\nB. False, False"
    texts = [mc, "Which is NOT a mammal?\nA. 12\nB. 7.5\nC. none of the above\nD. 3", "Tell me a joke."]
    rows = text_features(texts)
    names = {name: rows[:, i] for i, name in enumerate(TEXT_FEATURES)}
    assert names["log_parts"][0] > 0 == names["log_parts"][1] == names["log_parts"][2]
    assert names["log_negation"][1] > 0 == names["log_negation"][0]
    assert names["catch_all_option"].tolist() == [0.0, 1.0, 0.0]
    assert names["numeric_option_share"].tolist() == [0.0, 0.75, 0.0]
    assert names["log_option_chars"][0] > names["log_option_chars"][1] > 0 == names["log_option_chars"][2]


def test_choose_by_mean_or_by_the_worst_margin_over_length() -> None:
    length = LENGTH_HEURISTIC.name
    apgr = {
        length: {"a": 0.55, "b": 0.55, UNSEEN: 0.55},
        "spiky": {"a": 0.80, "b": 0.50, UNSEEN: 0.70},  # best mean, loses to length on b
        "steady": {"a": 0.57, "b": 0.56, UNSEEN: 0.40},  # beats length on both groups, not on UNSEEN
    }
    assert choose(apgr) == "spiky"  # mean over the MMLU groups; UNSEEN takes no part
    assert choose(apgr, leave_out="a") == "steady"
    assert choose(apgr, rule="maximin") == length  # nothing beats length on every task
    assert choose(apgr, leave_out=UNSEEN, rule="maximin") == "steady"
    with pytest.raises(ValueError):
        choose(apgr, rule="best")


def test_candidate_rows_score_every_candidate_on_the_groups_and_the_other_task() -> None:
    data, other = _synthetic(400), _synthetic(200, seed=1)
    good, length = Candidate("all", "none", 0, "weak", 1.0), LENGTH_HEURISTIC
    heldout = logo_scores(data, [good, length])
    add_unseen_scores(heldout, data, other, [good, length])
    rows = {r["candidate"]: r for r in candidate_rows(heldout, task_sets(data, other), samples=50)}
    assert rows[good.name]["mmlu_mean"] > 0.6 and rows[good.name][UNSEEN] > 0.6  # feature 0 carries
    low, high = rows[good.name]["mmlu_mean_ci"]
    assert low < rows[good.name]["mmlu_mean"] < high and len(rows[good.name][f"{UNSEEN}_ci"]) == 2
    assert set(rows[length.name]) >= {"a", "b", "c", "d", UNSEEN}


def test_the_within_head_learns_the_within_subject_effect_not_the_subject_confound() -> None:
    """Inside each subject a higher feature 0 means more gain; across subjects the one with higher values
    gains less. The within head ranks by the first, the plain gain head is misled by the second."""
    rng = np.random.default_rng(3)
    n = 1200
    subject = np.repeat(np.array(["s0", "s1", "s2"]), n // 3)
    offset = np.select([subject == "s1", subject == "s2"], [3.0, 6.0], 0.0)
    within = rng.normal(size=n)
    text = rng.normal(size=(n, len(TEXT_FEATURES))).astype(np.float32)
    text[:, 0] = within + offset
    p_gain = 1 / (1 + np.exp(-(2 * within - offset)))
    strong = (rng.random(n) < 0.5 + 0.45 * p_gain).astype(float)
    weak = (rng.random(n) < 0.5 - 0.45 * p_gain).astype(float)
    data = TaskData(text, np.zeros((n, 1), np.float32), weak, strong, subject, subject)
    test = data.take(subject == "s0")
    apgr, routers = {}, {}
    for head in ("within", "gain"):
        routers[head] = train_candidate(Candidate("all", "none", 0, head, 1.0), data.take(subject != "s0"))
        apgr[head] = routing_curve(strong_need(routers[head], test), test.weak, test.strong).apgr()
    assert apgr["within"] > 0.6 > apgr["gain"]
    within = routers["within"]
    confidence = within.head.confidence(within.design(test.text, test.emb))  # P(no gain): a probability
    assert confidence.min() > 0.0 and confidence.max() < 1.0


def test_a_tagged_study_never_overwrites_the_shipped_router() -> None:
    shipped, study = RouterFiles(), RouterFiles("full-text-mean")
    assert shipped.router == MODELS_DIR / "router_lr.npz" and shipped.replay_mode == "replay"
    assert study.router.parent.name == "results" and study.router.name == "router_lr-full-text-mean.npz"
    assert study.logo != shipped.logo and study.selection.name == "router_selection-full-text-mean.json"


def _synthetic(n: int = 800, seed: int = 0) -> TaskData:
    """Four groups; the strong model gains exactly where text feature 0 is high."""
    rng = np.random.default_rng(seed)
    text = rng.normal(size=(n, len(TEXT_FEATURES))).astype(np.float32)
    emb = rng.normal(size=(n, 16)).astype(np.float32)
    hard = text[:, 0] + 0.3 * rng.normal(size=n) > 0
    weak = np.where(hard, rng.random(n) < 0.2, rng.random(n) < 0.9).astype(float)
    strong = np.where(hard, rng.random(n) < 0.9, rng.random(n) < 0.9).astype(float)
    return TaskData(text, emb, weak, strong, np.array(["a", "b", "c", "d"] * (n // 4)))


def test_a_router_on_the_informative_feature_beats_random_on_a_held_out_group() -> None:
    data = _synthetic()
    good = Candidate("all", "none", 0, "weak", 1.0)
    assert heldout_apgr(good, data, "a") > 0.6  # random: 0.5
    blind = Candidate("off", "pca", 4, "weak", 1.0)  # the embedding is noise here
    assert heldout_apgr(blind, data, "a") < heldout_apgr(good, data, "a")
    chosen, scores = select(data, [good, blind])
    assert chosen == good and set(scores) == {good.name, blind.name}


def test_text_router_round_trips_and_scores_text(tmp_path) -> None:  # noqa: ANN001
    data = _synthetic()
    router = train_candidate(Candidate("all", "pca", 4, "gain", 0.1), data)
    router.save(tmp_path / "r.npz")
    loaded = load_model(tmp_path / "r.npz")
    assert (
        isinstance(loaded, TextRouter)
        and loaded.embedding == "pca"
        and len(loaded.text_columns) == len(TEXT_FEATURES) - len(MULTIPLE_CHOICE_FEATURES)
    )
    np.testing.assert_allclose(strong_need(loaded, data), strong_need(router, data), rtol=1e-4, atol=1e-5)
    texts = ["a short one", "Compute 3 * 4 + 5."]
    emb = np.zeros((2, 16), np.float32)
    assert loaded.confidence(emb, texts=texts).shape == (2,)
    with pytest.raises(ValueError):
        loaded.confidence(emb)


def test_shipped_router_is_small_and_serves_through_the_learned_scorer() -> None:
    path = MODELS_DIR / "router_lr.npz"
    assert path.stat().st_size < 200_000
    router = load_model(path)
    assert isinstance(router, TextRouter)

    class Embedder:
        def encode(self, texts: list[str]) -> np.ndarray:
            vectors = np.ones((len(texts), router.center.shape[0]), np.float32)
            return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    scorer = Learned(router, Embedder())
    assert not scorer.needs_answer
    score = asyncio.run(scorer.score("What is 17 * 23? Show each step.", []))
    assert -1.0 <= score <= 1.0


def test_bootstrap_intervals_cover_the_estimate_and_random_centres_on_one_half() -> None:
    data = _synthetic(400)
    need = data.text[:, 0]
    low, high = interval(bootstrap_apgr(need, data.weak, data.strong, samples=200))
    from bench.lib.routing_curves import routing_curve

    assert low < routing_curve(need, data.weak, data.strong).apgr() < high
    spread = random_apgr(data.weak, data.strong, samples=200)
    assert abs(float(np.mean(spread)) - 0.5) < 0.03


def test_the_gsm8k_records_load_as_a_third_task() -> None:
    from bench.lib.routellm_data import load_gsm8k

    records = load_gsm8k()
    assert len(records.prompts) == 1307 and len(set(records.prompts)) > 1300  # 1319 less 12 contaminated
    assert set(np.unique(records.weak)) <= {0.0, 1.0} and set(np.unique(records.strong)) <= {0.0, 1.0}
    assert 0.6 < records.weak.mean() < records.strong.mean() < 0.9  # Mixtral 0.637, GPT-4 0.858


def test_the_replay_table_scores_the_shipped_router_on_gsm8k_beside_both_baselines() -> None:
    from bench.lib.routellm_gsm8k import gsm8k_rows

    rows = {row["router"]: row for row in gsm8k_rows()}
    assert list(rows) == ["random", "length heuristic", "shipped router"]
    assert rows["random"]["apgr"] == 0.5 and rows["length heuristic"]["apgr"] == pytest.approx(
        0.598, abs=1e-3
    )
    assert (
        rows["shipped router"]["ci_low"] < rows["shipped router"]["apgr"] < rows["shipped router"]["ci_high"]
    )
