"""Extra training pairs for the semantic-cache verifier, made from the *train* split of
bench/lib/verifier_pairs.py only (the calibration and held-out pairs are left exactly as they were).

Why: the verifier trained on the base pairs missed ordinary surface variation ("What is the capital of
France" without its question mark: p 0.78 against 0.99 with it) and indirect phrasings ("Do you know what
the capital of France is?": 0.04). Everything here is label-preserving noise or a rewrite whose label is
known by construction; the templates below are used by training alone (none of them is a template of
the calibration or held-out split: e.g. the held-out wrappers "Do you know {q}" and "I'd like to know {q}"
are not here, "Do you happen to know …" and "I'd love to know …" are):

- surface noise on either side of pairs of *every* label (so noise is no cue for a label): case, spacing,
  missing or doubled "?", a trailing "please" or "thanks", typos in lower-case words, apostrophes;
- frames that keep the meaning: "What is the X of Y?" → "Tell me the X of Y.", "X of Y?", "Would you
  know what the X of Y is?" …, as paraphrase positives and, applied to the new side of a look-alike, as
  look-alikes of the same kind;
- relations over two values of a train slot, directional ("ship a parcel from X to Y": swapping is a
  look-alike) or symmetric ("do X and Y share a border": swapping is a paraphrase);
- look-alikes of kinds the base pairs have few of: a modifier that narrows the scope ("the former
  capital", "the rural population"), a qualifier put first ("In winter, …"), intent words swapped
  (population / area, born / die …), a contracted negation ("is" → "isn't"), and constraints that the
  base train templates lack ("Answer in Swedish.", "Give pros and cons." …); none is a near copy of a
  calibration or held-out constraint. The trailing noise is "please" and marks only: trailing content
  words ("thanks", "cheers") as noise taught that any trailing words are harmless, and constraints such
  as "Only give the final answer." then passed.
"""

import random
import re
from collections.abc import Callable, Iterator

from bench.lib import verifier_templates as T
from bench.lib.verifier_pairs import Pair

NOISE_SHARE = 0.35  # of train pairs that get a noisy copy of their new question (and half as many, stored)
FRAME_SHARE = 0.2  # of train questions that get a framed paraphrase when a frame applies
EDIT_SHARE = 0.3  # of train questions that get each kind of extra look-alike when it applies

TRAILERS = [" please", ", please", "??", " ?", "?!", "..."]  # function words and marks only (see below)
DIRECT_FRAMES = [
    "Tell me {rest}.", "Give me {rest}.", "I want to know {rest}.", "I'd love to know {rest}.",
    "{Rest}?", "{bare}?", "{bare}", "Could you tell me {rest}?", "Looking for {rest}.", "Need {rest}.",
]  # fmt: skip
INDIRECT_FRAMES = [
    "Do you happen to know {wh} {rest} {be}?", "Would you know {wh} {rest} {be}?", "I wonder {wh} {rest} {be}.",
    "Could you tell me {wh} {rest} {be}?", "I'm trying to find out {wh} {rest} {be}.",
    "Tell me {wh} {rest} {be}.", "Any clue {wh} {rest} {be}?", "Not sure {wh} {rest} {be}, can you help?",
]  # fmt: skip
WRAPPERS = [
    "So, {q}", "Okay, {q}", "Hey there! {Q}", "Hi there, {q}", "Sorry to bother you, {q}",
    "Out of curiosity, {q}", "Can anyone tell me {q}", "Would you know: {Q}", "Do you happen to know: {Q}",
    "Random question: {Q}",
]  # fmt: skip
SCOPE_MODIFIERS = [
    "former", "northern", "southern", "eastern", "western", "rural", "urban", "ancient", "medieval",
    "female", "male", "winter", "summer", "nighttime", "teenage", "future", "previous", "coastal",
    "unofficial", "illegal", "private", "domestic", "foreign",
]  # fmt: skip
LEADING_QUALIFIERS = [
    "In winter", "For a child", "In the 1800s", "In Asia", "On a Mac", "For cats", "In a desert",
    "During a recession", "For a beginner", "In the Roman Empire", "At sea level", "In prison",
]  # fmt: skip
INTENT_SWAPS = [
    ("population", "area"), ("capital", "largest city"), ("currency", "language"), ("born", "die"),
    ("height", "weight"), ("author", "publisher"), ("invent", "discover"), ("start", "end"),
    ("longest", "shortest"), ("oldest", "youngest"), ("north", "south"), ("buy", "sell"), ("win", "lose"),
    ("import", "export"), ("hot", "cold"), ("cheap", "expensive"), ("faster", "slower"),
    ("president", "prime minister"), ("cause", "cure"), ("eat", "drink"), ("read", "write"),
    ("highest", "lowest"), ("minimum", "maximum"), ("strength", "weakness"), ("legal", "illegal"),
]  # fmt: skip
CONSTRAINTS = [
    "Explain your answer in depth.", "Give a long answer.", "Use simple words.", "Answer in Swedish.",
    "Reply in Polish please.", "Answer as a story.", "Make it rhyme.", "Be very precise.",
    "Give me the full explanation.", "Summarize it.", "Answer formally, please.", "Explain it simply.",
    "Give pros and cons.", "With a short history.", "Add a fun fact.", "One-line answer please.",
]  # fmt: skip
# relations over two values of a train slot (symmetric: the answer survives swapping the two); every
# phrasing of one relation asks the same thing. Few base train relations are directional "from/to" ones.
RELATIONS: list[tuple[str, bool, list[str]]] = [
    ("country", False, ["How much does it cost to ship a parcel from {a} to {b}?",
                        "What does shipping a parcel from {a} to {b} cost?"]),
    ("country", False, ["Is {a} richer than {b}?", "Is {a} wealthier than {b}?", "Does {a} have a higher GDP than {b}?"]),
    ("country", False, ["Did {a} ever invade {b}?", "Has {a} ever invaded {b}?"]),
    ("country", False, ["How do I move from {a} to {b}?", "What do I need to relocate from {a} to {b}?"]),
    ("country", True, ["Do {a} and {b} share a border?", "Are {a} and {b} neighbours?", "Does {a} border {b}?"]),
    ("country", True, ["Which is bigger, {a} or {b}?", "{a} or {b}: which one is larger?"]),
    ("language", False, ["How do I call {a} code from {b}?", "How can {b} code call into {a}?"]),
    ("language", False, ["Is {a} easier to learn than {b}?", "Is {a} simpler to pick up than {b}?"]),
    ("language", True, ["Can {a} and {b} be used together?", "Do {a} and {b} work together?"]),
    ("animal", False, ["Can {a} kill {b}?", "Are {a} able to kill {b}?"]),
    ("animal", False, ["Are {a} smarter than {b}?", "Are {a} more intelligent than {b}?"]),
    ("animal", True, ["Which is heavier, {a} or {b}?", "{a} or {b}: which weighs more?"]),
    ("person", False, ["Was {a} a student of {b}?", "Did {a} study under {b}?"]),
    ("person", False, ["Did {a} write about {b}?", "Did {a} ever write anything about {b}?"]),
    ("person", True, ["Were {a} and {b} friends?", "Was {a} friends with {b}?"]),
]  # fmt: skip
CONTRACTIONS = {"is": "isn't", "are": "aren't", "does": "doesn't", "do": "don't", "can": "can't",
                "was": "wasn't", "did": "didn't", "should": "shouldn't", "will": "won't"}  # fmt: skip

_WH_BE = re.compile(r"^(what|who)\s+(is|are|was|were)\s+(the\s+.+?)[\s?.!]*$", re.IGNORECASE)
_ENDS_IN_PREPOSITION = re.compile(r"\b(for|of|to|in|with|on|at|about|from|by|like|into)$", re.IGNORECASE)
_THE_WORD = re.compile(r"\bthe ([a-z]{4,})\b")


def augment(pairs: list[Pair], seed: int = 0) -> list[Pair]:
    """Extra pairs from the train split of `pairs` (all in the train split); never one already there."""
    rng = random.Random(f"augment:{seed}")
    train = [p for p in pairs if p.split == "train"]
    seen = {(p.a, p.b) for p in pairs}
    extra: dict[tuple[str, str], Pair] = {}
    made = [*_noisy(train, rng), *_framed(train, rng), *_look_alikes(train, rng), *_relations(rng)]
    for pair in made:
        if pair.a.strip() != pair.b.strip() and (pair.a, pair.b) not in seen:
            extra.setdefault((pair.a, pair.b), pair)
    return list(extra.values())


def noise(text: str, rng: random.Random) -> str:
    """One or two label-keeping surface changes."""
    for change in rng.sample(_NOISES, rng.choice([1, 1, 2])):
        text = change(text, rng)
    return text


def _lower(text: str, rng: random.Random) -> str:
    return text.lower() if rng.random() < 0.7 else text[:1].lower() + text[1:]


def _spacing(text: str, rng: random.Random) -> str:
    words = text.split(" ")
    i = rng.randrange(len(words))
    return " ".join([*words[:i], "", *words[i:]]) if rng.random() < 0.6 else f" {text}  "


def _final_mark(text: str, rng: random.Random) -> str:
    bare = text.rstrip("?.! ")
    return bare if rng.random() < 0.6 else bare + rng.choice(["??", "?!", " ?", ".", "!"])


def _trailer(text: str, rng: random.Random) -> str:
    return text.rstrip() + rng.choice(TRAILERS)


def _typo(text: str, rng: random.Random) -> str:
    words = text.split(" ")
    candidates = [i for i, w in enumerate(words) if len(w) > 4 and w.isalpha() and w.islower()]
    if not candidates:
        return text
    i = rng.choice(candidates)
    w, j = words[i], rng.randrange(1, len(words[i]) - 1)
    dropped, doubled, swapped = (
        w[:j] + w[j + 1 :],
        w[:j] + w[j] + w[j:],
        w[: j - 1] + w[j] + w[j - 1] + w[j + 1 :],
    )
    words[i] = rng.choice([dropped, doubled, swapped])
    return " ".join(words)


def _apostrophes(text: str, rng: random.Random) -> str:
    contracted = re.sub(r"\b(What|what) is\b", r"\1's", text, count=1)
    return contracted if contracted != text and rng.random() < 0.5 else contracted.replace("'", "")


_NOISES: list[Callable[[str, random.Random], str]] = [
    _lower,
    _spacing,
    _final_mark,
    _trailer,
    _typo,
    _apostrophes,
]


def _noisy(train: list[Pair], rng: random.Random) -> Iterator[Pair]:
    for p in train:
        if rng.random() < NOISE_SHARE:
            yield Pair(p.a, noise(p.b, rng), p.label, p.kind, p.source, p.split)
        if rng.random() < NOISE_SHARE / 2:
            yield Pair(noise(p.a, rng), p.b, p.label, p.kind, p.source, p.split)


def frame(question: str, rng: random.Random) -> str | None:
    """The question in another frame that keeps its meaning, or None when no frame applies."""
    if (wrapped := rng.random() < 0.35) or not (match := _WH_BE.match(question.strip())):
        if not wrapped:
            return None
        template = rng.choice(WRAPPERS)
        return template.replace("{Q}", question).replace("{q}", question[:1].lower() + question[1:])
    wh, be, rest = match.group(1).lower(), match.group(2).lower(), match.group(3)
    if _ENDS_IN_PREPOSITION.search(rest):
        return None
    template = rng.choice(INDIRECT_FRAMES if rng.random() < 0.5 else DIRECT_FRAMES)
    bare = rest.split(" ", 1)[1]
    return template.format(wh=wh, be=be, rest=rest, Rest=rest[:1].upper() + rest[1:], bare=bare)


def _framed(train: list[Pair], rng: random.Random) -> Iterator[Pair]:
    done: set[str] = set()
    for p in train:
        if p.a not in done and rng.random() < FRAME_SHARE and (framed := frame(p.a, rng)):
            done.add(p.a)
            yield Pair(p.a, framed, 1, "paraphrase", p.source, p.split)
        if rng.random() < FRAME_SHARE / 2 and (framed := frame(p.b, rng)):
            yield Pair(p.a, framed, p.label, p.kind, p.source, p.split)  # a look-alike stays one, framed


def _look_alikes(train: list[Pair], rng: random.Random) -> Iterator[Pair]:
    questions = sorted({p.a for p in train if len(p.a.split()) <= 14 and not re.search(r"[\d$\\=_]", p.a)})
    sources = {p.a: p.source for p in train}
    for q in questions:
        edits = (("scope", _modifier), ("scope", _leading), ("intent", _intent), ("negation", _contracted),
                 ("constraint", _constrained), ("constraint", _constrained))  # fmt: skip
        for kind, edit in edits:
            if rng.random() < EDIT_SHARE and (edited := edit(q, rng)) and edited != q:
                yield Pair(q, edited, 0, kind, sources[q], "train")


def _relations(rng: random.Random) -> Iterator[Pair]:
    for n, (slot, symmetric, phrasings) in enumerate(RELATIONS):
        source, kind = f"xrelation{n}", "paraphrase" if symmetric else "swap"
        for _ in range(25):
            x, y, z = rng.sample(T.SLOTS[slot], 3)
            q, other = rng.choice(phrasings), rng.choice(phrasings)
            yield Pair(q.format(a=x, b=y), other.format(a=x, b=y), 1, "paraphrase", source, "train")
            yield Pair(q.format(a=x, b=y), other.format(a=y, b=x), int(symmetric), kind, source, "train")
            yield Pair(q.format(a=x, b=y), other.format(a=x, b=z), 0, "entity", source, "train")


def _modifier(question: str, rng: random.Random) -> str | None:
    matches = list(_THE_WORD.finditer(question))
    if not matches:
        return None
    m = rng.choice(matches)
    return f"{question[: m.start(1)]}{rng.choice(SCOPE_MODIFIERS)} {question[m.start(1) :]}"


def _constrained(question: str, rng: random.Random) -> str:
    asked = f"{question.rstrip()} {rng.choice(CONSTRAINTS)}"
    return noise(asked, rng) if rng.random() < 0.3 else asked


def _leading(question: str, rng: random.Random) -> str:
    return f"{rng.choice(LEADING_QUALIFIERS)}, {question[:1].lower()}{question[1:]}"


def _intent(question: str, rng: random.Random) -> str | None:
    for a, b in rng.sample(INTENT_SWAPS, len(INTENT_SWAPS)):
        for x, y in ((a, b), (b, a)):
            if re.search(rf"\b{x}\b", question):
                return re.sub(rf"\b{x}\b", y, question, count=1)
    return None


def _contracted(question: str, rng: random.Random) -> str | None:
    words = question.split(" ")
    for i, w in enumerate(words[1:], start=1):  # not first: "Isn't Python typed?" asks what "Is it?" asks
        if w.lower() in CONTRACTIONS:
            short = CONTRACTIONS[w.lower()]
            words[i] = short.capitalize() if w[:1].isupper() else short
            return " ".join(words)
    return None
