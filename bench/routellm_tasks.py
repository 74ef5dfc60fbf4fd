"""The routing tasks of the RouteLLM records: MMLU (by subject group), MT-Bench, and GSM8K.

MMLU: quality = answered correctly (0/1). Its 57 subjects fall in the four groups of the MMLU paper
(STEM, humanities, social sciences, other); a group held out whole stands in for an unseen task.
MT-Bench: 80 two-turn questions, each routed on its first turn; a model's quality on a question is
the mean GPT-4 grade (1-10) of its two turns. Contaminated prompts are left out of all three.
GSM8K: quality = answered correctly; the records live in bench/data/routellm_gsm8k (bench/routellm_gsm8k.py).
"""

import csv
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from bench.routellm_data import REPO, STRONG_COLUMN, WEAK_COLUMN, Records, _contaminated, data_dir

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
