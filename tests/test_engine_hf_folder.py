"""Hugging Face folders (config.json + safetensors + tokenizer.json) of several Llama-family architectures.

Tiny random checkpoints written by transformers itself: Llama with Llama 3 RoPE scaling, Qwen2 with q/k/v
biases, Mistral with an untied output head. The engine must give transformers' logits for each.
"""

import json
import os
from pathlib import Path

import pytest
import torch

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine.model_runner import ModelRunner
from backends.local_engine.engine.sequence import ScheduledSeq, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

VOCAB = 512
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
CHECKPOINTS = {
    "llama3": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(rope_parameters=LLAMA3_ROPE, tie_word_embeddings=True),
    ),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(tie_word_embeddings=False)),
}
PROMPTS = [
    list(range(10, 17)),
    list(range(200, 300)),
    [5],
]  # 100 tokens: past original_max_position_embeddings


def tokenizer_json() -> str:
    """A word-level tokenizer over VOCAB tokens, enough for the loader (the test feeds ids directly)."""
    vocab = {f"w{i}": i for i in range(VOCAB)}
    model = {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}
    return json.dumps({"version": "1.0", "model": model, "pre_tokenizer": {"type": "Whitespace"}})


def save_checkpoint(name: str, folder: Path):
    config_class, model_class, extra = CHECKPOINTS[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**SHAPE, **extra)
    model = getattr(transformers, model_class)(config).eval()
    if name == "qwen2":  # random init leaves biases at zero: make them matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(tokenizer_json())
    return model


def engine_last_logits(folder: Path, dtype: str = "fp32") -> list[torch.Tensor]:
    runner = ModelRunner(EngineSettings(model=folder, dtype=dtype, kv_cache_memory_mb=4, block_size=16))
    seqs, next_block = [], 0
    for prompt in PROMPTS:
        seq = Sequence(list(prompt))
        blocks = -(-len(prompt) // runner.block_size)
        seq.block_table = list(range(next_block, next_block + blocks))
        next_block += blocks
        seqs.append(seq)
    outputs = runner.execute([ScheduledSeq(seq, len(seq)) for seq in seqs])
    return [out.logits[-1] for out in outputs]


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_hf_folder_logits_match_transformers(name: str, tmp_path: Path) -> None:
    model = save_checkpoint(name, tmp_path)
    ours = engine_last_logits(tmp_path)
    with torch.no_grad():
        for prompt, row in zip(PROMPTS, ours, strict=True):
            expected = model(torch.tensor([prompt])).logits[0, -1]
            assert torch.allclose(row, expected, atol=1e-4), (name, float((row - expected).abs().max()))


def test_qwen2_biases_are_used(tmp_path: Path) -> None:
    model = save_checkpoint("qwen2", tmp_path)
    for layer in model.model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            torch.nn.init.zeros_(proj.bias)
    with torch.no_grad():
        without_bias = model(torch.tensor([PROMPTS[1]])).logits[0, -1]
    assert not torch.allclose(engine_last_logits(tmp_path)[1], without_bias, atol=1e-3)


def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ModelRunner(EngineSettings(model=tmp_path / "nope"))


@pytest.mark.parametrize(
    "rope",
    [
        LLAMA3_ROPE,
        {"rope_type": "default", "rope_theta": 1e6},
        {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0},
    ],
    ids=["llama3", "default", "linear"],
)
def test_rotation_table_is_transformers_own(rope: dict) -> None:
    """cos/sin of every position equal transformers' bit for bit: fp32 logits then differ from HF's only by
    summation order (float64 angles put the 8B fp32 logits 1.26e-4 from HF's, bench/README.md)."""
    from backends.local_engine.loading.hf import model_config
    from backends.local_engine.model.rope import RotaryTable

    config = transformers.LlamaConfig(**SHAPE, head_dim=32, rope_parameters=rope)
    hf_rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    positions = torch.arange(512)
    cos, sin = hf_rotary(torch.zeros(1, dtype=torch.float32), positions[None])
    table = RotaryTable(model_config(config.to_dict()), 512, torch.device("cpu")).rotations
    assert torch.equal(table.real, cos[0, :, :16]) and torch.equal(table.imag, sin[0, :, :16])


def test_fp32_on_cuda_keeps_projections_apart() -> None:
    """fp32 for CUDA runs q/k/v and gate/up as HF's separate matmuls (biases included), same values."""
    from backends.local_engine.kernels.quant import ConcatLinear
    from backends.local_engine.loading.loader import build_model
    from backends.local_engine.loading.weights import WeightFormat
    from bench.lib.engine_gpu_models import build_hf, checkpoint_of

    hf = build_hf("tiny-qwen", torch.device("cpu"))
    fused, split = (
        build_model(checkpoint_of(hf, "q"), WeightFormat("fp32", cuda=cuda), torch.device("cpu"), 64)
        for cuda in (False, True)
    )
    x = torch.randn(5, hf.config.hidden_size)
    for a, b in zip(fused.layers, split.layers, strict=True):
        assert isinstance(b.qkv, ConcatLinear) and isinstance(b.gate_up, ConcatLinear)
        assert not isinstance(a.qkv, ConcatLinear)
        assert [p.weight.shape[0] for p in b.qkv.parts] == [224, 32, 32]
        assert all(p.bias is not None for p in b.qkv.parts)
        torch.testing.assert_close(b.qkv(x), a.qkv(x), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b.gate_up(x), a.gate_up(x), rtol=1e-5, atol=1e-6)


def test_bf16_kv_cache_on_cpu(tmp_path: Path) -> None:
    """Quantized formats on the CPU keep K/V in bf16 by default (fp32 weights keep fp32 K/V); attention then
    runs in bf16 and the logits stay within bf16 rounding of the fp32 pool's."""
    save_checkpoint("llama3", tmp_path)

    def runner(dtype: str, kv: str = "auto") -> ModelRunner:
        return ModelRunner(
            EngineSettings(model=tmp_path, dtype=dtype, kv_cache_memory_mb=4, kv_cache_dtype=kv)
        )

    assert runner("int8").kv_cache.pool.dtype == torch.bfloat16
    assert runner("fp32").kv_cache.pool.dtype == torch.float32
    half, full = runner("fp32", "bf16"), runner("fp32", "fp32")
    assert half.kv_bytes_per_token * 2 == full.kv_bytes_per_token
    for prompt in PROMPTS:
        logits = []
        for r in (half, full):
            seq = Sequence(list(prompt), block_table=list(range(-(-len(prompt) // r.block_size))))
            logits.append(r.execute([ScheduledSeq(seq, len(prompt))])[0].logits[-1])
        assert logits[0].dtype == torch.float32
        assert 0 < float((logits[0] - logits[1]).abs().max()) < 2e-2 * float(logits[1].abs().max())
