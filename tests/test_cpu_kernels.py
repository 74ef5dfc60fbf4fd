"""The x86 CPU kernels (kernels/cpu/ops.py): int4 / int8 matmuls and the one-call int4 step (cpu_decode.py).

Run wherever the CPU has AVX2 (int4_cpu_kernel="auto": AVX-512 VNNI where the
CPU has it, else AVX2; one test compares the two); skipped elsewhere or where the extension cannot be built.
"""

import shutil

import pytest

torch = pytest.importorskip("torch")

from backends.local_engine.config import EngineSettings  # noqa: E402
from backends.local_engine.engine.model_runner import ModelRunner  # noqa: E402
from backends.local_engine.engine.sequence import ScheduledSeq, Sequence  # noqa: E402
from backends.local_engine.kernels.cpu import ops as cpu_kernels  # noqa: E402
from backends.local_engine.kernels.quantize import dequantize_int4, quantize_int4, quantize_int8  # noqa: E402
from backends.local_engine.loading.checkpoint import Checkpoint, TokenizerSource  # noqa: E402
from backends.local_engine.model.model_config import ModelConfig  # noqa: E402


@pytest.fixture(autouse=True)
def kernels(monkeypatch):
    cpu_kernels.available.cache_clear()
    if cpu_kernels.choice() == "torch" or shutil.which("c++") is None:
        pytest.skip("no AVX2 here, or no C++ compiler")
    assert cpu_kernels.available(), "an AVX2 CPU with a C++ compiler must build the kernels (see the warning)"
    yield
    cpu_kernels.available.cache_clear()


def test_packings_round_trip():
    q = torch.randint(0, 16, (16, 96), dtype=torch.int32)
    scales_and_zeros = torch.randn(3, 16, 2)
    codes, scales = cpu_kernels.pack(q, scales_and_zeros)
    back, sz = cpu_kernels.unpack(codes, scales)
    assert torch.equal(back.int(), q) and torch.equal(sz, scales_and_zeros.bfloat16())
    w8 = torch.randint(-127, 128, (16, 64), dtype=torch.int8)
    packed = cpu_kernels.pack_int8(w8)  # byte 4 r + c of (tile, k4) is code (8 tile + r, 4 k4 + c)
    assert packed[1, 3, 4 * 5 + 2] == w8[8 + 5, 4 * 3 + 2]


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 17])
def test_int4_matches_the_dequantized_weight(rows):
    torch.manual_seed(rows)
    weight, bias = torch.randn(40, 96) * 0.05, torch.randn(40)
    layer = cpu_kernels.Int4CpuLinear(weight, bias, 32)
    q, scales_and_zeros = quantize_int4(weight, 32)
    dequantized = dequantize_int4(q, scales_and_zeros.bfloat16().float(), 32).double()
    x = torch.randn(rows, 96)
    expected = x.double() @ dequantized.t() + bias.double()
    error = (layer(x).double() - expected).norm() / expected.norm()
    assert error < 1e-2  # activations are int8 per group of 32: ~0.5 % relative error
    assert layer(x.bfloat16()).dtype == torch.bfloat16
    assert layer(x.view(1, rows, 96)).shape == (1, rows, 40)


def test_a_row_does_not_depend_on_the_rows_beside_it():
    torch.manual_seed(0)
    layer = cpu_kernels.Int4CpuLinear(torch.randn(64, 128), None, 32)
    head = cpu_kernels.Int8CpuLinear(torch.randn(64, 128))
    x = torch.randn(11, 128)
    for module in (layer, head):
        together = module(x)
        assert all(torch.equal(together[i], module(x[i : i + 1])[0]) for i in range(11))


def test_int8_matches_the_quantized_weight():
    torch.manual_seed(1)
    weight = torch.randn(48, 64)
    q, scale = quantize_int8(weight)
    x = torch.randn(6, 64)
    expected = x.double() @ (q.double() * scale.double()[:, None]).t()
    out = cpu_kernels.Int8CpuLinear(weight)(x)
    assert (out.double() - expected).norm() / expected.norm() < 1e-2


def test_the_vnni_tiles_give_the_avx2_tiles_bits():
    if cpu_kernels.choice() != "avx512vnni":
        pytest.skip("this CPU has no AVX-512 VNNI")
    torch.manual_seed(3)
    layer = cpu_kernels.Int4CpuLinear(torch.randn(64, 1536) * 0.05, None, 32)
    head = cpu_kernels.Int8CpuLinear(torch.randn(72, 576))
    x4, x8 = torch.randn(9, 1536) * 3, torch.randn(9, 576) * 3
    extension = cpu_kernels._extension()
    assert extension.set_isa("avx2") == "avx512vnni"
    try:
        avx2 = layer(x4), head(x8)
    finally:
        extension.set_isa("avx512vnni")
    assert torch.equal(layer(x4), avx2[0]) and torch.equal(head(x8), avx2[1])


def test_choice_follows_the_cpu_and_the_setting(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "_cpu_flags", lambda: {"avx2", "fma", "f16c", "avx512f"})
    assert cpu_kernels.choice("auto") == "avx2"
    vnni = {"avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512vl", "avx512bw"}
    monkeypatch.setattr(cpu_kernels, "_cpu_flags", lambda: vnni)
    assert cpu_kernels.choice() == "avx512vnni"
    assert cpu_kernels.choice("avx2") == "avx2"
    assert cpu_kernels.choice("avx512vnni") == "avx512vnni"
    assert cpu_kernels.choice("torch") == "torch"
    monkeypatch.setattr(cpu_kernels, "_cpu_flags", lambda: {"sse4_2"})
    assert cpu_kernels.choice("avx2") == "torch"  # forced, but the CPU cannot run it
    with pytest.raises(ValueError, match="int4_cpu_kernel"):
        cpu_kernels.choice("fast")


def tiny_checkpoint(layers: int = 2, bias: bool = False) -> Checkpoint:
    config = ModelConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=layers, num_heads=4, num_kv_heads=2,
        head_dim=16, attention_bias=bias,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(7)

    def rand(*shape: int, scale: float = 0.1) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * scale

    tensors = {"model.embed_tokens.weight": rand(256, 64, scale=1.0), "model.norm.weight": 1 + rand(64)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": 1 + rand(64),
            p + "post_attention_layernorm.weight": 1 + rand(64),
        }
        tensors |= {
            p + f"self_attn.{n}_proj.weight": rand(rows, 64)
            for n, rows in zip("qkv", (64, 32, 32), strict=True)
        }
        tensors |= {p + "self_attn.o_proj.weight": rand(64, 64), p + "mlp.down_proj.weight": rand(64, 128)}
        tensors |= {p + "mlp.gate_proj.weight": rand(128, 64), p + "mlp.up_proj.weight": rand(128, 64)}
        if bias:
            tensors |= {
                p + f"self_attn.{n}_proj.bias": rand(rows)
                for n, rows in zip("qkv", (64, 32, 32), strict=True)
            }
    return Checkpoint(config, iter(tensors.items()), len(tensors), TokenizerSource(), "tiny")


def tiny_runner(fused: bool, monkeypatch, bias: bool = False) -> ModelRunner:
    settings = EngineSettings(
        dtype="int4", kv_cache_memory_mb=4, kv_cache_dtype="fp32", max_model_len=256, cpu_fused_decode=fused
    )
    runner = ModelRunner(settings, checkpoint=tiny_checkpoint(bias=bias))
    assert (runner.cpu_decoder is not None) == fused
    return runner


def mixed_step(runner: ModelRunner) -> list[torch.Tensor]:
    """Prefill three sequences, then one step holding a decode row, a 20-token chunk and a 3-token span."""
    a = Sequence(list(range(1, 30)), block_table=[0, 1])
    b = Sequence(list(range(40, 90)), block_table=[2, 3, 4, 5])
    c = Sequence(list(range(100, 120)), block_table=[6, 7])
    runner.execute([ScheduledSeq(a, 28), ScheduledSeq(b, 30), ScheduledSeq(c, 17)])
    for seq, done in ((a, 28), (b, 30), (c, 17)):
        seq.num_computed_tokens = done
    outputs = runner.execute([ScheduledSeq(a, 1), ScheduledSeq(b, 20, 20), ScheduledSeq(c, 3, 3)])
    return [out.logits for out in outputs]


@pytest.mark.parametrize("bias", [False, True])
def test_one_call_step_equals_the_models_own_forward(monkeypatch, bias):
    fused = mixed_step(tiny_runner(True, monkeypatch, bias))
    reference = mixed_step(tiny_runner(False, monkeypatch, bias))
    for got, want in zip(fused, reference, strict=True):
        assert got.shape == want.shape
        # same kernels, float32 K/V; the paths differ in summation order only, which can move an activation
        # across an int8 rounding boundary (0.5 % here at most; a wrong head, mask or slot gives tens of %)
        assert (got - want).norm() < 2e-2 * want.norm()


def test_a_prefill_chunk_attends_as_its_rows_would_one_by_one(monkeypatch):
    """Long spans attend through BLAS, short ones row by row: the two agree to float rounding."""
    runner = tiny_runner(True, monkeypatch)
    results = []
    for one_by_one in (False, True):
        runner.kv_cache.pool.zero_()
        seq = Sequence(list(range(40, 90)), block_table=[2, 3, 4, 5])
        runner.execute([ScheduledSeq(seq, 30)])
        seq.num_computed_tokens = 30
        if not one_by_one:
            results.append(runner.execute([ScheduledSeq(seq, 20, 20)])[0].logits)
            continue
        rows = []
        for end in range(31, 51):
            seq.token_ids = list(range(40, 40 + end))
            rows.append(runner.execute([ScheduledSeq(seq, 1)])[0].logits[-1])
            seq.num_computed_tokens = end
        results.append(torch.stack(rows))
    assert (results[0] - results[1]).abs().max() < 1e-4 * results[1].abs().max()


def test_a_decode_row_gives_the_same_logits_alone_or_in_a_mixed_step(monkeypatch):
    runner = tiny_runner(True, monkeypatch)
    in_mixed = mixed_step(runner)[0]
    runner.kv_cache.pool.zero_()
    a = Sequence(list(range(1, 30)), block_table=[0, 1])
    runner.execute([ScheduledSeq(a, 28)])
    a.num_computed_tokens = 28
    alone = runner.execute([ScheduledSeq(a, 1)])[0].logits
    assert torch.equal(alone, in_mixed)


def test_a_decode_row_gives_the_same_logits_in_a_step_of_many_sequences(monkeypatch):
    """With >= 4 chunks per thread a task reads all KV heads of its chunk, alone it reads one: same bits."""
    runner = tiny_runner(True, monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seqs = [Sequence(list(range(1 + i, 20 + 2 * i)), block_table=[2 * i, 2 * i + 1]) for i in range(10)]
        runner.execute([ScheduledSeq(seq, len(seq.token_ids) - 1) for seq in seqs])
        for seq in seqs:
            seq.num_computed_tokens = len(seq.token_ids) - 1
        together = [out.logits for out in runner.execute([ScheduledSeq(seq, 1) for seq in seqs])]
        alone = [runner.execute([ScheduledSeq(seq, 1)])[0].logits for seq in seqs]
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(alone, together, strict=True))


def test_the_kernels_let_other_python_threads_run():
    """The engine computes in a thread beside the server's event loop: a kernel must not hold the GIL."""
    import threading
    import time

    layer = cpu_kernels.Int4CpuLinear(torch.randn(3072, 576), None, 32)
    x = torch.randn(2048, 576)  # a call of ~50 ms; one thread for it, one core for the main thread
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    started = time.perf_counter()
    layer(x)
    call_s = time.perf_counter() - started
    done = threading.Event()

    def compute() -> None:
        for _ in range(3):
            layer(x)
        done.set()

    worker = threading.Thread(target=compute)
    last, longest = time.perf_counter(), 0.0
    worker.start()
    while not done.is_set():  # the longest the main thread waited between two of its own steps
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    worker.join()
    torch.set_num_threads(threads)
    assert longest < call_s / 2, (longest, call_s)  # holding the GIL, the main thread waits out whole calls
