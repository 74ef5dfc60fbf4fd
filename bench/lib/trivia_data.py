"""The TriviaQA questions of the live cascade benchmark (bench/data/trivia_qa/, Apache-2.0, see its README).

Both models are base-style completers (Gemma 3 270M is the pretrained model, not the instruction-tuned
one), so each question is asked as a 3-shot completion "Q: ...\\nA:" cut at the first newline. Every
shot and the question end in an explicit answer slot ("A:", or a sum's "="), also basic_skills' sentences
to complete: without it, shots separated by blank lines make "\\n\\n" Gemma's likeliest next token (an
empty answer). An answer is correct when one of TriviaQA's normalised aliases appears as whole words in the
normalised answer (lower case, punctuation to spaces, no articles: TriviaQA's own normalisation).
LAMBADA's passages are asked bare (no shots, the passage is the prompt) and graded on the first word only.
"""

import json
import re
import string
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "data"
QUESTIONS = DATA / "trivia_qa" / "questions.jsonl"
# The question sets of the live cascade: TriviaQA (Q:/A: quiz questions), basic_skills (sentences and sums
# to complete, bench/data/basic_skills/, ODC-BY: its `task` field picks the completion-style shots below) and
# entity_questions (Q:/A: template questions over Wikidata facts, bench/data/entity_questions/, MIT) and
# lambada (a passage whose last word is the answer, bench/data/lambada/, CC BY 4.0 / MIT).
SETS = {
    "trivia_qa": QUESTIONS,
    "basic_skills": DATA / "basic_skills" / "questions.jsonl",
    "entity_questions": DATA / "entity_questions" / "questions.jsonl",
    "lambada": DATA / "lambada" / "questions.jsonl",
    "basic_skills2": DATA / "basic_skills2" / "questions.jsonl",  # pattern, string_operations (ODC-BY)
    # the rest of basic_skills' two tasks; then coding, a Python function's returned expression (ODC-BY)
    "basic_skills3": DATA / "basic_skills3" / "questions.jsonl",
    "basic_skills4": DATA / "basic_skills4" / "questions.jsonl",
}
# The shots are ours (not from the set), so no evaluated question is ever shown with its answer.
SHOTS = (
    ("What is the capital of France?", "Paris"),
    ("Which planet is known as the Red Planet?", "Mars"),
    ("Who wrote the play Romeo and Juliet?", "William Shakespeare"),
)
COMPLETION_SHOTS = {
    "common_knowledge": (("The capital city of France is", "Paris"), ("The animal that says moo is a", "cow"),
                         ("The season that comes after spring is", "summer")),
    "arithmetic": (("3 + 4 =", "7"), ("12 - 5 =", "7"), ("6 * 3 =", "18")),
    "lambada": (),
    "pattern": (("1 2 3 4", "5"), ("A C E G", "I"), ("red blue red blue", "red")),
    "string_operations": (("The reverse of 'abc' is", "cba"), ("The length of the string 'tree' is", "4"),
                          ("The lowercase equivalent of 'DOG' is", "dog")),
    "coding": (('def half(x):\n    """Return half of x."""\n    return', "x / 2"),
               ('def greet(name):\n    """Return a greeting for name."""\n    return', "'Hello, ' + name"),
               ('def ends_with_dot(s):\n    """Return True if s ends with a full stop."""\n    return', "s.endswith('.')")),
}  # fmt: skip
# An equation's trailing "=" is its own answer slot: "Q: 5 + 14 =\nA:" halved both models' arithmetic scores
# (SmolLM2 0.16 -> 0.08, Gemma 0.15 -> 0.055 on basic_skills' 200 sums), so sums keep "a + b = c" shots.
SLOTS = {"arithmetic": "{}", "lambada": "{}", "pattern": "Q: What comes next: {}\nA:", "coding": "{}"}
EXACT_TASKS = ("pattern", "string_operations")  # graded on the answer's first words, exactly (symbols, case)
_QUOTES = string.punctuation + "‘’´`“”"
_QUOTES_ONLY = "'\"`‘’“”"
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans({c: " " for c in string.punctuation + "‘’´`"})


def load_questions(name: str = "trivia_qa") -> list[dict[str, Any]]:
    path = SETS[name]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def prompt(question: dict[str, Any]) -> str:
    """3 shots and the question, each ending in its answer slot; the model's answer is the rest of the line."""
    task = question.get("task") or ""
    slot = SLOTS.get(task, "Q: {}\nA:")
    shots = "".join(f"{slot.format(q)} {a}\n\n" for q, a in COMPLETION_SHOTS.get(task, SHOTS))
    return shots + slot.format(question["question"])


def normalise(text: str) -> str:
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def is_correct(question: dict[str, Any], text: str) -> bool:
    if question.get("task") == "lambada":  # the passage's next word, quotes and punctuation around it dropped
        words = text.split()
        return bool(words) and words[0].strip(_QUOTES).lower() in question["aliases"]
    if question.get("task") in EXACT_TASKS:
        return exact_start(text, question["answer"])
    if question.get("task") == "coding":
        return same_code(text, question["answer"])
    answer = normalise(text.strip().split("\n")[0])
    return bool(answer) and any(
        re.search(rf"(^| ){re.escape(alias)}( |$)", answer) for alias in question["aliases"] if alias
    )


def exact_start(text: str, gold: str) -> bool:
    """The answer's first words are the gold answer's, case and symbols kept; quotes around a word and a
    trailing full stop or comma on the last one are not counted ("'cba'." is cba)."""
    words, expected = text.strip().split(), gold.split()
    if len(words) < len(expected) or not expected:
        return False
    said = [w.strip(_QUOTES_ONLY) for w in words[: len(expected)]]
    wanted = [w.strip(_QUOTES_ONLY) for w in expected]
    if said[-1] != wanted[-1] and said[-1].rstrip(".,").strip(_QUOTES_ONLY) == wanted[-1]:
        said[-1] = wanted[-1]
    return said == wanted


def same_code(text: str, gold: str) -> bool:
    """The returned expression (the answer's first line, a trailing comment or semicolon dropped) is the gold
    one, spaces not counted and either quote accepted: "n*factorial(n-1)" is "n * factorial(n - 1)"; an
    equivalent but different expression ("b + a" for "a + b") is not."""

    def compact(code: str) -> str:
        return "".join(code.split("#")[0].split()).replace('"', "'").rstrip(";")

    line = text.strip().split("\n")[0]
    return bool(line) and compact(line) == compact(gold)


def group(question: dict[str, Any]) -> str:
    """The quiz site the question was written for (TriviaQA's id prefix: qb, sfq, odql, qw, ...), the task, or
    the Wikidata relation (entity_questions' id prefix: P17, P50, ...)."""
    return question.get("task") or question["id"].split("_")[0]
