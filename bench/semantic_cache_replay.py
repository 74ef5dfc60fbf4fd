"""The semantic cache on a stream of traffic, through the gateway's HTTP API: the same intent asked many
ways over time, plus look-alikes, replayed once per mode (off, static, verified at each δ) in one run.

The stream. Question pairs (jsonl {"a", "b", "label"}) are joined into intents: texts linked by label-1
pairs are one intent (union-find); every other text is an intent of its own, so a label-0 "b" is a
look-alike of its "a" with another answer. Requests draw an intent by a Zipf law (exponent --zipf over a
seeded random order of the intents) and then one of its phrasings uniformly: popular intents come back
often and in many wordings, as in real traffic. Sets: `natural` (bench/data/natural_pairs: ComQA
clusters of real WikiAnswers questions, AmbigQA rewrites, user-style look-alikes), `written`
(bench/data/indep_questions*, tests/data/semantic_pairs.jsonl: hand-written paraphrases and look-alikes),
`templates` (bench/lib/verifier_templates.py: each intent × slot value with its phrasings, look-alikes being
other slot values; the verifier was trained on such pairs, so this is its best case, as templated
application traffic would be).

The upstream answers by intent: the same answer text for every phrasing of one intent, another for each
other intent (a deterministic model at temperature 0 whose answers depend on the meaning only). So a
served hit is right exactly when its answer is the asking intent's, and verified mode's exact answer
comparison (LLMGW_CACHE__VERIFIED__ANSWER_MATCH=exact) labels outcomes without error; this is the
best case for its labels, not for its decisions.

Reported per mode, cumulatively at each checkpoint and over the window since the previous one:
semantic hits, wrong ones (another intent's answer), the wrong-hit rate with a 95 % Wilson interval,
the hit rate over all requests, and right hits over the ceiling (requests whose intent was asked before
and that the exact cache did not answer: the most a semantic cache could answer right).

    python -m bench.semantic_cache_replay [--set natural|written] [--requests 10000]
        [--checkpoints 1000,10000] [--max-error 0.01 0.02 0.05] [--modes off static verified] [--zipf 1.0]
        [--ttl SECONDS]
Writes bench/results/semantic_cache_replay_SET.json.
"""

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.lib.cache_gateway import KEY, body, config
from bench.lib.harness import ROOT, Process, free_port, start_gateway, wait_for_port, write_json

SETS = {
    "natural": ["bench/data/natural_pairs/natural.jsonl"],
    "written": [
        "bench/data/indep_questions2/pairs.jsonl",
        "bench/data/indep_questions/pairs.jsonl",
        "tests/data/semantic_pairs.jsonl",
    ],
}


def intents(paths: list[Path]) -> list[list[str]]:
    """Texts grouped by intent: label-1 pairs joined, every other text alone."""
    parent: dict[str, str] = {}

    def root(text: str) -> str:
        parent.setdefault(text, text)
        while parent[text] != text:
            parent[text] = parent[parent[text]]
            text = parent[text]
        return text

    for path in paths:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            a, b = root(row["a"]), root(row["b"])
            if int(row["label"]) == 1:
                parent[a] = b
    groups: dict[str, list[str]] = {}
    for text in parent:
        groups.setdefault(root(text), []).append(text)
    return sorted(groups.values(), key=lambda g: g[0])


def template_intents() -> list[list[str]]:
    from bench.lib.verifier_templates import INTENTS, SLOTS

    return [
        [p.format(x=value) for p in phrasings]
        for slot, intents_of_slot in INTENTS.values()
        for value in SLOTS[slot]
        for phrasings in intents_of_slot.values()
    ]


def stream(groups: list[list[str]], requests: int, zipf: float, seed: int) -> list[tuple[str, int]]:
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(groups))
    weights = 1.0 / np.arange(1, len(groups) + 1) ** zipf
    picks = order[rng.choice(len(groups), size=requests, p=weights / weights.sum())]
    return [(groups[i][int(rng.integers(len(groups[i])))], int(i)) for i in picks]


def asked_before(requests: list[tuple[str, int]]) -> np.ndarray:
    """Per request: True when its intent was asked before (in any wording)."""
    seen: set[int] = set()
    out = np.zeros(len(requests), dtype=bool)
    for n, (_, intent) in enumerate(requests):
        out[n] = intent in seen
        seen.add(intent)
    return out


def wilson(k: int, n: int) -> list[float] | None:
    if n == 0:
        return None
    z, p = 1.96, k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - spread), min(1.0, centre + spread)]


def replay(
    requests: list[tuple[str, int]], env: dict[str, str], answers: Path
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Every request through a fresh gateway; the records and the gateway's verified-outcome counters."""
    upstream = start_intent_upstream(answers)
    gateway = start_gateway(config(upstream), env={**env, "LLMGW_CACHE__VERIFIED__ANSWER_MATCH": "exact"})
    out = []
    try:
        with httpx.Client(
            base_url=gateway.url, headers={"authorization": f"Bearer {KEY}"}, timeout=120
        ) as client:
            for text, intent in requests:
                start = time.perf_counter()
                reply = client.post("/v1/chat/completions", json=body(text, 0))
                reply.raise_for_status()
                served = reply.json()["choices"][0]["message"]["content"]
                out.append({"status": reply.headers.get("x-cache-status", ""), "intent": intent,
                            "served": int(served.split(":", 1)[0].removeprefix("intent-")),
                            "ms": (time.perf_counter() - start) * 1000})  # fmt: skip
            time.sleep(0.5)  # labelling runs after the replies
            metrics = client.get("/metrics").text
    finally:
        gateway.stop()
        upstream.stop()
    outcomes = {
        line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("llmgw_cache_verified_outcomes_total{")
    }
    return out, outcomes


def summarise(records: list[dict[str, Any]], before: np.ndarray, checkpoints: list[int]) -> list[dict]:
    """The ceiling of a request: its intent was asked before and the exact cache did not answer it."""
    semantic = np.array([r["status"] == "semantic-hit" for r in records])
    wrong = semantic & np.array([r["served"] != r["intent"] for r in records])
    possible = before & np.array([r["status"] != "hit" for r in records])
    rows, start = [], 0
    for end in [c for c in checkpoints if c <= len(records)]:
        for label, lo in (("cumulative", 0), ("window", start)):
            hits, bad, ceil = (
                int(semantic[lo:end].sum()),
                int(wrong[lo:end].sum()),
                int(possible[lo:end].sum()),
            )
            rows.append({"upto": end, "span": label, "semantic_hits": hits, "wrong_hits": bad,
                         "wrong_rate": bad / hits if hits else None, "wrong_ci": wilson(bad, hits),
                         "hit_rate": hits / (end - lo), "ceiling": ceil,
                         "of_ceiling": (hits - bad) / ceil if ceil else None})  # fmt: skip
        start = end
    return rows


def print_rows(name: str, rows: list[dict]) -> None:
    print(f"\n== {name}")
    print(
        f"{'requests':>16} {'span':>10} {'sem hits':>8} {'wrong':>6} {'wrong rate [95% CI]':>24} {'hit rate':>8} {'of ceiling':>10}"
    )
    for r in rows:
        ci = r["wrong_ci"]
        rate = "n/a" if ci is None else f"{r['wrong_rate']:.4f} [{ci[0]:.3f}, {ci[1]:.3f}]"
        of = "n/a" if r["of_ceiling"] is None else f"{r['of_ceiling']:.3f}"
        print(
            f"{r['upto']:>16} {r['span']:>10} {r['semantic_hits']:>8} {r['wrong_hits']:>6} {rate:>24} {r['hit_rate']:>8.3f} {of:>10}"
        )


def modes(names: list[str], max_errors: list[float]) -> dict[str, dict[str, str]]:
    key = "LLMGW_CACHE__DEFAULTS__SEMANTIC__"
    out: dict[str, dict[str, str]] = {}
    for name in names:
        if name == "verified":
            for delta in max_errors:
                out[f"verified δ={delta}"] = {key + "MODE": "verified", key + "MAX_ERROR": str(delta)}
        else:
            out[name] = {key + "MODE": name}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=[*sorted(SETS), "templates"], default="natural")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--checkpoints", default="1000,10000,50000")
    parser.add_argument("--max-error", type=float, nargs="*", default=[0.01, 0.02, 0.05])
    parser.add_argument("--modes", nargs="*", default=["off", "static", "verified"])
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ttl",
        type=int,
        default=0,
        help="entries' ttl_s (0: the policy default, 3600): a short one stands in "
        "for a long trace replayed fast, where answers expire and popular questions come back as misses",
    )
    args = parser.parse_args()
    groups = template_intents() if args.set == "templates" else intents([ROOT / p for p in SETS[args.set]])
    requests = stream(groups, args.requests, args.zipf, args.seed)
    before = asked_before(requests)
    checkpoints = sorted(
        {*(int(c) for c in args.checkpoints.split(",") if int(c) < args.requests), args.requests}
    )
    answers = Path(tempfile.mkstemp(suffix=".json")[1])
    answers.write_text(json.dumps({t: i for i, g in enumerate(groups) for t in g}))
    print(f"{args.set}: {len(groups)} intents, {sum(map(len, groups))} texts, {args.requests} requests; "
          f"intent asked before: {int(before.sum())} requests ({before.mean():.3f})")  # fmt: skip
    report: dict[str, Any] = {"set": args.set, "intents": len(groups), "requests": args.requests,
                              "zipf": args.zipf, "seed": args.seed, "ttl_s": args.ttl or None, "asked_before": int(before.sum()), "modes": {}}  # fmt: skip
    for name, env in modes(args.modes, args.max_error).items():
        if args.ttl:
            env["LLMGW_CACHE__DEFAULTS__TTL_S"] = str(args.ttl)
        start = time.perf_counter()
        records, outcomes = replay(requests, env, answers)
        rows = summarise(records, before, checkpoints)
        latency = np.array([r["ms"] for r in records])
        report["modes"][name] = {"env": env, "rows": rows, "seconds": time.perf_counter() - start,
                                 "verified_outcomes": outcomes, "client_p50_ms": float(np.median(latency)), "client_p99_ms": float(np.percentile(latency, 99))}  # fmt: skip
        print_rows(name, rows)
        if outcomes:
            print("labelled outcomes:", {k: int(v) for k, v in outcomes.items() if v})
    print(f"\nwrote {write_json(f'semantic_cache_replay_{args.set}', report)}")


# --- the upstream that answers by intent ---------------------------------------------------------------


# tests/fakes.py's FakeUpstream, except that a chat completion's answer is "intent-N: …", N read from a JSON
# file mapping each question text to its intent; run in its own process:
#     python -m bench.semantic_cache_replay --intent-upstream PORT ANSWERS.json


def start_intent_upstream(answers: Path) -> Process:
    port = free_port()
    serve = ["-m", "bench.semantic_cache_replay", "--intent-upstream", str(port), str(answers)]
    popen = subprocess.Popen([sys.executable, *serve], cwd=ROOT)
    wait_for_port(port)
    return Process(popen, port)


def serve_intent_upstream(port: int, answers: Path) -> None:
    import uvicorn

    from tests.fakes import FakeUpstream, _completion, _json, _last_text

    class IntentUpstream(FakeUpstream):
        def __init__(self, intents: dict[str, int]) -> None:
            super().__init__("intent")
            self.intents = intents

        async def _answer(self, path: str, body: dict[str, Any], receive: Any, send: Any) -> None:
            intent = self.intents.get(_last_text(body), -1)
            answer = _completion(body, f"the answer of intent {intent}")
            answer["choices"][0]["message"]["content"] = f"intent-{intent}: the answer of intent {intent}"
            await _json(send, 200, answer)

    app = IntentUpstream(json.loads(answers.read_text()))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", loop="uvloop", http="httptools")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--intent-upstream"]:
        serve_intent_upstream(int(sys.argv[2]), Path(sys.argv[3]))
    else:
        main()
