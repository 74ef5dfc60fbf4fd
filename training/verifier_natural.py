"""Naturally written question pairs for the verifier (issue 40), from bench/data/natural_pairs/ (SOURCE.md).

Sources (each is one group of the grouped split; `--holdout SOURCE` sends a whole source to "heldout"):
  comqa        — ComQA paraphrase clusters of real WikiAnswers questions (raw/comqa_task442.txt): every
                 paraphrase against its cluster's first question (label 1); look-alikes from other clusters
                 that share content words (label 0, "nearby"); and two edits of the cluster's question that
                 change what it asks: an order word swapped (first -> last, "ordinal") and a restriction
                 added ("... for kids", "constraint"). The edits belong to the comqa group, so holding out
                 comqa holds them out too.
  ambigqa      — AmbigQA: an ambiguous Natural Questions query against each of its disambiguations, and
                 the disambiguations against each other (label 0, "constraint": each asks for another answer).
  hand_natural — hand_natural.jsonl, written for this repository in the way users type: currencies, added
                 or dropped restrictions, first/next/last, cause/effect and yes/no reversals, and paraphrases
                 of the same styles (label 1) so that informal wording alone is no sign of a look-alike.
Within a source that is not held out, a cluster (all pairs of one stored question) goes to train (75 %) or
calib (25 %) by a hash of its first question, so calibration measures natural pairs too.

    python -m training.verifier_natural --out bench/data/natural_pairs/natural.jsonl   # prints counts
"""

import argparse
import hashlib
import json
import random
import re
from collections import Counter
from pathlib import Path

from bench.lib.verifier_pairs import Pair
from cache.guard import stem
from cache.lexicon import FUNCTION_WORDS

DATA = Path(__file__).resolve().parents[1] / "bench" / "data" / "natural_pairs"
SOURCES = ("comqa", "ambigqa", "hand_natural")
ORDINAL_SWAPS = {
    "first": "last", "1st": "last", "last": "first", "latest": "first", "second": "third", "2nd": "3rd",
    "third": "second", "3rd": "2nd", "next": "last", "newest": "oldest", "oldest": "newest",
}  # fmt: skip
RESTRICTIONS = (
    "for kids",
    "in canada",
    "in the uk",
    "for women",
    "for beginners",
    "that is free",
    "in australia",
    "before the war",
    "in europe",
    "on tv",
    "as a child",
    "in the 1990s",
)


def clusters(path: Path) -> list[list[str]]:
    """The raw files' lines: questions separated by " ||| " ("#" lines are provenance and stretch marks)."""
    rows = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            rows.append([q.strip() for q in line.split(" ||| ") if q.strip()])
    return rows


def _split(key: str, holdout: str | None, source: str) -> str:
    if source == holdout:
        return "heldout"
    return "calib" if int(hashlib.sha256(key.encode()).hexdigest(), 16) % 4 == 0 else "train"


def _content(text: str) -> frozenset[str]:
    words = re.findall(r"[a-z0-9']+", text.lower())
    return frozenset(stem(w) for w in words if w not in FUNCTION_WORDS)


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / max(len(a | b), 1)


def comqa_pairs(rng: random.Random, holdout: str | None) -> list[Pair]:
    groups = [c for c in clusters(DATA / "raw" / "comqa_task442.txt") if len(c) >= 2]
    words = [[_content(q) for q in c] for c in groups]
    pairs: list[Pair] = []
    for i, cluster in enumerate(groups):
        head = cluster[0]
        split = _split(head, holdout, "comqa")
        make = lambda b, label, kind, h=head, s=split: Pair(h, b, label, kind, "comqa", s)  # noqa: E731
        pairs += [make(q, 1, "paraphrase") for q in cluster[1:] if q != head]
        if len(cluster) >= 3:
            pairs.append(Pair(cluster[1], cluster[2], 1, "paraphrase", "comqa", split))
        near = sorted(
            (
                (_jaccard(words[i][0], words[j][0]), j)
                for j in range(len(groups))
                if j != i and words[i][0] & words[j][0]
            ),
            reverse=True,
        )
        taken = 0
        for score, j in near:
            duplicate = any(_jaccard(x, y) >= 0.7 for x in words[i] for y in words[j])
            if 0.25 <= score < 0.7 and not duplicate:
                pairs.append(make(rng.choice(groups[j]), 0, "nearby"))
                taken += 1
            if taken == 2:
                break
        if (swapped := _swap_ordinal(head)) is not None:
            pairs.append(make(swapped, 0, "ordinal"))
        if rng.random() < 0.4:
            pairs.append(make(f"{head.rstrip('? ')} {rng.choice(RESTRICTIONS)}?", 0, "constraint"))
    return pairs


def _swap_ordinal(question: str) -> str | None:
    for word, other in ORDINAL_SWAPS.items():
        pattern = re.compile(rf"\b{word}\b", re.IGNORECASE)
        if pattern.search(question):
            return pattern.sub(other, question, count=1)
    return None


def ambigqa_pairs(rng: random.Random, holdout: str | None) -> list[Pair]:
    pairs: list[Pair] = []
    for cluster in clusters(DATA / "raw" / "ambigqa_task670.txt"):
        head, rewrites = cluster[0], cluster[1:]
        split = _split(head, holdout, "ambigqa")
        pairs += [Pair(head, q, 0, "constraint", "ambigqa", split) for q in rewrites]
        others = [(a, b) for k, a in enumerate(rewrites) for b in rewrites[k + 1 :]]
        pairs += [
            Pair(a, b, 0, "constraint", "ambigqa", split) for a, b in rng.sample(others, min(3, len(others)))
        ]
    return pairs


def hand_natural_pairs(holdout: str | None) -> list[Pair]:
    rows = [
        json.loads(line) for line in (DATA / "hand_natural.jsonl").read_text().splitlines() if line.strip()
    ]
    return [
        Pair(
            r["a"],
            r["b"],
            int(r["label"]),
            r["kind"],
            "hand_natural",
            _split(r["a"], holdout, "hand_natural"),
        )
        for r in rows
    ]


def natural_pairs(seed: int = 0, holdout: str | None = None) -> list[Pair]:
    """Every natural pair, split by source group (`holdout`: that source entirely in "heldout")."""
    if holdout is not None and holdout not in SOURCES:
        raise ValueError(f"unknown source {holdout!r}; one of {SOURCES}")
    rng = random.Random(seed)
    pairs = [*comqa_pairs(rng, holdout), *ambigqa_pairs(rng, holdout), *hand_natural_pairs(holdout)]
    unique = {(p.a, p.b): p for p in pairs if p.a.strip().lower() != p.b.strip().lower()}
    return list(unique.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    pairs = natural_pairs(args.seed)
    keys = ("a", "b", "label", "kind", "source")
    args.out.write_text("".join(json.dumps({k: getattr(p, k) for k in keys}) + "\n" for p in pairs))
    counts = Counter((p.source, p.label, p.kind) for p in pairs)
    for (source, label, kind), n in sorted(counts.items()):
        print(f"{source:13} {label} {kind:11} {n}")


if __name__ == "__main__":
    main()
