"""How questions.jsonl was made (kept for provenance).

    git clone https://github.com/princeton-nlp/EntityQuestions && cd EntityQuestions && git checkout 096c261
    python bench/data/entity_questions/make_subset.py path/to/EntityQuestions

40 questions from the development set of each of ten Wikidata relations (seeded sample), each with its gold
answers as aliases (normalised as TriviaQA's), plus the part before a comma or parenthesis ("Lipnik, Opatów
County" → "lipnik") and a few common short names of the two long country names ("united states", "usa", "us";
"uk"). The relations were chosen before any model answered: eight whose answers a prior can reach (country,
capital, occupation, genre, manufacturer, language, position, country of origin) and two that need the fact
(place of birth, author).
"""

import json
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.lib.trivia_data import normalise  # noqa: E402

RELATIONS = ("P17", "P36", "P106", "P136", "P176", "P407", "P413", "P495", "P19", "P50")
PER_RELATION = 40
SHORT_NAMES = {"united states of america": ("united states", "usa", "us"), "united kingdom": ("uk",)}


def aliases(answers: list[str]) -> list[str]:
    found: list[str] = []
    for answer in answers:
        for text in (answer, re.split(r"[,(]", answer)[0]):
            name = normalise(text)
            found += [name, *SHORT_NAMES.get(name, ())]
    return sorted({a for a in found if a}, key=len)


def main(root: str) -> None:
    rng = random.Random(18)
    with (Path(__file__).parent / "questions.jsonl").open("w") as out:
        for relation in RELATIONS:
            rows = json.loads((Path(root) / "dataset" / "dev" / f"{relation}.dev.json").read_text())
            for index in sorted(rng.sample(range(len(rows)), PER_RELATION)):
                row = rows[index]
                record = {"id": f"{relation}_{index}", "question": row["question"], "answer": row["answers"][0],
                          "aliases": aliases(row["answers"])}  # fmt: skip
                out.write(json.dumps(record, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
