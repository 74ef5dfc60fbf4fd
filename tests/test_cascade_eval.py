"""The evaluation's arithmetic (curves, APGR, CPT, escalation), the TriviaQA checker and question set."""

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bench.lib.cascade_curves import escalated, point
from bench.lib.routing_curves import oracle_scores, random_curve, routing_curve
from bench.lib.trivia_data import COMPLETION_SHOTS, group, is_correct, load_questions, normalise, prompt
from routing.confidence import choice_margins, mean_logprob, min_window
from routing.learned import (
    ANSWER_FEATURES,
    AnswerModel,
    GainModel,
    LogisticModel,
    answer_features,
    load_model,
    logprob_features,
)


def test_question_set_is_large_public_and_grouped_by_quiz_site() -> None:
    questions = load_questions()
    sites = Counter(group(q) for q in questions)
    assert len(questions) >= 300 and len({q["id"] for q in questions}) == len(questions)
    assert len(sites) >= 10 and max(sites.values()) < 0.3 * len(questions)
    assert all(q["aliases"] and q["question"] for q in questions)


@pytest.mark.parametrize(
    ("aliases", "text", "ok"),
    [
        (["paris"], " Paris", True),
        (["paris"], " The city of Paris, France.", True),
        (["henry campbell bannerman", "campbell bannerman"], " Campbell-Bannerman", True),
        (["rome"], " Romania", False),  # whole words only
        (["paris"], " London\nParis", False),  # only the first line counts
        (["paris"], "", False),
    ],
)
def test_answer_checker(aliases: list[str], text: str, ok: bool) -> None:
    assert is_correct({"aliases": aliases}, text) is ok


def test_trivia_prompt_is_the_recorded_three_shot_q_a() -> None:
    expected = (
        "Q: What is the capital of France?\nA: Paris\n\nQ: Which planet is known as the Red Planet?\nA: Mars\n\n"
        "Q: Who wrote the play Romeo and Juliet?\nA: William Shakespeare\n\nQ: Who was Nero?\nA:"
    )
    assert prompt({"id": "qb_1", "question": "Who was Nero?"}) == expected


@pytest.mark.parametrize(
    "name", ["trivia_qa", "basic_skills", "entity_questions", "basic_skills2", "basic_skills3"]
)
def test_every_shot_and_question_ends_in_an_answer_slot(name: str) -> None:
    """No example ends where a blank line is the likeliest continuation (Gemma answered "" there)."""
    for question in load_questions(name)[:50]:
        *shots, last = prompt(question).split("\n\n")
        assert len(shots) == 3 and last.endswith(question["question"] + ("" if "=" in last else "\nA:"))
        for shot in shots:
            assert re.fullmatch(r"Q: [^\n]+\nA: [^\n]+|[^\n]+ = \S+", shot), shot


@pytest.mark.parametrize(
    ("gold", "text", "ok"),
    [
        ("cba", " 'cba'.", True),  # quotes and a full stop around the answer are not counted
        ("ALPHA", " alpha", False),  # case counts
        ("&", " &", True),  # symbols count (TriviaQA's normalisation would erase them)
        ("4th quarter", " 4th quarter 5th quarter", True),  # the answer's first words
        ("4th quarter", " 4th", False),
        ("['a', 'b']", " ['a', 'b']", True),
        ("34", " 3 4", False),
        ("34", "", False),
    ],
)
def test_pattern_and_string_answers_are_graded_exactly_on_their_first_words(
    gold: str, text: str, ok: bool
) -> None:
    assert is_correct({"task": "string_operations", "answer": gold, "aliases": [gold.lower()]}, text) is ok


def test_basic_skills2_is_two_blind_skills_of_200() -> None:
    questions = load_questions("basic_skills2")
    assert Counter(q["task"] for q in questions) == {"pattern": 200, "string_operations": 200}
    assert len({q["id"] for q in questions}) == 400 and all(q["answer"] for q in questions)


def test_basic_skills3_is_the_rest_of_basic_skills_two_tasks_with_no_question_shared() -> None:
    fresh, first = load_questions("basic_skills3"), load_questions("basic_skills")
    assert Counter(q["task"] for q in fresh) == {"arithmetic": 847, "common_knowledge": 837}
    assert len({q["question"] for q in fresh}) == len(fresh) == 1684
    assert not {q["question"] for q in fresh} & {q["question"] for q in first}
    assert not {q["id"] for q in fresh} & {q["id"] for q in first}


def test_entity_questions_grade_short_names_and_the_head_before_a_comma() -> None:
    questions = load_questions("entity_questions")
    assert len(questions) == 400 and len({q["id"] for q in questions}) == 400
    assert {group(q) for q in questions} == {
        "P17",
        "P36",
        "P106",
        "P136",
        "P176",
        "P407",
        "P413",
        "P495",
        "P19",
        "P50",
    }
    usa = next(q for q in questions if q["answer"] == "United States of America")
    assert (
        is_correct(usa, " United States")
        and is_correct(usa, " the USA")
        and not is_correct(usa, " United Kingdom")
    )
    comma = next(q for q in questions if "," in q["answer"])
    assert is_correct(comma, " " + comma["answer"].split(",")[0])


def test_lambada_passages_are_bare_prompts_graded_on_the_first_word() -> None:
    questions = load_questions("lambada")
    assert len(questions) == 400 and len({q["id"] for q in questions}) == 400
    assert all(len(q["answer"].split()) == 1 and q["aliases"] == [q["answer"].lower()] for q in questions)
    passage = questions[0]
    assert prompt(passage) == passage["question"] and not passage["question"].endswith(" ")
    answer = passage["answer"]
    assert is_correct(passage, f" {answer}.") and is_correct(passage, f' "{answer.upper()}," he said')
    assert not is_correct(passage, f" the {answer}") and not is_correct(passage, f" {answer}s")
    assert not is_correct(passage, "") and not is_correct(passage, "\n")


def test_the_gateway_threshold_is_read_from_the_learned_cascade_of_the_config(tmp_path) -> None:  # noqa: ANN001
    from bench.lib.cascade_live import learned_threshold

    shipped = Path(__file__).resolve().parents[1] / "bench" / "cascade_live.yaml"
    assert learned_threshold(str(shipped)) == 0.08
    config = tmp_path / "c.yaml"
    config.write_text(
        "routing: {cascades: [{alias: a, small: s, large: l, confidence: {method: mean_logprob, threshold: -1.0}}]}"
    )
    assert learned_threshold(str(config)) is None


def test_sums_keep_their_equals_sign_as_the_slot() -> None:
    assert prompt({"task": "arithmetic", "question": "5 + 14 ="}).endswith("6 * 3 = 18\n\n5 + 14 =")


def test_normalise_drops_case_punctuation_and_articles() -> None:
    assert normalise("The  Beatles!") == "beatles"


def test_escalation_sends_the_least_confident_share_and_scores_it() -> None:
    confidence = np.array([0.9, 0.1, 0.5, 0.3])
    assert escalated(confidence, 0.5).tolist() == [False, True, False, True]
    weak, strong = np.array([1.0, 0.0, 1.0, 0.0]), np.array([0.0, 1.0, 0.0, 1.0])
    picks = np.random.default_rng(0).integers(0, 4, size=(50, 4))
    result = point(escalated(confidence, 0.5), weak, strong, picks)
    assert result["accuracy"] == 1.0 and result["vs_large"] == 0.5
    assert result["vs_small"] == 0.5 and result["vs_random"] == 0.5  # random at 50 % expects 0.5
    assert result["vs_random_low"] <= result["vs_random"] <= result["vs_random_high"]
    assert result["low"] <= result["accuracy"] <= result["high"]


def test_margins_come_from_top_logprobs_in_chat_and_completions() -> None:
    chat = {"logprobs": {"content": [{"logprob": -0.1, "top_logprobs": [{"logprob": -0.1}, {"logprob": -2.1}]},
                                     {"logprob": -0.5, "top_logprobs": []}]}}  # fmt: skip
    assert choice_margins(chat) == pytest.approx([2.0])
    text = {"logprobs": {"token_logprobs": [-0.2], "top_logprobs": [{" B": -0.2, " A": -0.7}]}}
    assert choice_margins(text) == pytest.approx([0.5])
    assert choice_margins({"logprobs": None}) == []


def test_answer_features_and_model_round_trip(tmp_path) -> None:  # noqa: ANN001
    x = answer_features("Q: who?", [-0.5, -1.5], [2.0, 0.4])
    assert x.shape == (len(ANSWER_FEATURES),)
    assert x[ANSWER_FEATURES.index("first")] == pytest.approx(-0.5)
    assert x[ANSWER_FEATURES.index("first_margin")] == pytest.approx(2.0)
    assert x[ANSWER_FEATURES.index("mean_margin")] == pytest.approx(1.2)
    assert answer_features("q", [], []).shape == x.shape
    head = LogisticModel(np.arange(len(x), dtype=float), 0.1, np.zeros(len(x)), np.ones(len(x)), True)
    AnswerModel(head).save(tmp_path / "c.npz")
    loaded = load_model(tmp_path / "c.npz")
    assert isinstance(loaded, AnswerModel)
    assert loaded.confidence("Q: who?", [-0.5, -1.5], [2.0, 0.4]) == pytest.approx(
        head.predict(x[None, :])[0]
    )


def test_answer_model_reads_only_its_columns_and_old_files_read_all(tmp_path) -> None:  # noqa: ANN001
    columns = ("mean", "first_margin")
    head = LogisticModel(np.array([1.0, 2.0]), -0.5, np.zeros(2), np.ones(2), True)
    AnswerModel(head, columns=columns).save(tmp_path / "c.npz")
    loaded = load_model(tmp_path / "c.npz")
    assert isinstance(loaded, AnswerModel) and loaded.columns == columns
    question_a, question_b = "Q: who?", "Q: a much longer question, and another clause?"
    a = loaded.confidence(question_a, [-0.5, -1.5], [2.0, 0.4])
    assert a == pytest.approx(head.predict(np.array([[-1.0, 2.0]]))[0])
    assert loaded.confidence(question_b, [-0.5, -1.5], [2.0, 0.4]) == a  # question length not read
    with pytest.raises(ValueError, match="do not fit"):
        AnswerModel(head, columns=("mean",))
    with np.load(tmp_path / "c.npz") as data:  # a file of the earlier format: no column names, all seven
        arrays = {k: data[k] for k in data.files if k != "answer_columns"}
    full = LogisticModel(np.ones(len(ANSWER_FEATURES)), 0.0, np.zeros(7), np.ones(7), True)
    arrays.update(full.arrays())
    np.savez(tmp_path / "old.npz", **arrays)
    assert load_model(tmp_path / "old.npz").columns == ANSWER_FEATURES


def test_random_router_has_apgr_one_half_and_linear_cpt() -> None:
    rng = np.random.default_rng(0)
    weak, strong = (rng.random(1000) < 0.6).astype(float), (rng.random(1000) < 0.8).astype(float)
    curve = random_curve(weak, strong)
    assert curve.apgr() == pytest.approx(0.5)
    assert curve.cpt(0.5) == pytest.approx(0.5) and curve.cpt(0.8) == pytest.approx(0.8)


def test_oracle_beats_random_and_a_bad_router_loses() -> None:
    rng = np.random.default_rng(1)
    weak, strong = (rng.random(2000) < 0.6).astype(float), (rng.random(2000) < 0.8).astype(float)
    oracle = routing_curve(oracle_scores(weak, strong), weak, strong)
    worst = routing_curve(-oracle_scores(weak, strong), weak, strong)
    assert oracle.apgr() > 0.9 and worst.apgr() < 0.2
    assert oracle.cpt(0.8) < 0.3
    assert oracle.quality[0] == pytest.approx(weak.mean()) and oracle.quality[-1] == pytest.approx(
        strong.mean()
    )


def test_confidence_statistics() -> None:
    values = [-0.1, -0.1, -2.0, -2.0, -0.1]
    assert mean_logprob(values) == pytest.approx(-0.86)
    assert min_window(values, 2) == pytest.approx(-2.0)
    assert min_window(values[:1], 4) == pytest.approx(-0.1)
    assert logprob_features([]).shape == logprob_features(values).shape == (5,)


def test_logistic_model_round_trips(tmp_path) -> None:  # noqa: ANN001
    model = LogisticModel(np.array([1.0, -2.0]), 0.5, np.array([0.0, 1.0]), np.array([1.0, 2.0]), False)
    model.save(tmp_path / "m.npz")
    loaded = load_model(tmp_path / "m.npz")
    x = np.array([[1.0, 3.0]])
    assert loaded.predict(x)[0] == pytest.approx(1 / (1 + np.exp(-(1.0 - 2.0 + 0.5))))


def test_gain_model_confidence_is_the_difference(tmp_path) -> None:  # noqa: ANN001
    small = LogisticModel(np.array([1.0]), 0.0, np.zeros(1), np.ones(1), False)
    large = LogisticModel(np.array([-1.0]), 0.0, np.zeros(1), np.ones(1), False)
    GainModel(small, large).save(tmp_path / "g.npz")
    loaded = load_model(tmp_path / "g.npz")
    x = np.array([[2.0]])
    assert loaded.confidence(x)[0] == pytest.approx(small.predict(x)[0] - large.predict(x)[0])


def test_the_alias_replay_gives_the_recorded_threshold_point_and_holds_the_share() -> None:
    """`auto` (threshold 0.08) replays basic_skills' recorded operating point; `auto-40` escalates ~40 %."""
    from bench.lib.cascade_alias import replay

    fixed = replay("bench/cascade_live.yaml", "auto", "basic_skills", None)
    assert fixed["escalated"].mean() == pytest.approx(0.6425)
    assert fixed["correct"].mean() == pytest.approx(0.3675)
    share = replay("bench/cascade_live.yaml", "auto-40", "basic_skills", None)
    assert share["escalated"][:50].sum() == fixed["escalated"][:50].sum()  # the warm-up: the fixed threshold
    assert 0.35 <= share["escalated"][50:].mean() <= 0.45


def test_the_three_basic_skills_sets_are_one_source_when_a_set_is_held_out() -> None:
    from bench.lib.cascade_common import family

    assert {family(n) for n in ("basic_skills", "basic_skills2", "basic_skills3")} == {"basic_skills"}
    assert len({family(n) for n in ("trivia_qa", "entity_questions", "lambada", "basic_skills")}) == 4


def test_basic_skills4_asks_for_a_return_expression_after_three_shots_of_our_own() -> None:
    questions = load_questions("basic_skills4")
    assert len(questions) == len({q["question"] for q in questions}) == 1012
    shots = {q for q, _ in COMPLETION_SHOTS["coding"]}
    assert not shots & {q["question"] for q in questions}  # no question is shown with its answer
    text = prompt(questions[0])
    assert text.count("\n\n") == 3 and text.endswith(questions[0]["question"])


@pytest.mark.parametrize(
    ("gold", "text", "ok"),
    [
        ("n * factorial(n - 1)", " n*factorial(n-1)", True),  # spaces do not count
        ("filename.split('.')[-1]", ' filename.split(".")[-1]  # the extension', True),  # quotes, comments
        ("a + b", " a + b;\n\ndef next():", True),  # the first line only
        ("a + b", " b + a", False),  # equivalent is not the same
        ("len(lst)", " len(lst) - 1", False),
        ("len(lst)", "", False),
    ],
)
def test_code_answers_are_graded_on_the_expression_not_its_spacing(gold: str, text: str, ok: bool) -> None:
    assert is_correct({"task": "coding", "answer": gold, "aliases": [gold]}, text) is ok
