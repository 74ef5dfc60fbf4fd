"""Closed-class facts about two questions: numbers, named entities, units, time words, negation,
antonyms, the order of arguments around a relation word. Once a rule guard on every semantic hit; now
the verifier (cache/verifier.py) keeps only the exact rule (different numbers never share an answer)
and reads the other checks as evidence among its features (cache/alignment.py). `conflict` names the
first difference found, or returns None; bench/semantic_cache_eval.py still scores it as a baseline.
"""

import re
from collections import Counter
from dataclasses import dataclass
from functools import cached_property

from cache.lexicon import (
    ANTONYMS,
    CURRENCIES,
    CURRENCY_PREFIXES,
    CURRENCY_SYMBOLS,
    FUNCTION_WORDS,
    LEADING_VERBS,
    MULTIPLIERS,
    NEGATIONS,
    NUMBER_WORDS,
    ORDINALS,
    RELATION_WORDS,
    TIME_WORDS,
    UNITS,
)

_TOKEN = re.compile(r"\d+(?:[.,/:]\d+)*|[^\W\d_]+(?:'[^\W\d_]+)*|[.!?;]", re.UNICODE)
_SENTENCE_END = frozenset(".!?;")
_CURRENCY_SIGN = re.compile(
    r"(?i)(?<![^\W\d_])("
    + "|".join(CURRENCY_PREFIXES)
    + r")?\$|["
    + "".join(c for c in CURRENCY_SYMBOLS if c != "$")
    + "]"
)


@dataclass(frozen=True)
class Question:
    words: tuple[str, ...]  # stems, in order
    numbers: tuple[str, ...]
    units: tuple[str, ...]
    entities: tuple[str, ...]  # stems of capitalised names
    times: frozenset[str]
    negated: bool

    @cached_property
    def content(self) -> tuple[str, ...]:
        return tuple(w for w in self.words if w not in FUNCTION_WORDS)

    @cached_property
    def relations(self) -> dict[str, int]:
        """Relation words used once -> their position (what the swap check looks at)."""
        counts = Counter(self.words)
        return {w: i for i, w in enumerate(self.words) if w in RELATION_WORDS and counts[w] == 1}


def parse(text: str) -> Question:
    raw = _TOKEN.findall(text.replace("’", "'").replace("-", " "))
    tokens = [t for t in raw if t not in _SENTENCE_END]
    words = tuple(stem(t) for t in tokens)
    return Question(
        words=words,
        numbers=tuple(_numbers(tokens)),
        units=_units(text, tokens),
        entities=tuple(_entities(raw)),
        times=frozenset(w for w in words if w in TIME_WORDS),
        negated=any(_is_negation(t.lower()) for t in tokens),
    )


def conflict(a: Question, b: Question, checks: frozenset[str] | None = None) -> str | None:
    """The first check that tells the questions apart (all checks, or only those named)."""
    for name, check in _CHECKS:
        if (checks is None or name in checks) and check(a, b):
            return name
    return None


def stem(token: str) -> str:
    word = token.lower()
    for suffix in ("'s", "'"):
        word = word.removesuffix(suffix)
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("ches", "shes", "sses", "xes", "zes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


# --- features -------------------------------------------------------------------------------------


def _numbers(tokens: list[str]) -> list[str]:
    found: list[str] = []
    spoken: list[str] = []
    for i, token in enumerate([*tokens, ""]):
        lower = token.lower()
        if lower in NUMBER_WORDS or lower in MULTIPLIERS or (spoken and lower == "and"):
            spoken.append(lower)
            continue
        found += _spoken_number(spoken)
        spoken = []
        if token[:1].isdigit():
            found.append(_digits(token))
        elif lower in ORDINALS and _is_ordinal(tokens, i):
            found.append(f"#{ORDINALS[lower]}")
    return found


def _is_ordinal(tokens: list[str], i: int) -> bool:
    """'the third chapter', 'one third': yes; 'invest first' (an adverb): no."""
    after = tokens[i + 1].lower() if i + 1 < len(tokens) else ""
    before = tokens[i - 1].lower() if i > 0 else ""
    return (bool(after) and after not in FUNCTION_WORDS) or before in NUMBER_WORDS


def _spoken_number(words: list[str]) -> list[str]:
    words = [w for w in words if w != "and"]
    if not words or words == ["one"]:  # a lone "one" is usually a pronoun
        return []
    total = current = 0
    for word in words:
        if word in MULTIPLIERS:
            current = max(current, 1) * MULTIPLIERS[word]
            total, current = (total + current, 0) if MULTIPLIERS[word] >= 1000 else (total, current)
        else:
            current += NUMBER_WORDS[word]
    return [str(total + current)]


def _digits(token: str) -> str:
    token = re.sub(r"(?<=\d),(?=\d{3}\b)", "", token)
    return token.replace(",", ".")


def _units(text: str, tokens: list[str]) -> tuple[str, ...]:
    """Units named, in order; a currency counts once however it is written ("USD $800", "$800 dollars"),
    from its word or code or from a sign ("£800" / "US$800" / "€5")."""
    named = [u for t in tokens if (u := _unit(t))]
    signs = [
        CURRENCY_PREFIXES[m.group(1).lower()] if m.group(1) else CURRENCY_SYMBOLS[m.group(0)[-1]]
        for m in _CURRENCY_SIGN.finditer(text)
    ]
    currencies = tuple(sorted({u for u in [*named, *signs] if u in CURRENCIES}))
    return (*(u for u in named if u not in CURRENCIES), *currencies)


def _unit(token: str) -> str | None:
    lower = token.lower()
    return UNITS.get(lower) or (UNITS.get(stem(lower)) if lower not in ORDINALS else None)


def _entities(raw: list[str]) -> list[str]:
    names: list[str] = []
    sentence_start = True
    for token in raw:
        if token in _SENTENCE_END:
            sentence_start = True
            continue
        lower = token.lower()
        capitalised = any(c.isupper() for c in token) and lower not in FUNCTION_WORDS
        if capitalised and not (sentence_start and lower in LEADING_VERBS):
            names.append(stem(token))
        sentence_start = False
    return names


def _is_negation(word: str) -> bool:
    return word in NEGATIONS or word.endswith("n't")


# --- checks ---------------------------------------------------------------------------------------


def _numbers_differ(a: Question, b: Question) -> bool:
    """Different numbers, or the same numbers in another order ("Is 7 greater than 3?" / "Is 3 greater
    than 7?", "10 minus 4" / "4 minus 10"): a commutative reorder is a miss too, which is only a lost hit."""
    return a.numbers != b.numbers


def _entities_substituted(a: Question, b: Question) -> bool:
    """Both sides name something the other does not mention at all."""
    return bool(set(a.entities) - set(b.words)) and bool(set(b.entities) - set(a.words))


def _units_differ(a: Question, b: Question) -> bool:
    return bool(a.units) and bool(b.units) and Counter(a.units) != Counter(b.units)


def _times_differ(a: Question, b: Question) -> bool:
    return bool(a.times) and bool(b.times) and a.times != b.times


def _negation_differs(a: Question, b: Question) -> bool:
    return a.negated != b.negated


def _antonyms(a: Question, b: Question) -> bool:
    only_a, only_b = set(a.words) - set(b.words), set(b.words) - set(a.words)
    return any(ANTONYMS.get(word, frozenset()) & only_b for word in only_a)


def _arguments_swapped(a: Question, b: Question) -> bool:
    return _reordered(a.content, b.content) or swapped_around_relation(a, b) or _names_swapped(a, b)


def _reordered(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """The same words in another order ("do sharks eat octopuses" / "do octopuses eat sharks")."""
    return a != b and sorted(a) == sorted(b)


def _names_swapped(a: Question, b: Question) -> bool:
    """Two names both mention, in the other order, with words between them in both questions
    ("did Napoleon invade Russia" / "did Russia invade Napoleon's France"). Adjacent names are a
    compound ("SQL JOIN"), not two arguments."""
    shared = [name for name in _dedupe(a.entities) if name in b.entities]
    return any(
        _apart(a.words, x, y) and _apart(b.words, x, y) and _before(a.words, x, y) != _before(b.words, x, y)
        for i, x in enumerate(shared)
        for y in shared[i + 1 :]
    )


def _apart(words: tuple[str, ...], x: str, y: str) -> bool:
    if x not in words or y not in words:
        return False
    return abs(words.index(x) - words.index(y)) > 1


def _before(words: tuple[str, ...], x: str, y: str) -> bool:
    return words.index(x) < words.index(y)


def swapped_around_relation(a: Question, b: Question) -> bool:
    """A shared word moved across a relation word both use once ("convert X to Y" / "convert Y to X")."""
    shared = set(a.content) & set(b.content)
    for relation in a.relations.keys() & b.relations.keys():
        sides_a = _sides(a.words, a.relations[relation], shared)
        sides_b = _sides(b.words, b.relations[relation], shared)
        if sides_a and sides_b and sides_a != sides_b:
            return True
    return False


def _sides(words: tuple[str, ...], at: int, shared: set[str]) -> frozenset[str] | None:
    """The shared words before the relation word at `at` (used once), if there are shared words on
    both sides of it."""
    before = frozenset(w for w in words[:at] if w in shared)
    after = frozenset(w for w in words[at + 1 :] if w in shared)
    return before if before and after else None


def _dedupe(items: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


_CHECKS = (
    ("number", _numbers_differ),
    ("negation", _negation_differs),
    ("entity", _entities_substituted),
    ("unit", _units_differ),
    ("time", _times_differ),
    ("antonym", _antonyms),
    ("swap", _arguments_swapped),
)
CHECK_NAMES = tuple(name for name, _ in _CHECKS)
CHECKS = dict(_CHECKS)  # name -> check(a, b): True when that check tells the questions apart
