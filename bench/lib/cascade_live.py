"""Live cascade SmolLM2-135M → Gemma 3 270M through the gateway, on TriviaQA and the other question sets.

    # the gateway with both models in our engine (two local-engine deployments, prices in the YAML):
    LLMGW_CONFIG_FILE=bench/cascade_live.yaml LLMGW_PORT=8731 .venv/bin/llmgw serve &
    .venv/bin/python -m bench.cascade_eval live --gateway http://127.0.0.1:8731   # record once, then score
    .venv/bin/python -m bench.cascade_eval live --offline                          # score the record only
    .venv/bin/python -m bench.lib.cascade_live --offline --set lambada                 # the same, this module alone

Each model answers every question once through `/v1/completions` (3-shot, temperature 0, max_tokens 8,
stop at the newline, logprobs with the top-2 alternatives). The answers, token logprobs, top-1 − top-2
margins and usage are kept in bench/results/cascade_live_record.json; every curve is computed offline from
that record (bench/lib/cascade_curves.py): each model alone, the cascade with mean-logprob confidence, with
the learned confidence (cross-fitted over quiz sites), and random escalation at the same rates.
"""

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import yaml

from bench.lib.cascade_common import RECORD, load_record, record_path  # noqa: F401 (RECORD: the TriviaQA record)
from bench.lib.routellm_data import RESULTS
from bench.lib.trivia_data import SETS, is_correct, load_questions, prompt
from routing.confidence import choice_logprobs, choice_margins

if TYPE_CHECKING:
    from gateway.settings import Settings


async def record_model(args: argparse.Namespace, alias: str, questions: list[dict]) -> dict[str, dict]:
    headers = {"authorization": f"Bearer {args.key}"}
    limit = asyncio.Semaphore(args.concurrency)
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=900)) as session:

        async def one(question: dict[str, Any]) -> tuple[str, dict]:
            async with limit:
                return question["id"], await _ask(session, args, alias, question)

        return dict(await asyncio.gather(*(one(q) for q in questions)))


async def _ask(session: aiohttp.ClientSession, args: argparse.Namespace, alias: str, question: dict) -> dict:
    body = {"model": alias, "prompt": prompt(question), "temperature": 0, "max_tokens": args.max_tokens,
            "stop": ["\n"], "logprobs": 2}  # fmt: skip
    async with session.post(args.gateway.rstrip("/") + "/v1/completions", json=body) as response:
        data = await response.json()
        if response.status != 200:
            raise RuntimeError(f"{alias} answered {response.status}: {data}")
    choice, usage = data["choices"][0], data.get("usage") or {}
    return {"text": choice["text"], "correct": is_correct(question, choice["text"]),
            "logprobs": [round(x, 4) for x in choice_logprobs(choice)],
            "margins": [round(x, 4) for x in choice_margins(choice)],
            "prompt_tokens": usage.get("prompt_tokens", 0), "completion_tokens": usage.get("completion_tokens", 0)}  # fmt: skip


def gateway_settings(config: str) -> "Settings":
    from gateway.settings import Settings

    return Settings(**yaml.safe_load(Path(config).read_text()))


def prices(config: str, alias: str) -> tuple[float, float]:
    """USD per 1M prompt/completion tokens of the alias's first deployment in the gateway config."""
    model = gateway_settings(config).model(alias)
    if model is None:
        raise SystemExit(f"no model {alias!r} in the gateway config")
    deployment = model.deployments[0]
    return deployment.input_price_per_1m, deployment.output_price_per_1m


def learned_threshold(config: str) -> float | None:
    """The threshold of the config's first cascade with the learned confidence (the `auto` alias)."""
    cascades = gateway_settings(config).routing.cascades
    return next((c.confidence.threshold for c in cascades if c.confidence.method == "learned"), None)


def record(args: argparse.Namespace) -> dict[str, Any]:
    """Both models on every question, once; a finished model's answers are kept if the run is resumed."""
    questions, path = load_questions(args.set)[: args.limit], record_path(args.set)
    saved = json.loads(path.read_text()) if path.exists() else {"answers": {}, "seconds": {}}
    for alias in (args.small, args.large):
        answers = saved["answers"].get(alias, {})
        if all(q["id"] in answers for q in questions):
            continue
        started = time.monotonic()
        answers |= asyncio.run(record_model(args, alias, [q for q in questions if q["id"] not in answers]))
        saved["seconds"][alias] = round(time.monotonic() - started, 1)
        saved["answers"][alias] = answers
        saved |= {"small": args.small, "large": args.large,
                  "prices": {a: prices(args.config, a) for a in (args.small, args.large)},
                  "request": {"max_tokens": args.max_tokens, "concurrency": args.concurrency}}  # fmt: skip
        RESULTS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(saved, separators=(",", ":")))
        print(f"{alias}: {len(questions)} answers in {saved['seconds'][alias]} s", flush=True)
    return saved


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="cascade_eval live")
    parser.add_argument("--gateway", default="http://127.0.0.1:8731")
    parser.add_argument("--key", default="sk-llmgw-local")
    parser.add_argument("--small", default="smollm2")
    parser.add_argument("--large", default="gemma3")
    parser.add_argument("--config", default="bench/cascade_live.yaml", help="gateway YAML (prices)")
    parser.add_argument("--set", default="trivia_qa", choices=sorted(SETS))
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--offline", action="store_true", help="score the saved record only")
    args = parser.parse_args(argv)
    if not args.offline:
        record(args)
    from bench.lib.cascade_curves import evaluate

    questions = load_questions(args.set)[: args.limit]
    transfer = args.set != "trivia_qa"
    return {"set": args.set} | evaluate(
        load_record(args.set), questions, transfer=transfer, threshold=learned_threshold(args.config)
    )


if __name__ == "__main__":
    import sys

    from bench.lib.cascade_common import write_live

    write_live(main(sys.argv[1:]))
