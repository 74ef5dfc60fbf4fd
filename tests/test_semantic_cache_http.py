"""Scoring of bench/lib/semantic_cache_http.py: a hit is correct only on a paraphrase row and only when it
serves the answer stored for that row's own stored question; everything else that hits is a false hit."""

import math

from bench.lib.semantic_cache_http import outcomes, scores

ANSWERS = {"capital of France?": "echo: capital of France?", "height of Everest?": "echo: height of Everest?"}
ROWS = [
    {"a": "capital of France?", "b": "France's capital?", "label": 1, "kind": "paraphrase"},
    {"a": "height of Everest?", "b": "How tall is Everest?", "label": 1, "kind": "paraphrase"},
    {"a": "capital of France?", "b": "capital of Spain?", "label": 0, "kind": "entity"},
    {"a": "height of Everest?", "b": "height of K2?", "label": 0, "kind": "entity"},
]


def reply(status: str, answer_of: str) -> dict:
    return {"status": status, "answer": f"echo: {answer_of}"}


def test_a_paraphrase_hit_serving_another_questions_answer_is_false() -> None:
    replies = {
        "France's capital?": reply("semantic-hit", "capital of France?"),  # own answer: correct
        "How tall is Everest?": reply("semantic-hit", "capital of France?"),  # another's answer: false
        "capital of Spain?": reply("semantic-hit", "capital of France?"),  # label 0 hit: false
        "height of K2?": reply("miss", "height of K2?"),
    }
    o = outcomes(ROWS, replies, ANSWERS)
    assert o["hit"].tolist() == [True, True, True, False]
    assert o["correct"].tolist() == [True, False, False, False]
    assert o["false"].tolist() == [False, True, True, False]
    assert o["wrong_entry"].tolist() == [False, True, False, False]
    r = scores(o, draws=200)
    assert r["precision"]["value"] == 1 / 3
    assert r["recall"]["value"] == 1 / 2
    assert r["fhr_entity"]["value"] == 1 / 2
    assert r["fhr_paraphrase"]["value"] == 1 / 2
    assert r["wrong_entry"] == 1 and r["false_hits"] == 2 and r["correct"] == 1
    low, high = r["precision"]["ci"]
    assert 0 <= low <= 1 / 3 <= high <= 1


def test_exact_hits_count_and_no_hits_give_precision_one() -> None:
    replies = {row["b"]: reply("miss", row["b"]) for row in ROWS}
    replies["France's capital?"] = reply("hit", "capital of France?")
    r = scores(outcomes(ROWS, replies, ANSWERS), draws=50)
    assert (r["hits"], r["precision"]["value"], r["recall"]["value"]) == (1, 1.0, 0.5)
    replies["capital of Spain?"] = reply("hit", "capital of France?")  # exact hit on a label-0 row: false
    r = scores(outcomes(ROWS, replies, ANSWERS), draws=50)
    assert (r["precision"]["value"], r["precision_semantic"]["value"], r["fhr_entity"]["value"]) == (
        0.5,
        1.0,
        0.5,
    )
    nothing = scores(outcomes(ROWS, {row["b"]: reply("miss", row["b"]) for row in ROWS}, ANSWERS), draws=50)
    assert nothing["precision"]["value"] == 1.0 and nothing["recall"]["value"] == 0.0
    assert nothing["fhr_entity"]["value"] == 0.0 and not math.isnan(nothing["fhr_entity"]["value"])
