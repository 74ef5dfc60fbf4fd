"""Labeled question pairs for the semantic-cache verifier, generated (never committed).

Sources: the intent templates and relations of bench/lib/verifier_templates.py, and the question stems of
the MMLU prompts in ../shared/routellm_eval/mmlu (read in place), and the pairs four authors wrote by
hand in bench/data/verifier_hand/ (train and calib only, `hand_pairs`). Every pair is (stored question, new
question, label 1 = one answer serves both). Kinds: paraphrase, and the look-alikes that need another
answer: intent, entity, scope, constraint, unit, swap, negation, number, nearby (another question on the
same topic).

Grouped split: a template family or an MMLU subject belongs to one split (train / calib / heldout), and
so does each rewrite template (each constraint, wrapper, qualifier, synonym), so held-out pairs come from
questions *and* templates that training never saw. Calibration (the verifier's threshold table) is its
own split too.

    python -m bench.lib.verifier_pairs --out /tmp/pairs.jsonl     # prints counts per split and kind

Also the encodings of the pairs' questions as the gateway computes them (`shipped_encoder`, `encode_all`).
Shared by the verifier's builder (training/train_verifier.py) and the benchmarks that score it (the same
grouped splits: semantic_cache_eval's held-out set is the split the builder never trains on).
"""

import argparse
import csv
import hashlib
import json
import os
import random
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.lib import verifier_templates as T
from bench.lib.routellm_data import data_dir
from cache.config import CacheSettings
from cache.encoder import EncodedQuestion, QuestionEncoder, build_encoder, normalise

FAMILY_SPLIT = {
    "element": "calib",
    "food": "calib",
    "city": "heldout",
    "disease": "heldout",
    "planet": "heldout",
}


@dataclass
class Pair:
    a: str
    b: str
    label: int
    kind: str
    source: str  # the family, subject or relation the questions come from
    split: str


def split_of(name: str) -> str:
    """70 / 15 / 15 by a stable hash of a source or template name."""
    bucket = int(hashlib.md5(name.encode()).hexdigest(), 16) % 100
    return "train" if bucket < 70 else "calib" if bucket < 85 else "heldout"


class Rewrites:
    """The rewrite templates of one split, and the rewrites themselves."""

    def __init__(self, split: str, rng: random.Random) -> None:
        self.rng = rng
        mine = lambda items, tag: [x for x in items if split_of(f"{tag}:{x}") == split] or items[:1]  # noqa: E731
        self.constraints = {k: mine(v, "c") for k, v in T.CONSTRAINTS.items()}
        self.polite = mine(T.POLITE, "p")
        self.qualifiers = mine(T.QUALIFIERS, "q")
        self.synonyms = mine(T.SYNONYMS, "s")
        self.languages = mine(T.LANGUAGES, "l")

    def constrained(self, question: str, group: str | None = None, lang: str | None = None) -> str:
        group = group or self.rng.choice(sorted(self.constraints))
        template = self.rng.choice(self.constraints[group])
        text = template.replace("{lang}", lang or self.rng.choice(self.languages))
        if "{Q}" in text:
            return text.replace("{Q}", question)
        if text[0].islower() or text.startswith("("):
            return f"{question.rstrip('?.! ')} {text}{_end(question)}"
        return f"{question} {text}"

    def polite_form(self, question: str) -> str:
        template = self.rng.choice(self.polite)
        lowered = question[0].lower() + question[1:] if not _starts_with_name(question) else question
        return template.replace("{Q}", question).replace("{q}", lowered)

    def qualified(self, question: str) -> str:
        return f"{question.rstrip('?.! ')} {self.rng.choice(self.qualifiers)}{_end(question)}"

    def synonym(self, question: str) -> str | None:
        for a, b in self.rng.sample(self.synonyms, len(self.synonyms)):
            for x, y in ((a, b), (b, a)):
                pattern = re.compile(rf"\b{re.escape(x)}\b")
                if pattern.search(question):
                    return pattern.sub(y, question, count=1)
        return None

    def typo(self, question: str) -> str | None:
        words = [w for w in question.split() if len(w) > 5 and w.isalpha()]
        if not words:
            return None
        word = self.rng.choice(words)
        i = self.rng.randrange(1, len(word) - 2)
        broken = word[:i] + word[i + 1] + word[i] + word[i + 2 :]
        return question.replace(word, broken, 1)

    def surface(self, question: str) -> str:
        options = [question.lower(), question.rstrip("?.!"), question.replace("?", " ?"), "  " + question]
        return self.rng.choice(options)

    def paraphrase(self, question: str) -> str:
        """A meaning-preserving rewrite: a wrapper, a synonym, a typo or a surface change."""
        for make in self.rng.sample([self.polite_form, self.synonym, self.typo, self.surface], 4):
            rewritten = make(question)
            if rewritten and rewritten != question:
                return rewritten
        return self.polite_form(question)


def generic_pairs(question: str, source: str, split: str, rw: Rewrites) -> Iterator[Pair]:
    """Pairs any question yields: rewrites that keep its meaning, and edits that change it."""
    rng = rw.rng
    make = lambda b, label, kind: Pair(question, b, label, kind, source, split)  # noqa: E731
    yield make(rw.paraphrase(question), 1, "paraphrase")
    yield make(rw.paraphrase(rw.paraphrase(question)), 1, "paraphrase")
    yield make(rw.constrained(question), 0, "constraint")
    constrained, other = (
        rw.constrained(question, "language"),
        rw.constrained(rw.paraphrase(question), "language"),
    )
    same = _languages(constrained) == _languages(other)  # the same language asked for twice: same answer
    yield Pair(constrained, other, int(same), "paraphrase" if same else "constraint", source, split)
    same = rw.constrained(question, "format")
    yield Pair(same, same.replace(question, rw.paraphrase(question)), 1, "paraphrase", source, split)
    yield make(rw.qualified(question), 0, "scope")
    if (negated := negate(question)) is not None:
        yield make(negated, 0, "negation")
    if (changed := change_number(question, rng)) is not None:
        yield make(changed, 0, "number")
    if (swapped := swap_intent_word(question, rng)) is not None:
        yield make(swapped, 0, "intent")
    if (other := swap_entity(question, rng)) is not None:
        yield make(other, 0, "entity")


def template_pairs(rng: random.Random) -> Iterator[Pair]:
    for family, (slot, intents) in T.INTENTS.items():
        split = FAMILY_SPLIT.get(family, "train")
        rw = Rewrites(split, rng)
        values = T.SLOTS[slot]
        for intent, phrasings in intents.items():
            for value in values:
                a, b = rng.sample(phrasings, 2)
                q, p = a.format(x=value), b.format(x=value)
                yield Pair(q, p, 1, "paraphrase", family, split)
                yield Pair(q, rw.paraphrase(p), 1, "paraphrase", family, split)
                other_intent = rng.choice([i for i in intents if i != intent])
                yield Pair(q, rng.choice(intents[other_intent]).format(x=value), 0, "intent", family, split)
                other_value = rng.choice([v for v in values if v != value])
                yield Pair(q, rng.choice(phrasings).format(x=other_value), 0, "entity", family, split)
                if rng.random() < 0.12:
                    yield from generic_pairs(q, family, split, rw)


def relation_pairs(rng: random.Random) -> Iterator[Pair]:
    for n, (slot, symmetric, phrasings) in enumerate(T.RELATIONS):
        source = f"relation{n}"
        split = FAMILY_SPLIT.get(slot, "train")
        rw = Rewrites(split, rng)
        for _ in range(25):
            x, y = rng.sample(T.SLOTS[slot], 2)
            first, second = rng.choice(phrasings), rng.choice(phrasings)
            q = first.format(a=x, b=y)
            yield Pair(q, second.format(a=x, b=y), 1, "paraphrase", source, split)
            yield Pair(
                q,
                second.format(a=y, b=x),
                int(symmetric),
                "paraphrase" if symmetric else "swap",
                source,
                split,
            )
            z = rng.choice([v for v in T.SLOTS[slot] if v not in (x, y)])
            yield Pair(q, second.format(a=x, b=z), 0, "entity", source, split)
            yield Pair(q, rw.qualified(q), 0, "scope", source, split)


def unit_pairs(rng: random.Random) -> Iterator[Pair]:
    for n, (dimension, phrasings, units) in enumerate(T.UNIT_QUESTIONS):
        source = f"units:{dimension}{n}"
        split = split_of(source)
        for unit in units:
            a, b = rng.sample(phrasings, 2)
            yield Pair(a.format(u=unit), b.format(u=unit), 1, "paraphrase", source, split)
            other = rng.choice([u for u in units if u != unit])
            yield Pair(a.format(u=unit), rng.choice(phrasings).format(u=other), 0, "unit", source, split)
    for dimension, units in T.UNIT_CONVERSIONS.items():
        source = f"convert:{dimension}"
        split = split_of(source)
        for _ in range(30):
            x, y, z = rng.sample(units, 3)
            first, second = rng.sample(T.CONVERSION_PHRASINGS, 2)
            q = first.format(a=x, b1=y.rstrip("s"))
            yield Pair(q, second.format(a=x, b1=y.rstrip("s")), 1, "paraphrase", source, split)
            yield Pair(q, second.format(a=y, b1=x.rstrip("s")), 0, "swap", source, split)
            yield Pair(q, second.format(a=z, b1=y.rstrip("s")), 0, "unit", source, split)


def mmlu_pairs(rng: random.Random, per_subject: int) -> Iterator[Pair]:
    for path in sorted((data_dir() / "mmlu").glob("*.csv")):
        subject = path.stem.removeprefix("mmlu_")
        split = split_of(f"mmlu:{subject}")
        rw = Rewrites(split, rng)
        stems = mmlu_stems(path)
        for question in rng.sample(stems, min(per_subject, len(stems))):
            yield from generic_pairs(question, subject, split, rw)
            other = rng.choice(stems)
            if other != question:
                yield Pair(question, other, 0, "nearby", subject, split)


def mmlu_stems(path: Path) -> list[str]:
    with path.open(newline="") as f:
        prompts = [row["prompt"] for row in csv.DictReader(f)]
    stems = {p.split("\nA.")[0].strip() for p in prompts}
    return sorted(s for s in stems if 15 <= len(s) <= 140 and "\n" not in s)


# --- edits that change the meaning ----------------------------------------------------------------------


def negate(question: str) -> str | None:
    words = question.split()
    for i, word in enumerate(words[:-1]):
        if word.lower() in T.NEGATABLE and words[i + 1].lower() not in ("not", "no"):
            return " ".join([*words[: i + 1], "not", *words[i + 1 :]])
    return None


def change_number(question: str, rng: random.Random) -> str | None:
    match = re.search(r"\d+", question)
    if match is None:
        return None
    value = int(match.group())
    new = value + rng.choice([1, 2, 10, -1]) if value > 1 else value + 2
    return question[: match.start()] + str(new) + question[match.end() :]


def swap_intent_word(question: str, rng: random.Random) -> str | None:
    for a, b in rng.sample(T.INTENT_WORDS, len(T.INTENT_WORDS)):
        for x, y in ((a, b), (b, a)):
            pattern = re.compile(rf"\b{x}\b", re.IGNORECASE)
            if pattern.search(question):
                return pattern.sub(
                    lambda m, y=y: y.capitalize() if m.group()[0].isupper() else y, question, 1
                )
    return None


def swap_entity(question: str, rng: random.Random) -> str | None:
    for slot in ("country", "city", "person", "planet", "element", "language"):
        for value in T.SLOTS[slot]:
            if re.search(rf"\b{re.escape(value)}\b", question):
                other = rng.choice([v for v in T.SLOTS[slot] if v != value])
                return question.replace(value, other, 1)
    return None


def _languages(text: str) -> frozenset[str]:
    return frozenset(lang for lang in T.LANGUAGES if lang in text)


def _end(question: str) -> str:
    return "?" if question.rstrip().endswith("?") else "."


def _starts_with_name(question: str) -> bool:
    first = question.split()[0] if question.split() else ""
    return first[:1].isupper() and first.lower() not in {w.lower() for w in _QUESTION_STARTS}


_QUESTION_STARTS = frozenset(
    [
        "What",
        "Which",
        "Who",
        "Whom",
        "Whose",
        "When",
        "Where",
        "Why",
        "How",
        "Is",
        "Are",
        "Was",
        "Were",
        "Do",
        "Does",
        "Did",
        "Can",
        "Could",
        "Should",
        "Would",
        "Will",
        "Name",
        "Tell",
        "Define",
        "Explain",
        "Describe",
        "In",
        "At",
        "On",
        "For",
        "The",
        "A",
        "An",
        "If",
    ]
)


HAND = Path(__file__).parents[1] / "data" / "verifier_hand"


def hand_pairs(folder: Path = HAND) -> Iterator[Pair]:
    """Pairs written by hand by several authors (bench/data/verifier_hand/README.md). A quarter of each
    file's stored questions, chosen by a hash of the text, go to calib with all their pairs; the rest train."""
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                calib = int(hashlib.sha256(row["a"].encode()).hexdigest(), 16) % 4 == 0
                yield Pair(row["a"], row["b"], int(row["label"]), row["kind"], f"hand:{path.stem}",
                           "calib" if calib else "train")  # fmt: skip


def build(seed: int = 0, per_subject: int = 8, hand: bool = True) -> list[Pair]:
    rng = random.Random(seed)
    pairs = [*template_pairs(rng), *relation_pairs(rng), *unit_pairs(rng), *mmlu_pairs(rng, per_subject)]
    pairs += hand_pairs() if hand else []
    unique = {(p.a, p.b): p for p in pairs if p.a.strip() != p.b.strip()}
    return list(unique.values())


def shipped_encoder(normalise_text: bool = True) -> QuestionEncoder:
    """The encoder the gateway uses by default (ONNX Runtime, int8 as CacheSettings says, one thread)."""
    return build_encoder(
        None, threads=1, int8=CacheSettings().onnx_int8, onnx_dir=os.environ.get("LLMGW_CACHE__ONNX_DIR"),
        normalise_text=normalise_text,
    )  # fmt: skip


def encode_all(encoder: QuestionEncoder, texts: list[str], batch: int = 1) -> dict[str, EncodedQuestion]:
    """Each text's encoding; texts of one encoded form (`normalise`) are encoded once. One text per forward
    pass by default, as the gateway encodes a lone lookup: the int8 encoder quantises activations per
    batch, so batch-mates change a question's vectors (batches of 64: cosine 0.992 on average, 0.978 at
    worst, to the vectors alone), and which texts share a batch changed from run to run."""
    forms = {t: form(encoder, t) for t in texts}
    ordered = sorted(set(forms.values()), key=lambda f: (len(f), f))
    encoded: dict[str, EncodedQuestion] = {}
    for start in range(0, len(ordered), batch):
        chunk = ordered[start : start + batch]
        encoded.update(zip(chunk, encoder.encode(chunk), strict=True))
        if start % (batch * 1280) == 0:
            print(f"encoded {start}/{len(ordered)}", flush=True)
    return {t: encoded[form] for t, form in forms.items()}


def form(encoder: QuestionEncoder, text: str) -> str:
    return normalise(text) if encoder.normalise_text else text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    pairs = build(args.seed)
    args.out.write_text("".join(json.dumps(asdict(p)) + "\n" for p in pairs))
    counts = Counter((p.split, p.kind) for p in pairs)
    for split in ("train", "calib", "heldout"):
        print(split, {k: n for (s, k), n in sorted(counts.items()) if s == split})


def load_set(path: Path) -> list[dict]:
    """Labeled pairs from a jsonl file of rows {"a", "b", "label", "kind"} (bench/data/*/pairs.jsonl)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{"a": r["a"], "b": r["b"], "label": int(r["label"]), "kind": r["kind"]} for r in rows]


if __name__ == "__main__":
    main()
