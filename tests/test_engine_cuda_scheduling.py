"""On CUDA the engine's scheduling limits default to the measured ones (config.CUDA_SCHEDULING, issue 45) unless
set; the CPU keeps its own defaults."""

from backends.local_engine.config import CUDA_SCHEDULING, EngineSettings


def test_cuda_takes_the_measured_budget_and_admission_cap_unless_set() -> None:
    cpu, cuda = EngineSettings(), EngineSettings(device="cuda")
    assert (cpu.max_num_batched_tokens, cpu.max_num_seqs) == (256, 32)
    assert (cuda.max_num_batched_tokens, cuda.max_num_seqs) == (2048, 256) == tuple(CUDA_SCHEDULING.values())
    given = EngineSettings(device="cuda:0", max_num_seqs=64)
    assert (given.max_num_batched_tokens, given.max_num_seqs) == (2048, 64)
