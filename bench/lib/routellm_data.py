"""The RouteLLM records: what Mixtral-8x7B (weak) and GPT-4 (strong) answered, and the routing tasks on them.

The MMLU and MT-Bench data stay outside the repository: `<repo>/../shared/routellm_eval`, or
LLMGW_ROUTELLM_EVAL_DIR. Embeddings of the prompts are cached in bench/results/, keyed by a hash of the prompts.

Tasks. MMLU: quality = answered correctly (0/1). Its 57 subjects fall in the four groups of the MMLU paper
(STEM, humanities, social sciences, other); a group held out whole stands in for an unseen task.
MT-Bench: 80 two-turn questions, each routed on its first turn; a model's quality on a question is
the mean GPT-4 grade (1-10) of its two turns. Contaminated prompts are left out of all three.
GSM8K: quality = answered correctly; the records live in bench/data/routellm_gsm8k (bench/lib/routellm_gsm8k.py).
"""

import csv
import hashlib
import json
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
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


GSM8K_RECORDS = REPO / "bench" / "data" / "routellm_gsm8k" / "records.csv"

_STEM = """abstract_algebra anatomy astronomy college_biology college_chemistry college_computer_science
college_mathematics college_physics computer_security conceptual_physics electrical_engineering
elementary_mathematics high_school_biology high_school_chemistry high_school_computer_science
high_school_mathematics high_school_physics high_school_statistics machine_learning"""
_HUMANITIES = """formal_logic high_school_european_history high_school_us_history high_school_world_history
international_law jurisprudence logical_fallacies moral_disputes moral_scenarios philosophy prehistory
professional_law world_religions"""
_SOCIAL = """econometrics high_school_geography high_school_government_and_politics
high_school_macroeconomics high_school_microeconomics high_school_psychology human_sexuality
professional_psychology public_relations security_studies sociology us_foreign_policy"""
SUBJECT_GROUP = {
    **{s: "stem" for s in _STEM.split()},
    **{s: "humanities" for s in _HUMANITIES.split()},
    **{s: "social" for s in _SOCIAL.split()},
}
GROUPS = ("stem", "humanities", "social", "other")


def subject_groups(subjects: np.ndarray) -> np.ndarray:
    """The MMLU group of each question's subject ("other" for the 13 remaining subjects)."""
    return np.array([SUBJECT_GROUP.get(s, "other") for s in subjects.tolist()])


def load_mt_bench(root: Path | None = None) -> Records:
    """One record per MT-Bench question: its first turn, category, and each model's mean grade."""
    folder = (root or data_dir()) / "mt_bench"
    excluded = _contaminated(folder / "contaminated_prompts.jsonl")
    grades: dict[tuple[int, str], list[float]] = defaultdict(list)
    for line in (folder / "judgements.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["score"] >= 0:
            grades[(row["question_id"], row["model"])].append(float(row["score"]))
    prompts, categories, weak, strong = [], [], [], []
    for line in (folder / "question.jsonl").read_text().splitlines():
        question = json.loads(line)
        qid, first = question["question_id"], question["turns"][0]
        if first in excluded or not grades[(qid, WEAK_COLUMN)] or not grades[(qid, STRONG_COLUMN)]:
            continue
        prompts.append(first)
        categories.append(question["category"])
        weak.append(np.mean(grades[(qid, WEAK_COLUMN)]))
        strong.append(np.mean(grades[(qid, STRONG_COLUMN)]))
    if not prompts:
        raise FileNotFoundError(f"no MT-Bench records under {folder}")
    return Records(prompts, np.array(categories), np.array(weak), np.array(strong))


def load_gsm8k(path: Path = GSM8K_RECORDS) -> Records:
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return Records(
        [r["prompt"] for r in rows],
        np.array(["gsm8k"] * len(rows)),
        np.array([float(r["weak_correct"]) for r in rows]),
        np.array([float(r["strong_correct"]) for r in rows]),
    )
