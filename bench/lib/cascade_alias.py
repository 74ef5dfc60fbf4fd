"""`cascade_eval alias`: a cascade alias live through the official `openai` client, beside its replay from the
set's record.

    LLMGW_CONFIG_FILE=bench/cascade_live.yaml LLMGW_PORT=8731 .venv/bin/llmgw serve &   # a fresh gateway
    .venv/bin/python -m bench.cascade_eval live --set basic_skills3 --max-tokens 5         # the record, first
    .venv/bin/python -m bench.cascade_eval alias --set basic_skills3 --alias auto-40 --limit 400 --max-tokens 5

The set's first `--limit` questions go one at a time to the alias's `/v1/completions` (the prompt, tokens and
stop of `cascade_eval live`), so the cascade sees them in the set's order. Each reply's `x-cascade` header says
whether SmolLM2's answer was kept ("small") or Gemma answered ("escalated"); the answer is graded as in the
record. The replay runs the record's SmolLM2 answers through the shipped confidence and the class the gateway
runs (routing/escalation.py), in the same order, from an empty window: so the gateway must be fresh (no request
to the alias before). Reported: the share escalated and the accuracy, live and replayed, and the decisions that
agree. Written to bench/results/cascade_alias_<set>_<alias>.json.
"""

import argparse
import json
import time
from typing import Any

import numpy as np
from openai import OpenAI

from bench.lib.cascade_common import escalations, transferred
from bench.lib.cascade_curves import outcomes
from bench.lib.cascade_live import gateway_settings, load_record
from bench.lib.routellm_data import RESULTS
from bench.lib.trivia_data import SETS, is_correct, load_questions, prompt


def replay(config: str, alias: str, name: str, limit: int | None) -> dict[str, np.ndarray]:
    """The alias's decisions on the recorded answers, in the set's order: True where it escalates."""
    cascade = next(c for c in gateway_settings(config).routing.cascades if c.alias == alias)
    rule = cascade.confidence
    if rule.method != "learned":
        raise SystemExit(f"{alias}: the replay knows the learned confidence only, not {rule.method!r}")
    saved, questions = load_record(name), load_questions(name)[:limit]
    _, weak, strong, _, _ = outcomes(saved, questions)
    escalate = escalations(transferred(questions, saved["answers"][saved["small"]]), rule)
    return {"escalated": escalate, "correct": np.where(escalate, strong, weak)}


def ask(client: OpenAI, args: argparse.Namespace, question: dict[str, Any]) -> dict[str, Any]:
    raw = client.completions.with_raw_response.create(
        model=args.alias, prompt=prompt(question), temperature=0, max_tokens=args.max_tokens, stop=["\n"]
    )
    text = raw.parse().choices[0].text
    return {"id": question["id"], "cascade": raw.headers.get("x-cascade"), "text": text,
            "correct": is_correct(question, text)}  # fmt: skip


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(
        prog="cascade_eval alias", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gateway", default="http://127.0.0.1:8731")
    parser.add_argument("--key", default="sk-llmgw-local")
    parser.add_argument("--config", default="bench/cascade_live.yaml")
    parser.add_argument("--set", default="basic_skills3", choices=sorted(SETS))
    parser.add_argument("--alias", default="auto-40")
    parser.add_argument("--limit", type=int, default=400)
    parser.add_argument("--max-tokens", type=int, default=5)
    args = parser.parse_args(argv)
    expected = replay(args.config, args.alias, args.set, args.limit)
    client = OpenAI(base_url=args.gateway.rstrip("/") + "/v1", api_key=args.key, max_retries=0, timeout=120)
    started = time.monotonic()
    answers = [ask(client, args, q) for q in load_questions(args.set)[: args.limit]]
    seconds = time.monotonic() - started
    live = np.array([a["cascade"] == "escalated" for a in answers])
    result = {
        "set": args.set, "alias": args.alias, "questions": len(answers), "seconds": round(seconds, 1),
        "outcomes": {o: sum(a["cascade"] == o for a in answers) for o in {a["cascade"] for a in answers}},
        "live": {"escalated": float(live.mean()), "accuracy": float(np.mean([a["correct"] for a in answers]))},
        "replay": {"escalated": float(expected["escalated"].mean()), "accuracy": float(expected["correct"].mean())},
        "decisions_agree": int((live == expected["escalated"]).sum()),
        "answers": answers,
    }  # fmt: skip
    print(
        f"{args.alias} on {args.set}, {len(answers)} questions through the openai client in {seconds:.0f} s"
    )
    print(f"{'':8} {'escalated':>10} {'accuracy':>9}")
    for kind in ("live", "replay"):
        print(f"{kind:8} {result[kind]['escalated']:>10.3f} {result[kind]['accuracy']:>9.4f}")
    print(
        f"decisions that agree: {result['decisions_agree']} of {len(answers)}; x-cascade: {result['outcomes']}"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"cascade_alias_{args.set}_{args.alias}.json").write_text(json.dumps(result, indent=1))
    return result
