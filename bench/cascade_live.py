"""Live cascade evaluation: our labeled task set answered by a small and a large model through the gateway.

    .venv/bin/python -m bench.cascade_eval live --gateway http://127.0.0.1:8000 --key sk-llmgw-local \\
        --small smollm2-int4 --large smollm2-fp32 [--config llmgw.yaml] [--limit 343]

Each answer is recorded once (with token logprobs, temperature 0) through the gateway's HTTP API and
cached in bench/results/, so re-runs only re-score. Prices come from the gateway config's deployments.
Confidence methods compared: mean token logprob, minimum sliding-window logprob, the learned scorer
(MiniLM embedding + logprob statistics, out-of-fold) and the learned router (embedding only, decided
before the small model is called, so routed questions cost no small attempt).
"""

import argparse
import asyncio
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from bench.routellm_data import RESULTS
from bench.routing_curves import Curve, oracle_scores, print_table, random_curve, routing_curve, summary
from bench.train_router import fit
from routing.confidence import choice_logprobs, mean_logprob, min_window
from routing.learned import LogisticModel, logprob_features

TASKS = Path(__file__).resolve().parent.parent / "tests" / "data" / "cascade_tasks.jsonl"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_WORD = re.compile(r"[a-z]+")


def load_tasks(path: Path = TASKS) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def is_correct(task: dict[str, Any], text: str) -> bool:
    """Checkable short answers: the first number, the first yes/no, or the answer text in the first line."""
    first_line = next((line for line in text.strip().splitlines() if line.strip()), "").lower()
    if task["check"] == "number":
        found = _NUMBER.search(first_line.replace(",", ""))
        return bool(found) and float(found.group()) == float(task["answer"])
    if task["check"] == "yesno":
        word = next((w for w in _WORD.findall(first_line) if w in ("yes", "no")), None)
        return word == task["answer"]
    wanted = [task["answer"], *task["aliases"]]
    return any(re.search(rf"(?<![a-z]){re.escape(w.lower())}(?![a-z])", first_line) for w in wanted)


# --- recording ------------------------------------------------------------------------------------


async def record(args: argparse.Namespace, alias: str, tasks: list[dict[str, Any]]) -> dict[str, dict]:
    """One answer per task from `alias`, cached in bench/results (appended as they come, so runs resume)."""
    path = RESULTS / f"cascade_live_{alias}_{_digest(args.gateway, alias, tasks)}.jsonl"
    done = {r["id"]: r for r in map(json.loads, path.read_text().splitlines())} if path.exists() else {}
    todo = [t for t in tasks if t["id"] not in done]
    headers = {"authorization": f"Bearer {args.key}"}
    limit = asyncio.Semaphore(args.concurrency)
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=600)) as session:
        with path.open("a") as out:

            async def one(task: dict[str, Any]) -> None:
                async with limit:
                    result = await _ask(session, args, alias, task)
                done[task["id"]] = result
                out.write(json.dumps(result) + "\n")
                out.flush()

            await asyncio.gather(*(one(t) for t in todo))
    return done


async def _ask(session: aiohttp.ClientSession, args: argparse.Namespace, alias: str, task: dict) -> dict:
    body = {"model": alias, "messages": [{"role": "user", "content": task["question"]}], "temperature": 0,
            "max_tokens": args.max_tokens, "logprobs": True}  # fmt: skip
    async with session.post(args.gateway.rstrip("/") + "/v1/chat/completions", json=body) as response:
        data = await response.json()
        if response.status != 200:
            raise RuntimeError(f"{alias} answered {response.status}: {data}")
    choice = data["choices"][0]
    text = choice["message"]["content"] or ""
    usage = data.get("usage") or {}
    return {"id": task["id"], "text": text, "logprobs": choice_logprobs(choice), "correct": is_correct(task, text),
            "prompt_tokens": usage.get("prompt_tokens", 0), "completion_tokens": usage.get("completion_tokens", 0)}  # fmt: skip


def _digest(gateway: str, alias: str, tasks: list[dict[str, Any]]) -> str:
    text = gateway + alias + "".join(t["id"] + t["question"] for t in tasks)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# --- evaluation -----------------------------------------------------------------------------------


def prices(config: str | None, alias: str) -> tuple[float, float]:
    """USD per 1M prompt/completion tokens of the alias's first deployment in the gateway config."""
    from gateway.settings import load_settings

    settings = load_settings(**({"config_file": config} if config else {}))
    model = settings.model(alias)
    if model is None:
        return 0.0, 0.0
    deployment = model.deployments[0]
    return deployment.input_price_per_1m, deployment.output_price_per_1m


def costs(records: list[dict], price: tuple[float, float]) -> np.ndarray:
    return np.array(
        [(r["prompt_tokens"] * price[0] + r["completion_tokens"] * price[1]) / 1e6 for r in records]
    )


def out_of_fold(features: np.ndarray, labels: np.ndarray, folds: int = 5) -> np.ndarray:
    """P(small is good) for every task from a model that never saw it."""
    fold = np.arange(len(labels)) % folds
    scores = np.zeros(len(labels))
    for k in range(folds):
        train = fold != k
        model = fit(features[train], labels[train], c=0.1, uses_logprobs=False)
        scores[~train] = model.predict(features[~train])
    return scores


def train_cascade_scorer() -> LogisticModel:
    """The shipped cascade scorer: all live records of the last run (bench/results/cascade_live_last.json)."""
    last = json.loads((RESULTS / "cascade_live_last.json").read_text())
    tasks = {t["id"]: t for t in load_tasks()}
    small = last["small_records"]
    x = np.hstack([_embed([tasks[r["id"]]["question"] for r in small]),
                   np.stack([logprob_features(r["logprobs"]) for r in small])])  # fmt: skip
    return fit(x, np.array([r["correct"] for r in small], float), c=0.1, uses_logprobs=True)


def _embed(texts: list[str]) -> np.ndarray:
    from cache.embedder import load_sentence_model

    model = load_sentence_model(None, torch_threads=2)
    return np.asarray(model.encode(texts, normalize_embeddings=True, convert_to_numpy=True), dtype=np.float32)


def evaluate(tasks: list[dict], small: list[dict], large: list[dict], price_s: tuple, price_l: tuple) -> dict:
    weak = np.array([r["correct"] for r in small], float)
    strong = np.array([r["correct"] for r in large], float)
    cost_s, cost_l = costs(small, price_s), costs(large, price_l)
    embeddings = _embed([t["question"] for t in tasks])
    stats = np.stack([logprob_features(r["logprobs"]) for r in small])
    confidence = {
        "mean_logprob": np.array([mean_logprob(r["logprobs"]) for r in small]),
        "min_window(4)": np.array([min_window(r["logprobs"], 4) for r in small]),
        "learned (emb+logprobs)": out_of_fold(np.hstack([embeddings, stats]), weak),
        "router (emb, pre-call)": out_of_fold(embeddings, weak),
    }
    curves = {"random": random_curve(weak, strong)}
    curves |= {name: routing_curve(-score, weak, strong) for name, score in confidence.items()}
    curves["oracle"] = routing_curve(oracle_scores(weak, strong), weak, strong)
    rows = [
        summary(name, c) | _cost_columns(name, c, confidence, cost_s, cost_l) for name, c in curves.items()
    ]
    print_table(f"live: {len(tasks)} tasks; small {weak.mean():.3f}, large {strong.mean():.3f} correct; "
                f"large-only cost ${cost_l.sum():.6f}", rows)  # fmt: skip
    return {"tasks": len(tasks), "small_correct": weak.mean(), "large_correct": strong.mean(), "rows": rows,
            "by_type": _by_type(tasks, weak, strong)}  # fmt: skip


def _cost_columns(name: str, curve: Curve, confidence: dict, cost_s: np.ndarray, cost_l: np.ndarray) -> dict:
    """Cost at CPT(80%) relative to large-only; cascades pay every small attempt, the router does not."""
    share = curve.cpt(0.8)
    if name not in confidence:
        return {"cost@cpt80": round(share, 4)}  # random/oracle: large share only, no small attempts
    order = np.argsort(confidence[name], kind="stable")  # least confident first = escalated first
    escalated = order[: int(round(share * len(order)))]
    small_paid = cost_s.sum() - (cost_s[escalated].sum() if name.startswith("router") else 0.0)
    return {"cost@cpt80": round(float((small_paid + cost_l[escalated].sum()) / cost_l.sum()), 4)}


def _by_type(tasks: list[dict], weak: np.ndarray, strong: np.ndarray) -> dict[str, dict[str, float]]:
    kinds = sorted({t["type"] for t in tasks})
    mask = {k: np.array([t["type"] == k for t in tasks]) for k in kinds}
    return {k: {"small": float(weak[m].mean()), "large": float(strong[m].mean())} for k, m in mask.items()}


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="cascade_eval live")
    parser.add_argument("--gateway", default="http://127.0.0.1:8000")
    parser.add_argument("--key", default="sk-llmgw-local")
    parser.add_argument("--small", required=True)
    parser.add_argument("--large", required=True)
    parser.add_argument("--config", default=None, help="gateway YAML for prices (default: LLMGW_CONFIG_FILE)")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    tasks = load_tasks()[: args.limit]
    small = asyncio.run(record(args, args.small, tasks))
    large = asyncio.run(record(args, args.large, tasks))
    small_records, large_records = [small[t["id"]] for t in tasks], [large[t["id"]] for t in tasks]
    result = evaluate(tasks, small_records, large_records, prices(args.config, args.small),
                      prices(args.config, args.large))  # fmt: skip
    (RESULTS / "cascade_live_last.json").write_text(json.dumps({"small_records": small_records}))
    return {"small": args.small, "large": args.large, **result}
