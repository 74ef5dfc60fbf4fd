"""The recorded MMLU answers of Mixtral-8x7B (weak) and GPT-4 (strong), read from the shared folder.

The data stays outside the repository: `<repo>/../shared/routellm_eval`, or LLMGW_ROUTELLM_EVAL_DIR.
Embeddings of the prompts are cached in bench/results/, keyed by a hash of the prompts.
"""

import csv
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
WEAK_COLUMN = "mistralai/Mixtral-8x7B-Instruct-v0.1"
STRONG_COLUMN = "gpt-4-1106-preview"


@dataclass
class Records:
    prompts: list[str]
    subjects: np.ndarray  # str per question
    weak: np.ndarray  # 1.0 where the weak model answered correctly
    strong: np.ndarray

    def take(self, mask: np.ndarray) -> "Records":
        chosen = np.flatnonzero(mask)
        return Records([self.prompts[i] for i in chosen], self.subjects[chosen], self.weak[chosen],
                       self.strong[chosen])  # fmt: skip


def data_dir() -> Path:
    """LLMGW_ROUTELLM_EVAL_DIR, else the first `shared/routellm_eval` beside the repository or a parent."""
    if "LLMGW_ROUTELLM_EVAL_DIR" in os.environ:
        return Path(os.environ["LLMGW_ROUTELLM_EVAL_DIR"])
    candidates = [parent / "shared" / "routellm_eval" for parent in REPO.parents]
    return next((c for c in candidates if c.is_dir()), candidates[0])


def load_records(root: Path | None = None) -> Records:
    """All subjects, contaminated prompts left out."""
    root = root or data_dir()
    excluded = _contaminated(root / "mmlu_contaminated_prompts.jsonl")
    prompts, subjects, weak, strong = [], [], [], []
    for path in sorted((root / "mmlu").glob("*.csv")):
        with path.open(newline="") as handle:
            for row in csv.DictReader(handle):
                if row["prompt"] in excluded:
                    continue
                prompts.append(row["prompt"])
                subjects.append(path.stem.removeprefix("mmlu_"))
                weak.append(row[WEAK_COLUMN] == "True")
                strong.append(row[STRONG_COLUMN] == "True")
    if not prompts:
        raise FileNotFoundError(f"no MMLU records under {root / 'mmlu'} (set LLMGW_ROUTELLM_EVAL_DIR)")
    return Records(prompts, np.array(subjects), np.array(weak, float), np.array(strong, float))


def _contaminated(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return {json.loads(line)["eval_prompt"] for line in path.read_text().splitlines() if line.strip()}


def cached_embeddings(prompts: list[str], embed: "callable", kind: str = "minilm") -> np.ndarray:  # type: ignore[valid-type]
    """embed(prompts) once per distinct prompt list; later runs load bench/results/embeddings-<kind>-<hash>.npy."""
    digest = hashlib.sha256("\x00".join(prompts).encode()).hexdigest()[:16]
    path = RESULTS / f"embeddings-{kind}-{digest}.npy"
    if path.exists() and prompts:
        return np.load(path)
    vectors = embed(prompts)
    RESULTS.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors
