"""`semantic_cache_eval http`: semantic cache quality measured through the gateway's HTTP API, as an outside
checker sees it.

One fresh gateway per pair file (default settings but for the semantic cache, which is off by default and
here in static mode: shipped encoder and verifier at the default semantic_min_precision; bench/lib/cache_gateway.py's
config; `--env LLMGW_CACHE__DEFAULTS__SEMANTIC__MODE=off` for the true default) in front of the fake upstream, which echoes the question, so
every question gets its own answer and the served answer names the entry that served it. Per file
(jsonl rows {"a", "b", "label", "kind"}, as bench/lib/verifier_pairs.py's load_set reads them):
  1. store — every distinct "a" once, sequentially (chat completion, one user message, temperature 0)
     with `cache-control: no-cache`: no lookup, so an "a" that resembles an earlier one is still fetched
     and stored under its own answer (status "bypass"); the answer text is kept per "a". Then every "a"
     is asked again with `no-store` and must come back as an exact "hit" (stored = those that did).
  2. ask — every distinct "b" once, in file order, with `cache-control: no-store`: the gateway looks up
     (exact, then semantic) but stores nothing, so each "b" meets a cache holding only the "a" entries
     and a missed "b" cannot serve a later one. The reply's x-cache-status is "hit" (exact),
     "semantic-hit" or "miss"; hits and misses are timed from the client side.
Scoring, per row (a "b" may hit any stored entry, not only its own "a"):
  correct hit — label 1 and the served answer is the one stored for this row's "a";
  false hit   — label 0 and any hit, or label 1 and a hit serving another question's answer (counted
                apart as `wrong_entry`, even when that other question might have the same answer).
precision = correct / all hits; precision_semantic leaves out exact hits (a "b" identical to another
row's "a": the answer served is then right, though the row counts it false); recall = correct / label-1
rows; false-hit rate per kind = false hits / rows of that kind; each with a 95 % bootstrap interval
(rows resampled, 1000 draws, seed 0). The JSON also lists every false hit and whose answer it served.

    python -m bench.semantic_cache_eval http [--pairs FILE ...] [--name NAME] [--limit N]
        [--env LLMGW_CACHE__DEFAULTS__SEMANTIC_MIN_PRECISION=0.95 ...]
Default files: bench/data/indep_questions2/ and indep_questions/ pairs.jsonl (when present), tests/data/semantic_pairs.jsonl,
bench/data/paws_sample/pairs.jsonl. --env sets the gateway's environment (e.g. another threshold).
Writes bench/results/semantic_cache_http.json (semantic_cache_http_NAME.json with --name).
"""

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.lib.cache_gateway import KEY, body, config
from bench.lib.harness import ROOT, start_fake_upstream, start_gateway, write_json

BOOTSTRAP = 1000
HITS = ("hit", "semantic-hit")
DEFAULT_FILES = (
    "bench/data/indep_questions2/pairs.jsonl",
    "bench/data/indep_questions/pairs.jsonl",
    "tests/data/semantic_pairs.jsonl",
    "bench/data/paws_sample/pairs.jsonl",
)


def outcomes(rows: list[dict], replies: dict[str, dict], answers: dict[str, str]) -> dict[str, np.ndarray]:
    """Per row: hit, correct (label 1, own answer served), false (label 0 hit, or label 1 hit with another
    question's answer), wrong_entry (the latter). replies: b -> {"status", "answer"}; answers: a -> answer."""
    hit = np.array([replies[r["b"]]["status"] in HITS for r in rows], dtype=bool)
    labels = np.array([int(r["label"]) for r in rows])
    own = np.array([replies[r["b"]]["answer"] == answers.get(r["a"]) for r in rows], dtype=bool)
    correct = hit & (labels == 1) & own
    wrong_entry = hit & (labels == 1) & ~own
    return {"hit": hit, "label": labels, "kind": np.array([r["kind"] for r in rows]),
            "correct": correct, "false": hit & ~correct, "wrong_entry": wrong_entry,
            "exact": np.array([replies[r["b"]]["status"] == "hit" for r in rows], dtype=bool)}  # fmt: skip


def point(o: dict[str, np.ndarray], idx: np.ndarray, kinds: list[str]) -> dict[str, float]:
    hit, correct, false, labels, kind = (o[k][idx] for k in ("hit", "correct", "false", "label", "kind"))
    semantic = hit & ~o["exact"][idx]
    hits, positives = int(hit.sum()), int((labels == 1).sum())
    out = {
        "precision": int(correct.sum()) / hits if hits else 1.0,  # as semantic_cache_eval: no hit, no error
        "precision_semantic": int((correct & semantic).sum()) / int(semantic.sum())
        if semantic.any()
        else 1.0,
        "recall": int(correct.sum()) / positives if positives else float("nan"),
    }
    for k in kinds:
        of_kind = kind == k
        out[f"fhr_{k}"] = float(false[of_kind].mean()) if of_kind.any() else float("nan")
    return out


def scores(o: dict[str, np.ndarray], seed: int = 0, draws: int = BOOTSTRAP) -> dict[str, Any]:
    """Point values and 95 % bootstrap intervals (rows resampled) of precision, recall, fhr per kind."""
    kinds = sorted({str(k) for k in o["kind"]})
    n = len(o["hit"])
    result: dict[str, Any] = {name: {"value": v} for name, v in point(o, np.arange(n), kinds).items()}
    rng = np.random.default_rng(seed)
    samples = [point(o, rng.integers(0, n, n), kinds) for _ in range(draws)]
    for name in list(result):
        values = np.array([s[name] for s in samples], dtype=float)
        values = values[~np.isnan(values)]
        ci = [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))] if len(values) else None
        result[name]["ci"] = ci
    result.update(rows=n, hits=int(o["hit"].sum()), correct=int(o["correct"].sum()),
                  false_hits=int(o["false"].sum()), wrong_entry=int(o["wrong_entry"].sum()),
                  label1=int((o["label"] == 1).sum()))  # fmt: skip
    result["kind_rows"] = {k: int((o["kind"] == k).sum()) for k in kinds}
    result["kind_labels"] = {k: sorted({int(y) for y in o["label"][o["kind"] == k]}) for k in kinds}
    return result


def p50_ms(samples: list[float]) -> float | None:
    return statistics.median(samples) * 1000 if samples else None


def ask(client: httpx.Client, question: str, cache_control: str) -> dict[str, Any]:
    start = time.perf_counter()
    reply = client.post(
        "/v1/chat/completions", json=body(question, 0), headers={"cache-control": cache_control}
    )
    elapsed = time.perf_counter() - start
    reply.raise_for_status()
    answer = reply.json()["choices"][0]["message"]["content"]
    return {"status": reply.headers.get("x-cache-status", ""), "answer": answer, "seconds": elapsed}


def measure(rows: list[dict], env: dict[str, str]) -> dict[str, Any]:
    """One fresh gateway: store every distinct a (no-cache), check them, ask every distinct b (no-store)."""
    stored_questions = list(dict.fromkeys(r["a"] for r in rows))
    asked_questions = list(dict.fromkeys(r["b"] for r in rows))
    upstream = start_fake_upstream()
    gateway = start_gateway(config(upstream), env=env)
    try:
        with httpx.Client(
            base_url=gateway.url, headers={"authorization": f"Bearer {KEY}"}, timeout=120
        ) as client:
            start = time.perf_counter()
            answers = {a: ask(client, a, "no-cache")["answer"] for a in stored_questions}
            time.sleep(0.5)  # stores finish after the reply
            checked = [ask(client, a, "no-store") for a in stored_questions]
            stored = sum(
                c["status"] == "hit" and c["answer"] == answers[a]
                for a, c in zip(stored_questions, checked, strict=True)
            )
            store_s = time.perf_counter() - start
            start = time.perf_counter()
            replies = {b: ask(client, b, "no-store") for b in asked_questions}
            ask_s = time.perf_counter() - start
    finally:
        gateway.stop()
        upstream.stop()
    statuses: dict[str, int] = {}
    for r in replies.values():
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    o = outcomes(rows, replies, answers)
    result = scores(o)
    served_for = {answer: a for a, answer in answers.items()}  # which stored question an answer belongs to
    result["false_hit_rows"] = [
        {
            **row,
            "status": replies[row["b"]]["status"],
            "served_for": served_for.get(replies[row["b"]]["answer"]),
        }
        for row, false in zip(rows, o["false"], strict=True)
        if false
    ]
    result.update(
        stored=stored, distinct_a=len(stored_questions), asked=len(asked_questions), statuses=statuses,
        hit_p50_ms=p50_ms([r["seconds"] for r in replies.values() if r["status"] in HITS]),
        miss_p50_ms=p50_ms([r["seconds"] for r in replies.values() if r["status"] not in HITS]),
        store_seconds=store_s, ask_seconds=ask_s,
    )  # fmt: skip
    return result


def _cell(cell: dict[str, Any]) -> str:
    low, high = cell["ci"] or (float("nan"), float("nan"))
    return f"{cell['value']:.3f} [{low:.3f}, {high:.3f}]"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def print_table(name: str, r: dict[str, Any]) -> None:
    print(f"\n== {name}: {r['rows']} rows, stored {r['stored']}/{r['distinct_a']} a, asked {r['asked']} b ==")
    print(f"statuses {r['statuses']}; hits {r['hits']} (correct {r['correct']}, false {r['false_hits']}, "
          f"of them label-1 hits serving another question's answer: {r['wrong_entry']})")  # fmt: skip
    print(f"{'precision of hits':40} {_cell(r['precision'])}")
    print(f"{'  of semantic hits only':40} {_cell(r['precision_semantic'])}")
    print(f"{'recall on paraphrases':40} {_cell(r['recall'])}  ({r['correct']}/{r['label1']})")
    for kind, rows in r["kind_rows"].items():
        label = "+".join(str(y) for y in r["kind_labels"][kind])
        print(f"{'false-hit rate ' + kind + f' (label {label})':40} {_cell(r['fhr_' + kind])}  n={rows}")
    print(f"client p50: hit {_ms(r['hit_p50_ms'])}, miss {_ms(r['miss_p50_ms'])}; "
          f"store {r['store_seconds']:.1f} s, ask {r['ask_seconds']:.1f} s")  # fmt: skip


def main(argv: list[str]) -> None:
    from bench.lib.verifier_pairs import load_set  # late: it imports the verifier's training code

    parser = argparse.ArgumentParser(prog="semantic_cache_eval http", description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=Path, nargs="*", help="jsonl files (default: see the docstring)")
    parser.add_argument("--name", default="", help="label: writes semantic_cache_http_NAME.json")
    parser.add_argument("--limit", type=int, default=0, help="first N rows per file (0: all)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="gateway environment")
    args = parser.parse_args(argv)
    env = dict(item.split("=", 1) for item in args.env)
    files = args.pairs or [ROOT / f for f in DEFAULT_FILES]
    report: dict[str, Any] = {"name": args.name, "env": env, "limit": args.limit, "files": {}}
    started = time.perf_counter()
    for path in files:
        if not path.exists():
            if args.pairs:
                raise SystemExit(f"{path} does not exist")
            print(f"\nskipping {path.relative_to(ROOT)}: not there (yet)")
            continue
        rows = load_set(path)[: args.limit or None]
        key = str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)
        report["files"][key] = measure(rows, env)
        print_table(key, report["files"][key])
    report["seconds"] = time.perf_counter() - started
    report["load_average"] = os.getloadavg()
    path = write_json("semantic_cache_http" + (f"_{args.name}" if args.name else ""), report)
    print(f"\ntook {report['seconds']:.0f} s; wrote {path}")
