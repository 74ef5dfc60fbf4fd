"""Rebuild a shipped artifact into a scratch folder and compare it with the committed one.

    .venv/bin/python -m training.check cascade    # routing/models/cascade_confidence.npz, ~10 s
    .venv/bin/python -m training.check router     # routing/models/router_lr.npz, 1.5-7 min (embeddings cached after)
    .venv/bin/python -m training.check verifier --cache build/verifier_encodings.pkl   # cache/verifier_model/
    .venv/bin/python -m training.check all        # (the verifier encodes ~36,000 questions: ~15 min on 2 busy cores)

The router and the verifier read the RouteLLM records: ../shared/routellm_eval, or LLMGW_ROUTELLM_EVAL_DIR.

Each builder runs exactly as training/README.md's command for the artifact, but writes elsewhere; the
committed file is never touched. Compared, array by array: the same names, shapes and dtypes, and the largest
absolute difference (0 = the same numbers). Also compared: the router's chosen candidate and its held-out
scores against bench/results/router_selection.json; the verifier's features, baseline, calibration table and
held-out precision / recall against cache/verifier_model/verifier.json and bench/results/train_verifier.json.
An artifact matches when every array is within `--atol` (default 1e-6) and those records agree. Prints one table,
writes training/results/check.json (one entry per artifact checked).
"""

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.routellm_data import RESULTS as BENCH_RESULTS
from routing.config import MODELS_DIR

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "training" / "results"
VERIFIER_DIR = ROOT / "cache" / "verifier_model"


def compare_arrays(built: Path, shipped: Path, atol: float) -> dict[str, Any]:
    """Array-by-array comparison of two .npz files."""
    a, b = np.load(built), np.load(shipped)
    rows: dict[str, Any] = {"missing": sorted(set(b.files) ^ set(a.files)), "arrays": {}}
    for name in sorted(set(a.files) & set(b.files)):
        x, y = a[name], b[name]
        same_shape = x.shape == y.shape and x.dtype == y.dtype
        numeric = x.dtype.kind in "fiub" and same_shape
        diff = (
            float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)), initial=0.0))
            if numeric
            else None
        )
        equal = bool(np.array_equal(x, y)) if same_shape else False
        rows["arrays"][name] = {"shape": list(y.shape), "same_shape": same_shape, "max_abs_diff": diff,
                                "equal": equal}  # fmt: skip
    rows["matches"] = not rows["missing"] and all(
        r["equal"] or (r["max_abs_diff"] is not None and r["max_abs_diff"] <= atol)
        for r in rows["arrays"].values()
    )
    return rows


def check_cascade(scratch: Path, atol: float) -> dict[str, Any]:
    from training.train_cascade_confidence import MODEL_PATH
    from training.train_cascade_confidence import main as build

    build(["--out", str(scratch / "cascade_confidence.npz")])
    return compare_arrays(scratch / "cascade_confidence.npz", MODEL_PATH, atol)


def check_router(scratch: Path, atol: float) -> dict[str, Any]:
    """`train_router router` with the recorded --per-group and --rule; the held-out scores it computes go to
    bench/results/router_logo_scores-rebuild.npz (ignored by git) and are removed afterwards."""
    from bench.cascade_eval import RouterFiles, train_replay_router

    recorded = json.loads((BENCH_RESULTS / "router_selection.json").read_text())
    files = RouterFiles("rebuild")
    try:
        model, selection = train_replay_router(True, recorded["per_group"], recorded["rule"], files)
    finally:
        files.logo.unlink(missing_ok=True)
    model.save(scratch / "router_lr.npz")
    result = compare_arrays(scratch / "router_lr.npz", MODELS_DIR / "router_lr.npz", atol)
    result["chosen"] = {"rebuilt": selection["chosen"], "recorded": recorded["chosen"]}
    result["heldout_apgr_same"] = selection["heldout_apgr"] == recorded["heldout_apgr"]
    result["matches"] = result["matches"] and selection["chosen"] == recorded["chosen"]
    return result


def check_verifier(scratch: Path, atol: float, cache: Path | None = None) -> dict[str, Any]:
    """`train_verifier --no-natural --features 29` (the command of the shipped weights) into the scratch folder;
    `cache`: train_verifier's --cache (the encodings kept between runs: the first run encodes ~36,000 questions)."""
    from training.train_verifier import main as build

    out = scratch / "verifier_model"
    build(
        ["--no-natural", "--features", "29", "--out", str(out), *(["--cache", str(cache)] if cache else [])]
    )
    result = compare_arrays(out / "verifier.npz", VERIFIER_DIR / "verifier.npz", atol)
    built, shipped = (json.loads((d / "verifier.json").read_text()) for d in (out, VERIFIER_DIR))
    result["meta_same"] = {k: built[k] == shipped[k] for k in ("features", "encoder", "candidate_threshold")}
    result["baseline_diff"] = abs(built["baseline"] - shipped["baseline"])
    result["calibration_same"] = built["calibration"] == shipped["calibration"]
    report = json.loads((out / "train_verifier.json").read_text())
    recorded = json.loads((BENCH_RESULTS / "train_verifier.json").read_text())
    result["report"] = {
        k: {"rebuilt": report[k], "recorded": recorded[k]} for k in ("threshold", "calib", "heldout")
    }
    result["matches"] = (
        result["matches"] and all(result["meta_same"].values()) and result["baseline_diff"] <= atol
        and result["calibration_same"]
    )  # fmt: skip
    return result


CHECKS: dict[str, Callable[..., dict[str, Any]]] = {
    "cascade": check_cascade,
    "router": check_router,
    "verifier": check_verifier,
}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", choices=[*CHECKS, "all"])
    parser.add_argument(
        "--atol", type=float, default=1e-6, help="largest absolute difference allowed per number"
    )
    parser.add_argument("--cache", type=Path, help="verifier: keep its encodings in this pickle between runs")
    parser.add_argument("--no-write", action="store_true", help="print only (tests)")
    args = parser.parse_args(argv)
    names = list(CHECKS) if args.artifact == "all" else [args.artifact]
    results: dict[str, Any] = {}
    for name in names:
        started = time.time()
        with tempfile.TemporaryDirectory() as scratch:
            extra = {"cache": args.cache} if name == "verifier" else {}
            results[name] = CHECKS[name](Path(scratch), args.atol, **extra)
        results[name]["seconds"] = round(time.time() - started, 1)
    print(f"\n{'artifact':<10} {'matches':<8} {'arrays equal':>12} {'max |diff|':>12} {'seconds':>8}")
    for name, r in results.items():
        arrays = r["arrays"].values()
        diffs = [a["max_abs_diff"] for a in arrays if a["max_abs_diff"] is not None]
        print(f"{name:<10} {str(r['matches']):<8} {sum(a['equal'] for a in arrays):>5} of {len(arrays):<4}"
              f" {max(diffs, default=0.0):>12.3g} {r['seconds']:>8}")  # fmt: skip
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / "check.json"
        saved = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps(saved | results, indent=1))
        print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
