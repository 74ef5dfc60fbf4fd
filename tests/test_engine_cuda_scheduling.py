"""On CUDA the engine's scheduling limits default to the measured ones (config.CUDA_SCHEDULING, issue 45) unless
set; the CPU keeps its own defaults."""

from backends.local_engine.config import CUDA_SCHEDULING, EngineSettings


def test_cuda_takes_the_measured_budget_and_admission_cap_unless_set() -> None:
    cpu, cuda = EngineSettings(), EngineSettings(device="cuda")
    limits = ("max_num_batched_tokens", "max_num_seqs", "lower_priority_prefill_tokens")
    assert tuple(getattr(cpu, name) for name in limits) == (256, 32, 8)
    assert tuple(getattr(cuda, name) for name in limits) == (2048, 256, 512)
    assert {name: CUDA_SCHEDULING[name] for name in limits} == CUDA_SCHEDULING
    given = EngineSettings(device="cuda:0", max_num_seqs=64, lower_priority_prefill_tokens=None)
    assert tuple(getattr(given, name) for name in limits) == (2048, 64, None)
