"""Trains the cross-encoder verifier (cache/cross_encoder.py) and calibrates it as the gateway runs it.

Three steps, so that the training can run on a GPU box and the calibration on the CPU that serves:
  pairs      the labeled pairs of bench/lib/verifier_pairs.py (templates + MMLU stems; grouped train / calib /
             heldout splits) plus training/verifier_augment.py's train-only pairs, in the form the cache
             encodes (cache.encoder.normalise), train pairs in both orders, into DIR/pairs.jsonl; with
             --base, a float16 copy of the shipped MiniLM (config, tokenizer, weights) into DIR/base, to
             carry to a machine without the package;
  train      LoRA fine-tuning on the train split only (AdamW, linear decay); prints AUROC on calib and
             heldout after each epoch; writes DIR/cross_encoder.npz (only torch, transformers, numpy);
  calibrate  ONNX Runtime int8 on this CPU, as the gateway runs it: the calibration table of the whole
             lookup (cosine ≥ the candidate threshold, exact rules agree, probability ≥ t) on the calib
             split, written with the weights to cache/verifier_model/ (or --out); prints the held-out split
             at the default precision target, which no step above looks at.

    LLMGW_ROUTELLM_EVAL_DIR=../shared/routellm_eval python -m training.train_cross_verifier pairs --out D [--base]
        [--natural [--holdout-source comqa|ambigqa|hand_natural]]
    python3 -m training.train_cross_verifier train --data D [--device cuda] [--epochs 3] [--rank 16]
    python -m training.train_cross_verifier calibrate --adapter D/cross_encoder.npz [--out cache/verifier_model]
"""

import argparse
import json
import random
import shutil
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def write_pairs(
    out: Path, seed: int, per_subject: int, base: bool, natural: bool, holdout: str | None
) -> None:
    from bench.lib.verifier_pairs import build
    from cache.encoder import default_model_path, normalise
    from training.verifier_augment import augment
    from training.verifier_natural import natural_pairs

    pairs = build(seed, per_subject, hand=True)
    pairs += augment(pairs, seed)
    if natural:  # verifier_natural.py's sources split by cluster; `holdout`: one source wholly held out
        pairs += natural_pairs(seed, holdout)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for p in pairs:
        a, b = normalise(p.a), normalise(p.b)
        rows.append(
            {"a": a, "b": b, "label": p.label, "kind": p.kind, "split": p.split, "raw_a": p.a, "raw_b": p.b}
        )
        if p.split == "train":
            rows.append({"a": b, "b": a, "label": p.label, "kind": p.kind, "split": "train"})
    (out / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} rows to {out / 'pairs.jsonl'}")
    if base:
        import torch
        from safetensors.torch import load_file, save_file

        source = default_model_path()
        (out / "base").mkdir(exist_ok=True)
        for name in (
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "vocab.txt",
        ):
            shutil.copy(source / name, out / "base" / name)
        weights = {k: v.to(torch.float16) for k, v in load_file(str(source / "model.safetensors")).items()}
        save_file(weights, str(out / "base" / "model.safetensors"))


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    order = np.argsort(scores)
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    positives = labels == 1
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / max(n_pos * n_neg, 1))


def length_buckets(rows: list[dict], batch: int, rng: random.Random, pool: int = 50) -> list[list[dict]]:
    """One epoch's batches: shuffled, then sorted by length within pools of `pool` batches, so that a batch
    pads to about its own length rather than to the longest of 64 random pairs (on the shipped pairs 1.34x
    fewer tokens per epoch; a CPU step costs what its padded tokens cost); the batches' order is shuffled
    again. Every whole batch of rows is used once, as before."""
    rows = rows[:]
    rng.shuffle(rows)
    rows = rows[: len(rows) // batch * batch]
    batches = []
    for start in range(0, len(rows), batch * pool):
        group = sorted(rows[start : start + batch * pool], key=lambda r: len(r["a"]) + len(r["b"]))
        batches += [group[i : i + batch] for i in range(0, len(group), batch)]
    rng.shuffle(batches)
    return batches


def train(data: Path, device: str, epochs: int, rank: int, lr: float, batch: int, seed: int) -> None:
    import torch

    from cache.cross_encoder import PairTokenizer, adapter_state, build_model

    torch.manual_seed(seed)
    rng = random.Random(seed)
    rows = [json.loads(line) for line in (data / "pairs.jsonl").read_text().splitlines()]
    base = data / "base" if (data / "base").exists() else None
    if base is None:
        from cache.encoder import default_model_path

        base = default_model_path()
    tokenize = PairTokenizer(base)
    model = build_model(base, rank=rank, alpha=2.0 * rank).to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.01)
    train_rows = [r for r in rows if r["split"] == "train"]
    steps = epochs * (len(train_rows) // batch)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 100) * max(0.0, 1 - s / max(steps, 1))
    )
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def tensors(chunk: list[dict]) -> tuple:
        arrays = tokenize([(r["a"], r["b"]) for r in chunk])
        return tuple(
            torch.from_numpy(arrays[n]).to(device) for n in ("input_ids", "attention_mask", "token_type_ids")
        )

    def scores(split: str) -> tuple[np.ndarray, np.ndarray]:
        chosen = [r for r in rows if r["split"] == split]
        model.eval()
        out = []
        with torch.no_grad():
            for start in range(0, len(chosen), 256):
                out.append(model(*tensors(chosen[start : start + 256])).float().cpu().numpy())
        model.train()
        return np.concatenate(out), np.array([r["label"] for r in chosen])

    log = []
    started = time.time()
    model.train()
    for epoch in range(epochs):
        batches = length_buckets(train_rows, batch, rng)
        total = 0.0
        for chunk in batches:
            labels = torch.tensor([float(r["label"]) for r in chunk], device=device)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
                logits = model(*tensors(chunk))
            loss = loss_fn(logits.float(), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += float(loss.detach())
        entry = {
            "epoch": epoch + 1,
            "loss": total / max(1, len(train_rows) // batch),
            "s": round(time.time() - started, 1),
        }
        for split in ("calib", "heldout"):
            if any(r["split"] == split for r in rows):
                s, y = scores(split)
                entry[f"{split}_auroc"] = auroc(s, y)
        log.append(entry)
        print(json.dumps(entry), flush=True)
    np.savez_compressed(data / "cross_encoder.npz", **adapter_state(model))
    info = {
        "rank": rank,
        "lr": lr,
        "batch": batch,
        "epochs": epochs,
        "seed": seed,
        "train_rows": len(train_rows),
        "log": log,
    }
    (data / "cross_encoder_train.json").write_text(json.dumps(info, indent=1))
    print(f"wrote {data / 'cross_encoder.npz'}")


def calibrate(adapter: Path, data: Path, out: Path) -> None:
    from bench.lib.verifier_pairs import Pair
    from cache.cross_encoder import load_cross_encoder
    from cache.verifier import CalibrationPoint, threshold_for
    from training.train_verifier import (
        CANDIDATE_THRESHOLD,
        DEFAULT_TARGET,
        ENCODER,
        _encoded,
        curve,
        featurize,
        split_reports,
    )  # fmt: skip

    rows = [json.loads(line) for line in (data / "pairs.jsonl").read_text().splitlines()]
    pairs = [Pair(r["raw_a"], r["raw_b"], r["label"], r["kind"], "", r["split"]) for r in rows
             if r["split"] in ("calib", "heldout")]  # fmt: skip
    encoded = _encoded(pairs, None)
    _, labels, eligible = featurize(pairs, encoded)  # the lookup asks the verifier only for these
    cross = load_cross_encoder(adapter)
    prob = np.concatenate(
        [cross.probabilities([(encoded[p.a].text, encoded[p.b].text)]) for p in pairs]
    )  # one pair per call, as a lookup with one candidate
    split = np.array([p.split for p in pairs])
    calib = split == "calib"
    table = curve(prob[calib], labels[calib], eligible[calib])
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(adapter, out / "cross_encoder.npz")
    train_info = adapter.with_name("cross_encoder_train.json")
    meta = {
        "model": "cross-encoder", "candidate_threshold": CANDIDATE_THRESHOLD, "encoder": ENCODER,
        "normalise_text": True, "calibration": table,
        "trained": json.loads(train_info.read_text()) if train_info.exists() else {},
    }  # fmt: skip
    (out / "verifier.json").write_text(json.dumps(meta, indent=1))
    threshold = threshold_for([CalibrationPoint(**p) for p in table], DEFAULT_TARGET)
    report = {"threshold": threshold, **split_reports(prob, labels, eligible, split, threshold)}
    for name in ("calib", "heldout"):
        report[name]["auroc"] = auroc(prob[split == name], labels[split == name])
    (out / "calibrate_report.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("pairs")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-subject", type=int, default=20)
    p.add_argument("--base", action="store_true", help="also a float16 copy of the base model")
    p.add_argument(
        "--natural", action="store_true", help="also the natural pairs (training/verifier_natural.py)"
    )
    p.add_argument("--holdout-source", help="with --natural: a source kept wholly in the heldout split")
    t = sub.add_parser("train")
    t.add_argument("--data", type=Path, required=True)
    t.add_argument("--device", default="cpu")
    t.add_argument("--epochs", type=int, default=3)
    t.add_argument("--rank", type=int, default=16)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--batch", type=int, default=64)
    t.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("calibrate")
    c.add_argument("--adapter", type=Path, required=True)
    c.add_argument("--data", type=Path, help="folder of pairs.jsonl (default: the adapter's)")
    c.add_argument("--out", type=Path, default=ROOT / "cache/verifier_model")
    args = parser.parse_args()
    if args.step == "pairs":
        write_pairs(args.out, args.seed, args.per_subject, args.base, args.natural, args.holdout_source)
    elif args.step == "train":
        train(args.data, args.device, args.epochs, args.rank, args.lr, args.batch, args.seed)
    else:
        calibrate(args.adapter, args.data or args.adapter.parent, args.out)


if __name__ == "__main__":
    main()
