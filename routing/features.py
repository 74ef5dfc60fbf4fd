"""Question features meant to carry across tasks: length and structure, math / code / reasoning markers,
open-ended writing and explanation markers.

A router trained on one task (MMLU) must rank the questions of another task by difficulty. Subject
vocabulary does not carry (it is what an embedding-only router learns); these counts do: long,
numeric, formula- or code-laden, multi-step questions are where a weaker model falls behind.
Pure numpy and `re`: computed per request at serving time in microseconds.
"""

import re

import numpy as np

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_MATH_SYMBOL = re.compile(r"[=+*/^<>%√∑∫π]|\\frac|\\sqrt|\$")
_CODE = re.compile(r"```|\bdef |\breturn\b|\bimport\b|[{};]|\bfor \w+ in\b|\bwhile\b|==|\w+\(\)|\bprint\(")
_REASONING = re.compile(
    r"\b(?:calculate|compute|solve|prove|derive|find|how many|how much|what is the value|estimate|"
    r"probability|step|if\b.*\bthen|suppose|assume|given that|total|each|per|remaining|left)\b",
    re.IGNORECASE,
)
_CREATIVE = re.compile(
    r"\b(?:write|compose|draft|story|poem|essay|email|letter|blog|imagine|pretend|role-?play|describe|"
    r"persuasive|slogan|speech)\b",
    re.IGNORECASE,
)
_EXPLAIN = re.compile(
    r"\b(?:explain|why|compare|discuss|analy[sz]e|evaluate|justify|critique)\b", re.IGNORECASE
)
# Multiple-choice structure (zero on prompts without it): enumerated parts to judge one by one
# ("Statement 1 |", "Scenario 2 |", "I. … II. …"), negated stems, catch-all options, option lines.
_PARTS = re.compile(
    r"\b(?:Statement|Scenario|Claim|Premise|Part)\s*\(?\d+\)?\s*[|:.)]"
    r"|(?:^|\s)(?:I{1,3}|IV|\(\d\)|\(i{1,3}\))[.)]?\s+(?=[A-Z(])"
)
_NEGATION = re.compile(r"\b(?:NOT|EXCEPT|LEAST|FALSE|not|except|least|incorrect|untrue)\b")
_CATCH_ALL = re.compile(r"\b(?:all|none|both|neither) of (?:the above|these|them)\b", re.IGNORECASE)
_OPTION = re.compile(r"^\s*\(?[A-J][.)]\s+(.*)$", re.MULTILINE)
_NUMERIC_OPTION = re.compile(r"^[\s$\-−+]*[\d.,/]+\s*\S{0,6}$")
_WORD = re.compile(r"\w+")
_DIGIT = re.compile(r"\d")
_UPPER = re.compile(r"[A-Z]")
_SENTENCE_END = re.compile(r"[.?!](?:\s|$)")

TEXT_FEATURES = (
    "log_chars",
    "log_words",
    "log_lines",
    "mean_word_len",
    "log_numbers",
    "digit_share",
    "log_math_symbols",
    "log_code_markers",
    "log_reasoning_words",
    "log_sentences",
    "upper_share",
    "log_question_marks",
    "log_creative_words",  # open-ended writing, where a weaker model stays close (MT-Bench writing, roleplay)
    "log_explain_words",
    "log_parts",  # enumerated statements / scenarios to judge (MMLU "Statement 1 | …")
    "log_negation",
    "catch_all_option",  # "all / none of the above"
    "log_option_chars",  # mean length of the lettered options (0 without options)
    "numeric_option_share",
)

# The multiple-choice features above: zero on prompts without lettered options or enumerated parts.
MULTIPLE_CHOICE_FEATURES = TEXT_FEATURES[-5:]


def text_features(texts: list[str]) -> np.ndarray:
    """One row of TEXT_FEATURES per text (float32)."""
    return np.array([_row(text) for text in texts], dtype=np.float32).reshape(len(texts), len(TEXT_FEATURES))


def _row(text: str) -> list[float]:
    chars = max(len(text), 1)
    words = _WORD.findall(text)
    sentences = len(_SENTENCE_END.findall(text))
    options = _OPTION.findall(text)
    return [
        np.log1p(len(text)),
        np.log1p(len(words)),
        np.log1p(text.count("\n")),
        float(np.mean([len(w) for w in words])) if words else 0.0,
        np.log1p(len(_NUMBER.findall(text))),
        len(_DIGIT.findall(text)) / chars,
        np.log1p(len(_MATH_SYMBOL.findall(text))),
        np.log1p(len(_CODE.findall(text))),
        np.log1p(len(_REASONING.findall(text))),
        np.log1p(sentences),
        len(_UPPER.findall(text)) / chars,
        np.log1p(text.count("?")),
        np.log1p(len(_CREATIVE.findall(text))),
        np.log1p(len(_EXPLAIN.findall(text))),
        np.log1p(len(_PARTS.findall(text))),
        np.log1p(len(_NEGATION.findall(text))),
        float(bool(_CATCH_ALL.search(text))),
        np.log1p(np.mean([len(o) for o in options])) if options else 0.0,
        float(np.mean([bool(_NUMERIC_OPTION.match(o)) for o in options])) if options else 0.0,
    ]
