"""The engine's CUDA path, run on the CPU through Triton's interpreter (or on a GPU: KERNEL_TEST_DEVICE=cuda).

Covers what only runs on CUDA in production: the step runner (one packed input copy, decode bucket padding,
fused layer kernels, both paged-attention kernels) against transformers' logits on the same random
weights, the int8/int4 matmul and fused elementwise kernels against torch, decode graph buckets, and the
batched on-device sampler against the per-request sampler's semantics.
"""

import importlib
import sys

import pytest  # noqa: E402
import torch  # noqa: E402

from backends.local_engine.engine.cuda_runner import (  # noqa: E402
    CudaStepRunner,
    bucket_for,
    graph_buckets,
    prefill_bucket,
    prefill_buckets,
    prefill_shapes,
)
from backends.local_engine.engine.sequence import ScheduledSeq, Sequence  # noqa: E402
from backends.local_engine.kernels.quantize import dequantize_int4, quantize_int4, quantize_int8  # noqa: E402
from backends.local_engine.kernels.triton.fused import add_rms_norm, rope_write_kv, silu_mul  # noqa: E402
from backends.local_engine.kernels.triton.quant_own import int4_matmul, int8_matmul, pack_int4  # noqa: E402
from backends.local_engine.model import attention_cuda  # noqa: E402
from backends.local_engine.model.rope import RotaryTable, rotate_  # noqa: E402
from bench.lib.engine_gpu_models import build_hf, build_ours, hf_logits  # noqa: E402
from tests.triton_interpreter_support import DEVICE, INTERPRET  # first: sets up the interpreter on CPU

if INTERPRET:  # kernels decorated before the interpreter was switched on (earlier test files) recompile
    for _name in ("attention", "gemv", "quant_own", "fused", "paged_attention", "quant_matmul"):
        _module = sys.modules.get(f"backends.local_engine.kernels.triton.{_name}")
        if _module is not None:
            importlib.reload(_module)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float().cpu(), b.float().cpu()  # the runner's logits may come back on the host
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen"])
def model_pair(request):
    hf = build_hf(request.param, torch.device(DEVICE))
    ours = build_ours(hf, request.param, "fp32", 4, 16)
    runner = ours.runner
    if runner.cuda_steps is None:  # on CPU: the CUDA step runner over the CPU model (no graphs)
        runner.cuda_steps = CudaStepRunner(runner.model, runner.kv_cache, runner.block_size, 4, 2048, 256)
    return hf, runner


class EagerGraph:
    """Stands in for a captured prefill graph on CPU: replay runs the same padded forward eagerly."""

    def __init__(self, steps: CudaStepRunner, tokens: int, seqs: int) -> None:
        self.steps, self.tokens, self.seqs = steps, tokens, seqs
        self.logits = torch.empty(0)

    def replay(self) -> None:
        out = self.steps._prefill_forward(self.tokens, self.seqs)
        self.logits.resize_(out.shape).copy_(out)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["own", "kernels"])
@pytest.mark.parametrize("padded_prefill", [False, True])
def test_step_runner_matches_transformers_for_mixed_and_decode_steps(
    model_pair, kernel, padded_prefill
) -> None:
    hf, runner = model_pair
    attention_cuda.use_kernel(kernel)
    steps = runner.cuda_steps
    steps.prefill_graphs = {}
    if padded_prefill:  # the mixed step below (22 tokens, 3 sequences) runs padded to (32 tokens, 4 seqs)
        fake = EagerGraph(steps, 32, 4)
        steps.prefill_graphs[(32, 4)] = (fake, fake.logits)
    a = Sequence(list(range(20, 57)), block_table=[3, 0, 5])  # 37 tokens, blocks out of order
    b = Sequence(list(range(100, 107)), block_table=[1])
    logits = steps.run([ScheduledSeq(a, 37, 1), ScheduledSeq(b, 7, 7)])
    assert rel(logits[0], hf_logits(hf, a.token_ids)[-1]) < 1e-5
    assert rel(logits[1:], hf_logits(hf, b.token_ids)) < 1e-5
    a.num_computed_tokens, b.num_computed_tokens = 37, 7
    c = Sequence(list(range(200, 220)), block_table=[2, 4])
    for step in range(3):  # two decodes plus a prefill chunk of c, then three decodes (bucket 4, padded)
        a.append_token(7 + step)
        b.append_token(9 + step)
        batch = [ScheduledSeq(a, 1), ScheduledSeq(b, 1)]
        if step == 0:
            batch.append(ScheduledSeq(c, 20))
        elif step == 1:
            c.append_token(5)
            batch.append(ScheduledSeq(c, 1))
        logits = steps.run(batch)
        for row, seq in enumerate(item.seq for item in batch):
            assert rel(logits[row], hf_logits(hf, seq.token_ids)[-1]) < 1e-5
        for item in batch:
            item.seq.num_computed_tokens += item.num_new_tokens
    attention_cuda._ACTIVE.clear()


def test_graph_buckets_cover_every_batch_size() -> None:
    buckets = graph_buckets(200)
    assert buckets[:4] == [1, 2, 4, 8] and buckets[-1] == 200
    for size in range(1, 201):
        bucket = bucket_for(size, buckets)
        assert bucket >= size and (bucket == 1 or bucket_for(size - 1, buckets) <= bucket)
    assert bucket_for(201, buckets) is None
    assert graph_buckets(1) == [1]


def test_mixed_graph_shapes_hold_every_step_up_to_the_budget() -> None:
    sizes = prefill_buckets(2048, 256, mixed=True)
    shapes = set(prefill_shapes(*sizes))
    assert sizes[0][-1] == 2048 and sizes[1][-1] == 257 and len(shapes) < 120
    for tokens in range(1, 2049, 7):
        for seqs in (1, 2, 9, 100, 256):
            if seqs <= tokens:
                shape = prefill_bucket(tokens, seqs, seqs, sizes)
                assert shape in shapes and shape[0] - tokens < 256 and shape[1] > seqs
    assert prefill_bucket(2049, 1, 1, sizes) is None
    assert prefill_buckets(2048, 256, mixed=False) == ([16, 32, 64, 128, 256], [2, 4, 8])
    assert prefill_buckets(8192, 256, mixed=True)[0][-1] == 2048  # larger steps run eagerly
    assert prefill_bucket(3000, 10, 10, prefill_buckets(8192, 256, mixed=True)) is None


@pytest.mark.slow
def test_a_mixed_graph_of_many_sequences_applies_the_head_after_the_replay(model_pair) -> None:
    hf, runner = model_pair
    attention_cuda.use_kernel("kernels")
    steps = CudaStepRunner(runner.model, runner.kv_cache, runner.block_size, 16, 2048, 256, mixed_graphs=True)
    fake = EagerGraph(steps, 32, 16)  # 10 sequences of 3 tokens: (30 tokens, 10 + 1 sequences) -> (32, 16)
    steps.prefill_graphs = {(32, 16): (fake, fake.logits)}
    seqs = [Sequence(list(range(10 * i + 3, 10 * i + 6)), block_table=[i]) for i in range(10)]
    logits = steps.run([ScheduledSeq(seq, 3) for seq in seqs])
    assert fake.logits.shape[-1] != logits.shape[-1]  # the graph kept hidden rows, not [16, vocab] logits
    for row, seq in enumerate(seqs):
        assert rel(logits[row], hf_logits(hf, seq.token_ids)[-1]) < 1e-5
    attention_cuda._ACTIVE.clear()


@pytest.mark.parametrize("rows", [1, 5, 20])
def test_int8_and_int4_kernels_match_their_dequantized_weights(rows: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    weight = (torch.randn(48, 256, generator=generator) * 0.02).to(DEVICE)
    x = torch.randn(rows, 256, generator=generator).to(DEVICE)
    q, scale = quantize_int8(weight)
    assert rel(int8_matmul(x, q, scale), x @ (q.float() * scale[:, None]).T) < 1e-5
    q4, scales_and_zeros = quantize_int4(weight, 32)
    scale4, zero4 = scales_and_zeros.unbind(-1)
    out = int4_matmul(x, pack_int4(q4), torch.stack([scale4.t(), (zero4 - 8 * scale4).t()]).contiguous(), 32)
    assert rel(out, x @ dequantize_int4(q4, scales_and_zeros, 32).T) < 1e-5


def test_fused_kernels_match_torch() -> None:
    generator = torch.Generator().manual_seed(0)
    x, residual, weight = (
        torch.randn(shape, generator=generator).to(DEVICE) for shape in ((3, 96), (3, 96), (96,))
    )
    normed, summed = add_rms_norm(x, residual, weight, 1e-5)
    assert rel(summed, x + residual) < 1e-6
    assert rel(normed, torch.nn.functional.rms_norm(x + residual, (96,), weight, 1e-5)) < 1e-5
    gate_up = torch.randn(3, 64, generator=generator).to(DEVICE)
    assert rel(silu_mul(gate_up), torch.nn.functional.silu(gate_up[:, :32]) * gate_up[:, 32:]) < 1e-5
    config = build_hf("tiny", torch.device("cpu")).config
    from backends.local_engine.loading.hf import model_config

    table = RotaryTable(model_config(config.to_dict()), 64, torch.device(DEVICE))
    heads, kv_heads, dim = 4, 2, 32
    qkv = torch.randn(3, (heads + 2 * kv_heads) * dim, generator=generator).to(DEVICE)
    positions, slots = torch.tensor([5, 0, 63]).to(DEVICE), torch.tensor([7, 2, 9]).to(DEVICE)
    pool = torch.zeros(2, 10, kv_heads, dim, device=DEVICE)
    expected = qkv.clone().view(3, heads + 2 * kv_heads, dim)
    rotate_(expected[:, : heads + kv_heads], table.lookup(positions))
    rope_write_kv(qkv, positions, table.rotations, slots, pool, heads, kv_heads)
    got = qkv.view(3, heads + 2 * kv_heads, dim)
    assert rel(got[:, :heads], expected[:, :heads]) < 1e-6
    assert rel(pool[0, slots], expected[:, heads : heads + kv_heads]) < 1e-6
    assert rel(pool[1, slots], expected[:, heads + kv_heads :]) < 1e-6


def _gemv_weights(weight: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(weight, scale) as gemv takes them for `fmt`, and the dense weight they stand for."""
    if fmt == "int8":
        q, scale = quantize_int8(weight)
        return q, scale, q.float() * scale[:, None]
    if fmt == "int4":
        q4, scales_and_zeros = quantize_int4(weight, 32)
        scale4, zero4 = scales_and_zeros.unbind(-1)
        scales_mins = torch.stack([scale4.t(), (zero4 - 8 * scale4).t()]).contiguous()
        return pack_int4(q4), scales_mins, dequantize_int4(q4, scales_and_zeros, 32)
    return weight, None, weight


@pytest.mark.parametrize("fmt", ["float", "int8", "int4"])
def test_fused_gemv_matches_the_unfused_ops(fmt: str) -> None:
    """gemv_triton's batch-1 extras (RMSNorm in, bias, SwiGLU, residual out) against plain torch."""
    from backends.local_engine.kernels.triton.gemv import gemv

    generator = torch.Generator().manual_seed(len(fmt))
    x, residual, norm, bias = (
        torch.randn(shape, generator=generator).to(DEVICE) for shape in ((1, 128), (1, 40), (128,), (40,))
    )
    weight = (torch.randn(80, 128, generator=generator) * 0.05).to(DEVICE)
    w, s, dense = _gemv_weights(weight, fmt)
    top = None if s is None else (s[:, :40] if fmt == "int4" else s[:40])  # the first 40 rows' scales
    normed = torch.nn.functional.rms_norm(x, (128,), norm, 1e-5)
    assert rel(gemv(x, w, s), x @ dense.T) < 1e-5
    assert rel(gemv(x, w, s, norm=norm, eps=1e-5), normed @ dense.T) < 1e-5
    assert rel(gemv(x, w[:40], top, bias=bias), x @ dense[:40].T + bias) < 1e-5
    gate, up = (normed @ dense.T).chunk(2, -1)
    swiglu = gemv(x, w, s, norm=norm, eps=1e-5, swiglu=True)
    assert swiglu.shape == (1, 40) and rel(swiglu, torch.nn.functional.silu(gate) * up) < 1e-5
    out = gemv(x, w[:40], top, residual=residual)
    assert rel(out, x @ dense[:40].T + residual) < 1e-5


def test_batch1_decode_through_fused_gemvs_matches_transformers(model_pair) -> None:
    """One sequence decoding: the layers run gemv_forward (norms, SwiGLU and residual adds in the GEMVs)."""
    from backends.local_engine.kernels.quant import ConcatLinear, DenseLinear

    hf, runner = model_pair
    model, steps = runner.model, runner.cuda_steps
    apart = {}  # fp32 on CUDA keeps q/k/v and gate/up apart (quant.ConcatLinear); the GEMV takes them stacked
    for layer in model.layers:
        for name in ("qkv", "gate_up"):
            module = getattr(layer, name)
            if isinstance(module, ConcatLinear):
                apart[(layer, name)] = module
                biases = [p.bias for p in module.parts]
                bias = None if biases[0] is None else torch.cat(biases)
                setattr(layer, name, DenseLinear(torch.cat([p.weight for p in module.parts]), bias))
    linears = [m for layer in model.layers for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]
    try:
        for linear in linears:
            linear.gemv = True  # on CPU these run through Triton's interpreter
        model.__dict__.pop("_gemv_cache", None)
        assert model._gemv_operands() is not None
        seq = Sequence(list(range(30, 50)), block_table=[6, 1])
        steps.run([ScheduledSeq(seq, 20, 1)])
        seq.num_computed_tokens = 20
        for token in (11, 12):
            seq.append_token(token)
            logits = steps.run([ScheduledSeq(seq, 1)])
            assert rel(logits[0], hf_logits(hf, seq.token_ids)[-1]) < 1e-5
            seq.num_computed_tokens += 1
    finally:
        for linear in linears:
            linear.gemv = False
        for (layer, name), module in apart.items():
            setattr(layer, name, module)
        model.__dict__.pop("_gemv_cache", None)


def test_async_decode_through_the_step_runner_matches_plain_decode(model_pair) -> None:
    """Decode steps fed from the device's sampled tokens (pipeline.py) give the plain loop's greedy tokens."""
    from backends.local_engine.config import EngineSettings
    from backends.local_engine.engine.device_sampler import DeviceSampler
    from backends.local_engine.engine.llm_engine import LLMEngine
    from backends.local_engine.engine.sampler import probabilities
    from backends.local_engine.engine.sampling_params import SamplingParams
    from bench.lib.engine_gpu_models import NullDetokenizer

    _, runner = model_pair
    outputs = []
    for async_decode in (False, True):
        settings = EngineSettings(max_model_len=256, max_num_seqs=4, async_decode=async_decode)
        sampler = DeviceSampler(0)
        llm = LLMEngine(
            settings, runner, probabilities, NullDetokenizer, sampler.sample, sampler.sample_async
        )
        ids = [llm.add_request(p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
               for p, n in ((list(range(30, 41)), 6), (list(range(60, 65)), 4))]  # fmt: skip
        tokens = {seq_id: [] for seq_id in ids}
        while llm.has_work:
            for out in llm.step():
                tokens[out.seq_id] += out.new_token_ids
        outputs.append(list(tokens.values()))
    assert outputs[0] == outputs[1] and [len(t) for t in outputs[0]] == [6, 4]


def test_int4_forward_wires_the_fused_layer_as_the_unfused_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """model.int4_forward (the engine setting int4_fused: norms, residual adds and SwiGLU inside int4_mma's kernel)
    against fused_forward over the same int4_mma layers, prefill and decode. int4_mma's kernel is replaced by a
    torch reference of its semantics here (the kernel itself: tests/test_int4_mma_fused.py on a GPU)."""
    from backends.local_engine.kernels.cuda import int4_mma
    from tests.test_int4_mma_fused import reference_int4_mma

    hf = build_hf("tiny", torch.device(DEVICE))
    runner = build_ours(hf, "tiny", "bf16", 4, 16).runner
    steps = runner.cuda_steps or CudaStepRunner(
        runner.model, runner.kv_cache, runner.block_size, 4, 2048, 256
    )
    model = runner.model
    monkeypatch.setattr(int4_mma, "int4_mma_matmul", reference_int4_mma)
    for layer in model.layers:
        for name in ("qkv", "o_proj", "gate_up", "down"):
            weight = getattr(layer, name).weight.float()
            setattr(layer, name, int4_mma.Int4MmaLinear(weight, None, 32, gate_up=name == "gate_up"))

    def run(fused: bool, blocks: list[int]) -> list[torch.Tensor]:
        model._int4_fused_cache = fused
        seq = Sequence(list(range(30, 50)), block_table=blocks)
        out = [steps.run([ScheduledSeq(seq, 20, 1)])[0]]
        seq.num_computed_tokens = 20
        for token in (11, 12):
            seq.append_token(token)
            out.append(steps.run([ScheduledSeq(seq, 1)])[0])
            seq.num_computed_tokens += 1
        return out

    assert model._int4_fused()  # every layer qualifies
    for fused, unfused in zip(run(True, [6, 1]), run(False, [7, 2]), strict=True):
        assert rel(fused, unfused) < 3e-2  # bf16 roundings differ (x * norm rounded, not the normed x)
