"""Exact-cache key canonicalisation and the semantic namespace; the guard's feature checks."""

import pytest

from cache.guard import conflict, parse
from cache.keys import exact_key, semantic_parts

BODY = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 5}


def key(body, tenant="t", model="m"):
    return exact_key(tenant, model, "chat", body)


def test_key_ignores_key_order_number_spelling_and_irrelevant_fields():
    reordered = {"max_tokens": 5, "temperature": 0.0, "messages": BODY["messages"], "model": "m"}
    noisy = {
        **BODY,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "u1",
        "metadata": {"a": 1},
    }
    parts = {**BODY, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
    assert key(BODY) == key(reordered) == key(noisy) == key(parts)


@pytest.mark.parametrize(
    "change",
    [{"temperature": 0.5}, {"max_tokens": 6}, {"seed": 1}, {"tools": [{"type": "function"}]},
     {"response_format": {"type": "json_object"}}, {"stop": ["x"]}, {"n": 2}, {"top_p": 0.5},
     {"messages": [{"role": "user", "content": "Hi!"}]}],
)  # fmt: skip
def test_key_changes_with_every_output_relevant_field(change):
    assert key(BODY) != key({**BODY, **change})


def test_key_separates_tenants_and_models():
    assert len({key(BODY), key(BODY, tenant="u"), key(BODY, model="n")}) == 3


def test_semantic_namespace_covers_all_but_the_last_user_turn():
    a = semantic_parts("t", "m", "chat", BODY)
    b = semantic_parts("t", "m", "chat", {**BODY, "messages": [{"role": "user", "content": "Hello"}]})
    c = semantic_parts("t", "m", "chat", {**BODY, "max_tokens": 9})
    system = [{"role": "system", "content": "Be brief."}, *BODY["messages"]]
    d = semantic_parts("t", "m", "chat", {**BODY, "messages": system})
    assert a.namespace == b.namespace and a.question == "Hi" and b.question == "Hello"
    assert len({a.namespace, c.namespace, d.namespace, semantic_parts("u", "m", "chat", BODY).namespace}) == 4


def test_no_semantic_parts_when_the_last_turn_is_not_user_text():
    tool_turn = {
        **BODY,
        "messages": [*BODY["messages"], {"role": "tool", "content": "42", "tool_call_id": "1"}],
    }
    image = {
        **BODY,
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    }
    assert semantic_parts("t", "m", "chat", tool_turn) is None
    assert semantic_parts("t", "m", "chat", image) is None


@pytest.mark.parametrize(
    ("a", "b", "reason"),
    [
        ("What is 15% of 80?", "What is fifteen percent of 60?", "number"),
        ("What is the capital of France?", "What is the capital of Spain?", "entity"),
        ("Why is my phone charging?", "Why isn't my phone charging?", "negation"),
        ("How do I convert miles to kilometers?", "How do I convert kilometers to miles?", "swap"),
        ("Do sharks eat octopuses?", "Do octopuses eat sharks?", "swap"),
        ("How tall is it in feet?", "How tall is it in meters?", "unit"),
        ("Is the museum open today?", "Is the museum open tomorrow?", "time"),
        ("What is the largest lake?", "What is the smallest lake?", "antonym"),
    ],
)
def test_guard_names_the_difference(a, b, reason):
    assert conflict(parse(a), parse(b)) == reason


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is the square root of 144?", "What's the square root of one hundred forty-four?"),
        ("What's a good gift for a ten-year-old?", "What should I buy a 10 year old?"),
        ("What does SQL JOIN do?", "Explain what a JOIN does in SQL."),
        ("Who wrote Hamlet?", "Who is the author of Hamlet?"),
    ],
)
def test_guard_lets_paraphrases_through(a, b):
    assert conflict(parse(a), parse(b)) is None
