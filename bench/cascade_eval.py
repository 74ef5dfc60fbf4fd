"""Cascade and learned-router evaluation: quality against cost.

    .venv/bin/python -m bench.cascade_eval replay   # recorded Mixtral/GPT-4 MMLU answers, held-out splits
    .venv/bin/python -m bench.cascade_eval live     # our task set through the gateway (bench/cascade_live.py)

Each mode prints the quality-vs-strong-share curve, APGR, CPT(50%) and CPT(80%) of each router beside
the random router and the oracle, and writes bench/results/cascade_eval_<mode>.json.
"""

import argparse
import json
import os
import sys

import numpy as np

from bench.routellm_data import RESULTS, Records, cached_embeddings, load_records
from bench.routing_curves import Curve, oracle_scores, print_table, random_curve, routing_curve, summary
from bench.train_router import choose_c, fit
from routing.learned import GainModel, LogisticModel

TEST_SHARE = 0.2


def embeddings(records: Records) -> np.ndarray:
    def embed(prompts: list[str]) -> np.ndarray:
        from cache.embedder import load_sentence_model

        print(f"embedding {len(prompts)} prompts with MiniLM (cached afterwards)...", file=sys.stderr)
        model = load_sentence_model(None, torch_threads=os.cpu_count())
        return model.encode(prompts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)

    return cached_embeddings(records.prompts, embed)


def splits(records: Records, seed: int = 0) -> dict[str, np.ndarray]:
    """Test masks: a random 20 %, and every fifth subject held out whole (unseen subjects)."""
    rng = np.random.default_rng(seed)
    subjects = sorted(set(records.subjects.tolist()))
    held_subjects = set(subjects[2::5])
    return {"random": rng.random(len(records.prompts)) < TEST_SHARE,
            "by-subject": np.isin(records.subjects, list(held_subjects))}  # fmt: skip


def strong_need(model: GainModel, x: np.ndarray) -> np.ndarray:
    """The router's score: the expected gain of sending the question to the strong model."""
    return -model.confidence(x)


def train(x: np.ndarray, records: Records) -> GainModel:
    """One logistic model per model's correctness; regularisation chosen on a validation slice."""

    def val_apgr(model: LogisticModel, idx: np.ndarray) -> float:
        return routing_curve(-model.predict(x[idx]), records.weak[idx], records.strong[idx]).apgr()

    c = choose_c(x, records.weak, val_apgr)
    return GainModel(fit(x, records.weak, c, False), fit(x, records.strong, c, False))


def train_replay_router() -> GainModel:
    """The shipped router: trained on the random split's training part."""
    records = load_records()
    x = embeddings(records)
    test = splits(records)["random"]
    return train(x[~test], records.take(~test))


def evaluate_split(name: str, x: np.ndarray, records: Records, test: np.ndarray) -> dict:
    held = records.take(test)
    model = train(x[~test], records.take(~test))
    curves: dict[str, Curve] = {
        "random": random_curve(held.weak, held.strong),
        "learned (MiniLM+LR)": routing_curve(strong_need(model, x[test]), held.weak, held.strong),
        "oracle": routing_curve(oracle_scores(held.weak, held.strong), held.weak, held.strong),
    }
    rows = [summary(router, curve) for router, curve in curves.items()]
    title = (f"split {name}: train {int((~test).sum())}, held-out {int(test.sum())} questions; "
             f"weak {held.weak.mean():.3f}, strong {held.strong.mean():.3f} correct")  # fmt: skip
    print_table(title, rows)
    print_curve(curves["learned (MiniLM+LR)"])
    return {"split": name, "train": int((~test).sum()), "test": int(test.sum()), "rows": rows}


def print_curve(curve: Curve) -> None:
    points = [f"{int(p * 100)}%:{curve.at(p):.3f}" for p in np.linspace(0, 1, 11)]
    print("  learned quality at strong share  " + "  ".join(points))


def replay() -> None:
    records = load_records()
    x = embeddings(records)
    results = [evaluate_split(name, x, records, test) for name, test in splits(records).items()]
    write("replay", {"questions": len(records.prompts), "splits": results})


def write(mode: str, payload: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"cascade_eval_{mode}.json"
    path.write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {path}")


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=["replay", "live"])
    args, rest = parser.parse_known_args()
    if args.mode == "replay":
        replay()
    else:
        from bench.cascade_live import main as live_main

        write("live", live_main(rest))


if __name__ == "__main__":
    main()
