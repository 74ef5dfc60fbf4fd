"""A third routing task, never used to train or choose the router: GSM8K answered by the same two models.

RouteLLM (lm-sys/RouteLLM, Apache-2.0) recorded whether Mixtral-8x7B-Instruct (weak) and GPT-4-1106 (strong)
answered each GSM8K test question (MIT) correctly: `routellm/evals/gsm8k/gsm8k_responses.csv`. The repository
keeps only what routing needs (prompt, weak correct, strong correct; contaminated prompts left out, as
RouteLLM's own evaluation does) in bench/data/routellm_gsm8k/records.csv:

    .venv/bin/python -m bench.lib.routellm_gsm8k build --responses PATH/gsm8k_responses.csv \\
        --contaminated PATH/contaminated_prompts.jsonl
    .venv/bin/python -m bench.lib.routellm_gsm8k score     # the shipped router, unchanged, beside the baselines

`score` prints APGR with bootstrap 95 % intervals for random routing, the length heuristic and the shipped
routing/models/router_lr.npz, and writes bench/results/router_gsm8k.json.
"""

import argparse
import csv
import json
from pathlib import Path

from bench.lib.cross_task import print_rows, public, rows_for, shipped_need
from bench.lib.routellm_data import GSM8K_RECORDS as RECORDS
from bench.lib.routellm_data import REPO, RESULTS, STRONG_COLUMN, WEAK_COLUMN, _contaminated, load_gsm8k

ROUTER = REPO / "routing" / "models" / "router_lr.npz"


def build(responses: Path, contaminated: Path, out: Path = RECORDS) -> int:
    excluded = _contaminated(contaminated)
    with responses.open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["prompt"] not in excluded]
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["prompt", "weak_correct", "strong_correct"])
        for row in rows:
            writer.writerow(
                [row["prompt"], int(row[WEAK_COLUMN] == "True"), int(row[STRONG_COLUMN] == "True")]
            )
    return len(rows)


def gsm8k_rows(router: Path = ROUTER) -> list[dict]:
    """Random, the length heuristic and the router's APGR rows on GSM8K (bootstrap replicates kept)."""
    from bench.lib.cascade_common import embed_minilm
    from bench.lib.cross_task import other_task_data

    records = load_gsm8k()
    need = shipped_need(router, records, embed_minilm)
    data = other_task_data(records, None)
    return rows_for("GSM8K (never used)", need, data, data.text[:, 0], "shipped router")


def score(router: Path = ROUTER) -> list[dict]:
    records = load_gsm8k()
    rows = gsm8k_rows(router)
    print(f"GSM8K: {len(records.prompts)} questions; weak correct {records.weak.mean():.3f}, "
          f"strong {records.strong.mean():.3f}")  # fmt: skip
    print_rows(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"router": str(router.relative_to(REPO)), "questions": len(records.prompts),
               "weak_accuracy": records.weak.mean(), "strong_accuracy": records.strong.mean(),
               "rows": public(rows)}  # fmt: skip
    (RESULTS / "router_gsm8k.json").write_text(json.dumps(payload, indent=1) + "\n")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("build")
    make.add_argument("--responses", type=Path, required=True)
    make.add_argument("--contaminated", type=Path, required=True)
    sub.add_parser("score")
    args = parser.parse_args()
    if args.command == "build":
        print(f"{build(args.responses, args.contaminated)} questions → {RECORDS.relative_to(REPO)}")
    else:
        score()


if __name__ == "__main__":
    main()
