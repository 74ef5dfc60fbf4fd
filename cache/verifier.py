"""The learned check on every semantic candidate: may the answer cached for the stored question be served
for the new one? Gradient-boosted trees (trained by training/train_verifier.py with scikit-learn, chosen over
an MLP and logistic regression for recall at the target precision on the calibration split; exported to
plain arrays in cache/verifier_model/) read the word alignment of the two questions (cache/alignment.py)
and give a probability; a hit needs it to reach the threshold that the shipped calibration table gives
for the policy's precision target. Two rules stay because they are exact: questions with different
numbers, or that both name units and not the same ones ("in miles" / "in kilometres"), never share an
answer (`exact_conflict`).

At load the arrays become one ONNX TreeEnsembleRegressor run by ONNX Runtime (already needed for the
encoder), so scikit-learn is not needed at run time. Measured in-process at load ≈ 6
(docs/cache-measurements.md): four candidates took 5.1 ms p50 in the earlier numpy walk (all 300 trees stepped together,
14 levels) and take about 0.07 ms in ONNX Runtime."""

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cache.alignment import FEATURES, candidate_features, words_of
from cache.encoder import EncodedQuestion
from cache.guard import conflict

if TYPE_CHECKING:
    from cache.cross_encoder import CrossEncoder

log = logging.getLogger("llmgw.cache")
MODEL_DIR = Path(__file__).parent / "verifier_model"
EXACT_RULES = frozenset({"number", "unit"})  # cache/guard.py's checks that decide alone


@dataclass(frozen=True)
class CalibrationPoint:
    threshold: float
    precision: float
    recall: float
    hits: int | None = None  # calibration pairs served at this threshold (tables written since issue 13)
    false_hits: int | None = None

    def precision_bound(self) -> float:
        """One-sided 95 % lower confidence bound on the precision (Wilson score) when the table has the
        counts; the point estimate for older tables."""
        if not self.hits or self.false_hits is None:
            return self.precision
        n, p, z2 = self.hits, 1 - self.false_hits / self.hits, Z_95 * Z_95
        centre = p + z2 / (2 * n)
        spread = Z_95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
        return (centre - spread) / (1 + z2 / n)


Z_95 = 1.6449  # one-sided 95 %


def threshold_for(calibration: list[CalibrationPoint], min_precision: float) -> float:
    """The lowest probability threshold whose calibration precision reaches the target and stays there
    for every stricter threshold, and whose precision's lower confidence bound reaches it too (so that a
    flat stretch of the table measured on a few false hits is not read as a guarantee); 1.01 (nothing
    passes) when none does. `calibration` sorted by threshold."""
    passing = 1.01
    for point in reversed(calibration):
        if point.precision < min_precision:
            break
        if point.precision_bound() >= min_precision:
            passing = point.threshold
    return passing


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    probability: float


@dataclass(frozen=True)
class Trees:
    """Boosted trees as arrays (trees × nodes): split feature and threshold, children, leaf values."""

    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    missing_left: np.ndarray
    leaf: np.ndarray
    value: np.ndarray
    baseline: float

    def session(self, width: int) -> Any:
        """An ONNX Runtime session summing the trees' leaf values for each row (rows × width, float64)."""
        import onnxruntime as ort
        from onnx import TensorProto, helper

        used = [(t, n) for t in range(self.feature.shape[0]) for n in range(self._nodes(t))]
        leaves = [(t, n) for t, n in used if self.leaf[t, n]]

        def column(array: np.ndarray) -> list:
            return [array[t, n].item() for t, n in used]

        node = helper.make_node(
            "TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", n_targets=1, aggregate_function="SUM",
            nodes_treeids=[t for t, _ in used], nodes_nodeids=[n for _, n in used],
            nodes_featureids=[int(f) for f in column(self.feature)],
            nodes_values_as_tensor=helper.make_tensor("v", TensorProto.DOUBLE, [len(used)], column(self.threshold)),
            nodes_modes=["LEAF" if leaf else "BRANCH_LEQ" for leaf in column(self.leaf)],
            nodes_truenodeids=column(self.left), nodes_falsenodeids=column(self.right),
            nodes_missing_value_tracks_true=[int(m) for m in column(self.missing_left)],
            target_treeids=[t for t, _ in leaves], target_nodeids=[n for _, n in leaves], target_ids=[0] * len(leaves),
            target_weights_as_tensor=helper.make_tensor(
                "w", TensorProto.DOUBLE, [len(leaves)], [self.value[t, n].item() for t, n in leaves]
            ),
            base_values_as_tensor=helper.make_tensor("b", TensorProto.DOUBLE, [1], [self.baseline]),
        )  # fmt: skip
        graph = helper.make_graph(
            [node], "verifier",
            [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [None, width])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])],
        )  # fmt: skip
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
        )
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def _nodes(self, tree: int) -> int:
        """Nodes in use in one padded row: the highest child index + 1."""
        return int(max(self.left[tree].max(), self.right[tree].max())) + 1


class Verifier:
    def __init__(
        self,
        trees: Trees | None,
        calibration: list[CalibrationPoint],
        candidate_threshold: float,
        encoder: str = "onnx-fp32",
        normalise_text: bool = False,
        width: int = len(FEATURES),
        cross: "CrossEncoder | None" = None,
    ) -> None:
        self._session = trees.session(width) if trees is not None else None
        self.cross = cross  # the cross-encoder reads both texts instead of the trees reading features
        self.width = width  # the first `width` FEATURES: weights trained before later features were added
        self.calibration = sorted(calibration, key=lambda p: p.threshold)
        self.candidate_threshold = candidate_threshold
        self.encoder = encoder  # the vectors the calibration was measured on: "onnx-int8" or "onnx-fp32"
        self.normalise_text = normalise_text  # trained on cache.encoder.normalise'd text: encode it so

    @classmethod
    def load(cls, folder: Path = MODEL_DIR, onnx_dir: Path | None = None) -> "Verifier":
        meta = json.loads((folder / "verifier.json").read_text())
        if meta.get("model") == "cross-encoder":
            from cache.cross_encoder import load_cross_encoder

            return cls(
                None, [CalibrationPoint(**p) for p in meta["calibration"]], float(meta["candidate_threshold"]),
                meta["encoder"], bool(meta["normalise_text"]), 0,
                load_cross_encoder(folder / "cross_encoder.npz", onnx_dir),
            )  # fmt: skip
        weights = np.load(folder / "verifier.npz")
        width = len(meta["features"])
        if tuple(meta["features"]) != FEATURES[:width]:
            raise ValueError(
                "verifier weights were trained on other features; re-run training/train_verifier.py"
            )
        names = ("feature", "threshold", "left", "right", "missing_left", "leaf", "value")
        trees = Trees(*(weights[n] for n in names), baseline=float(meta["baseline"]))
        points = [CalibrationPoint(**p) for p in meta["calibration"]]
        return cls(
            trees, points, float(meta["candidate_threshold"]), meta.get("encoder", "onnx-fp32"),
            bool(meta.get("normalise_text", False)), width,
        )  # fmt: skip

    def threshold_for(self, min_precision: float) -> float:
        return threshold_for(self.calibration, min_precision)

    def probabilities(self, features: np.ndarray) -> np.ndarray:
        columns = features[:, : self.width]
        (sums,) = self._session.run(None, {"x": np.ascontiguousarray(columns, dtype=np.float64)})
        raw = sums[:, 0].astype(np.float64)
        return 1.0 / (1.0 + np.exp(-raw))

    def scores(self, stored: list[EncodedQuestion], new: EncodedQuestion) -> np.ndarray:
        """The probability that the answer stored for each of `stored` serves `new` (no exact rules)."""
        if self.cross is not None:
            return self.cross.probabilities([(s.text, new.text) for s in stored])
        return self.probabilities(candidate_features(stored, new))

    def judge(self, stored: EncodedQuestion, new: EncodedQuestion, threshold: float) -> Verdict:
        return self.judge_all([stored], new, threshold)[0]

    def judge_all(
        self, stored: list[EncodedQuestion], new: EncodedQuestion, threshold: float
    ) -> list[Verdict]:
        """One verdict per stored question, the trees walked once for all of them."""
        if not stored:
            return []
        probabilities = self.scores(stored, new)
        return [
            Verdict(False, 0.0) if exact_conflict(s, new) else Verdict(p >= threshold, float(p))
            for s, p in zip(stored, probabilities, strict=True)
        ]


def exact_conflict(a: EncodedQuestion, b: EncodedQuestion) -> bool:
    """Different numbers, or different units named on both sides: never one answer for both."""
    return (
        conflict(words_of(a.text, a.words).parsed, words_of(b.text, b.words).parsed, EXACT_RULES) is not None
    )


def load_verifier(folder: Path = MODEL_DIR, onnx_dir: Path | None = None) -> Verifier | None:
    """None (and a warning) when the weights are missing or unreadable: semantic caching then stays off."""
    try:
        return Verifier.load(folder, onnx_dir)
    except (OSError, ValueError, KeyError, ImportError) as error:  # ImportError: a cross-encoder, no torch
        log.warning("semantic cache off: verifier weights unavailable in %s (%s)", folder, error)
        return None
