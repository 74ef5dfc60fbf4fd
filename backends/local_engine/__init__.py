"""Our self-hosted inference engine: paged KV cache, continuous batching, quantization."""
