"""The cross-encoder verifier's model code: the merged adapter computes what training computed, and the
ONNX int8 export gives the same probabilities within quantisation error."""

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from cache.cross_encoder import PairTokenizer, adapter_state, build_model, load_cross_encoder  # noqa: E402
from cache.encoder import default_model_path  # noqa: E402

PAIRS = [
    ("what is the capital of france", "which city is the capital of france"),
    ("can a landlord evict a tenant without notice", "can a tenant evict a landlord without notice"),
    ("how do i install python on windows", "how do i uninstall python on windows? answer in french"),
]
NAMES = ("input_ids", "attention_mask", "token_type_ids")


@pytest.fixture(scope="module")
def trained() -> object:
    """A model whose updates are random (not zero), standing in for a trained one."""
    torch.manual_seed(0)
    model = build_model(default_model_path(), rank=4, alpha=8.0, dropout=0.0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(0.05 * torch.randn_like(parameter))
    return model.eval()


def logits_of(model: object, pairs: list[tuple[str, str]]) -> "torch.Tensor":
    batch = PairTokenizer(default_model_path())(pairs)
    with torch.no_grad():
        return model(*(torch.from_numpy(batch[n]) for n in NAMES))


def test_pair_tokens_mark_the_second_question_as_segment_one() -> None:
    batch = PairTokenizer(default_model_path())(PAIRS[:1])
    types = batch["token_type_ids"][0][batch["attention_mask"][0] == 1]
    assert types[0] == 0 and types[-1] == 1 and set(types.tolist()) == {0, 1}


def test_merged_adapter_gives_the_training_models_logits(trained: object) -> None:
    expected = logits_of(trained, PAIRS)
    merged = build_model(default_model_path(), adapter_state(trained))
    assert torch.allclose(logits_of(merged, PAIRS), expected, atol=1e-4)
    untouched = adapter_state(trained)
    for name in untouched:
        if name.endswith(".b"):
            untouched[name] = np.zeros_like(untouched[name])
    assert not torch.allclose(
        logits_of(build_model(default_model_path(), untouched), PAIRS), expected, atol=1e-3
    )


def test_onnx_int8_export_matches_torch(trained: object, tmp_path: Path) -> None:
    adapter = tmp_path / "cross_encoder.npz"
    np.savez(adapter, **adapter_state(trained))
    expected = torch.sigmoid(logits_of(trained, PAIRS)).numpy()
    got = load_cross_encoder(adapter, tmp_path / "onnx").probabilities(PAIRS)
    assert got.shape == (3,)
    assert np.abs(got - expected).max() < 0.05
    assert load_cross_encoder(adapter, tmp_path / "onnx").path == next(
        (tmp_path / "onnx").glob("cross-*-int8pc.onnx")
    )


def test_a_cross_encoder_folder_that_cannot_load_turns_semantic_caching_off(
    tmp_path: Path, monkeypatch
) -> None:
    import json

    import cache.cross_encoder
    from cache.verifier import load_verifier

    meta = {"model": "cross-encoder", "candidate_threshold": 0.6, "encoder": "onnx-int8", "normalise_text": True,
            "calibration": []}  # fmt: skip
    (tmp_path / "verifier.json").write_text(json.dumps(meta))

    def missing(*_: object) -> None:
        raise ImportError("no torch")

    monkeypatch.setattr(cache.cross_encoder, "load_cross_encoder", missing)
    assert load_verifier(tmp_path) is None
