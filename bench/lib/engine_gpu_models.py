"""Random-weight models for bench/engine_gpu.py: HF transformers models built on the device, the same
weights handed to our engine as an in-memory checkpoint, and small helpers to drive both.
"""

import gc
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine.model_runner import ModelRunner
from backends.local_engine.loading.checkpoint import Checkpoint, TokenizerSource
from backends.local_engine.loading.hf import model_config

_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}  # fmt: skip
SHAPES: dict[str, dict] = {
    "llama-1b": dict(architectures=["LlamaForCausalLM"], vocab_size=128256, hidden_size=2048,
                     intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=64, rope_theta=500000.0, tie_word_embeddings=True,
                     rope_scaling=dict(_LLAMA3_ROPE, factor=32.0), max_position_embeddings=131072,
                     rms_norm_eps=1e-5),
    "llama-8b": dict(architectures=["LlamaForCausalLM"], vocab_size=128256, hidden_size=4096,
                     intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, rope_theta=500000.0, tie_word_embeddings=False,
                     rope_scaling=dict(_LLAMA3_ROPE, factor=8.0), max_position_embeddings=131072,
                     rms_norm_eps=1e-5),
    "qwen2-0.5b": dict(architectures=["Qwen2ForCausalLM"], vocab_size=151936, hidden_size=896,
                       intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, rope_theta=1000000.0, tie_word_embeddings=True,
                       max_position_embeddings=32768, rms_norm_eps=1e-6),
    "tiny": dict(architectures=["LlamaForCausalLM"], vocab_size=512, hidden_size=128, intermediate_size=256,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 rope_theta=10000.0, tie_word_embeddings=True, max_position_embeddings=2048),
    "tiny-qwen": dict(architectures=["Qwen2ForCausalLM"], vocab_size=512, hidden_size=224,
                      intermediate_size=256, num_hidden_layers=2, num_attention_heads=7, num_key_value_heads=1,
                      rope_theta=10000.0, tie_word_embeddings=False, max_position_embeddings=2048),
}  # fmt: skip


def build_hf(
    shape: str, device: torch.device, dtype: torch.dtype = torch.float32, seed: int = 0, **overrides
):
    """A transformers model of `shape` (config fields in `overrides` replaced) with random weights (std 0.02
    init), built directly on `device`."""
    import transformers

    raw = {**SHAPES[shape], **overrides}
    arch = raw["architectures"][0]
    config_class = transformers.Qwen2Config if arch.startswith("Qwen2") else transformers.LlamaConfig
    model_class = getattr(transformers, arch)
    config = config_class(**raw)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_class(config)
    with torch.no_grad():  # norms of 1.0 exactly would hide a norm-weight bug: perturb them
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
            if name.endswith("bias"):
                param.normal_(0.0, 0.02)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.to(dtype).eval()


def checkpoint_of(hf_model, name: str) -> Checkpoint:
    """The HF model's weights as our engine's in-memory checkpoint (no copy; no tokenizer)."""
    raw = hf_model.config.to_dict()
    config = model_config(raw)
    state = hf_model.state_dict()
    items = [
        (key, tensor.float())
        for key, tensor in state.items()
        if not (config.tie_word_embeddings and key == "lm_head.weight") and "rotary_emb" not in key
    ]
    return Checkpoint(config, iter(items), len(items), TokenizerSource(), name)


def random_checkpoint(shape: str, device: str, seed: int = 0) -> Checkpoint:
    """Random weights of `shape` (std 0.02, norms 1 + 0.1 noise) made one tensor at a time on `device` as the
    engine loads them: no HF model is built (an 8B fp32 HF model beside the engine's KV pool does not fit)."""
    import transformers

    raw = SHAPES[shape]
    arch = raw["architectures"][0]
    config_class = transformers.Qwen2Config if arch.startswith("Qwen2") else transformers.LlamaConfig
    with torch.device("meta"):
        meta = getattr(transformers, arch)(config_class(**raw))
    config = model_config(meta.config.to_dict())
    shapes = [(name, tuple(t.shape)) for name, t in meta.state_dict().items()
              if not (config.tie_word_embeddings and name == "lm_head.weight") and "rotary_emb" not in name]  # fmt: skip
    gen = torch.Generator(device).manual_seed(seed)

    def tensors():
        for name, size in shapes:
            noise = torch.randn(size, generator=gen, device=device)
            yield name, (1.0 + 0.1 * noise) if "norm" in name else 0.02 * noise

    return Checkpoint(config, tensors(), len(shapes), TokenizerSource(), shape)


def engine_settings(dtype: str, max_num_seqs: int, kv_mb: int, **extra) -> EngineSettings:
    """The benchmarks' engine: `extra` replaces any field (kernel choices are KernelSettings fields)."""
    cuda = torch.cuda.is_available()
    fields = dict(device="cuda" if cuda else "cpu", dtype=dtype, max_model_len=2048, max_num_seqs=max_num_seqs,
                  max_num_batched_tokens=4096, kv_cache_memory_mb=kv_mb, num_threads=1 if cuda else 2)  # fmt: skip
    return EngineSettings(**{**fields, **extra})


class NullDetokenizer:
    stopped = False

    def __init__(self, prompt_ids: list[int], params: object) -> None:
        pass

    def add(self, token_id: int) -> str:
        return ""

    def flush(self) -> str:
        return ""


@dataclass
class Ours:
    runner: ModelRunner
    engine: object  # LLMEngine

    def free(self) -> None:
        del self.runner.model, self.runner.kv_cache, self.runner.cuda_steps
        gc.collect()  # graphs and their pools may sit in reference cycles
        torch.cuda.empty_cache()


def build_ours(hf_model, name: str, dtype: str, max_num_seqs: int, kv_mb: int, **extra) -> Ours:
    return build_ours_from(checkpoint_of(hf_model, name), name, dtype, max_num_seqs=max_num_seqs,
                           kv_cache_memory_mb=kv_mb, **extra)  # fmt: skip


def build_ours_from(checkpoint: Checkpoint, name: str, dtype: str, **fields) -> Ours:
    """Our engine on `checkpoint`; `fields` are EngineSettings fields over engine_settings' defaults."""
    from backends.local_engine.engine.device_sampler import DeviceSampler
    from backends.local_engine.engine.llm_engine import LLMEngine
    from backends.local_engine.engine.sampler import probabilities

    settings = engine_settings(
        dtype, fields.pop("max_num_seqs", 4), fields.pop("kv_cache_memory_mb", 512), **fields
    )
    runner = ModelRunner(settings, checkpoint=checkpoint)
    sampler = DeviceSampler(0) if runner.device.type == "cuda" else None
    sample_fn, sample_async_fn = (sampler.sample, sampler.sample_async) if sampler else (None, None)
    return Ours(
        runner, LLMEngine(settings, runner, probabilities, NullDetokenizer, sample_fn, sample_async_fn)
    )


def decode_bytes(runner: ModelRunner) -> int:
    """Weight bytes one decode step reads: all weights except an untied embedding table (one row read)."""
    from backends.local_engine.loading.weights import weight_bytes

    model = runner.model
    total = weight_bytes(model)
    embed = model.embed
    shared = any(
        t.untyped_storage().data_ptr() == embed.weight.untyped_storage().data_ptr()
        for t in model.lm_head.parameters()
    )
    if not shared:
        total -= embed.weight.untyped_storage().nbytes()
        total -= 0 if embed.scale is None else embed.scale.untyped_storage().nbytes()
    return total


def hf_decode_bytes(hf_model) -> int:
    tied = hf_model.config.tie_word_embeddings
    total = sum(p.numel() * p.element_size() for p in hf_model.parameters())
    return total if tied else total - hf_model.model.embed_tokens.weight.numel() * hf_model.dtype.itemsize


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def random_prompts(count: int, low: int, high: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=gen).tolist()
    return [torch.randint(10, vocab, (n,), generator=gen).tolist() for n in lengths]


def hf_static(hf_model, prompts: list[list[int]], batch: int, new_tokens: int) -> list[list[int]]:
    """HF static batching: prompts in batches of `batch`, left-padded, greedy `new_tokens` each."""
    outputs = []
    device = next(hf_model.parameters()).device
    for start in range(0, len(prompts), batch):
        group = prompts[start : start + batch]
        width = max(map(len, group))
        ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros(len(group), width, dtype=torch.long)
        for row, prompt in enumerate(group):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        with torch.no_grad():
            out = hf_model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=new_tokens,
                min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
            )  # fmt: skip
        outputs.extend(out[:, width:].tolist())
    return outputs


def hf_logits(hf_model, ids: list[int], dtype: torch.dtype = torch.float32) -> Tensor:
    device = next(hf_model.parameters()).device
    with torch.no_grad():
        return hf_model(torch.tensor([ids], device=device)).logits[0].to(dtype)


def hf_decode_logits(hf_model, ids: list[int], first: int) -> Tensor:
    """HF's own logits predicting ids[first:] from a prefill of ids[:first] and then one cached decode step
    per token: how far HF's decode is from its own prefill (the floor of any decode-vs-prefill comparison)."""
    device = next(hf_model.parameters()).device
    with torch.no_grad():
        out = hf_model(torch.tensor([ids[:first]], device=device), use_cache=True)
        rows, past = [out.logits[0, -1]], out.past_key_values
        for token in ids[first:-1]:
            out = hf_model(torch.tensor([[token]], device=device), past_key_values=past, use_cache=True)
            rows.append(out.logits[0, -1])
            past = out.past_key_values
    return torch.stack(rows).float()
