"""The vLLM-compatible HTTP server over the engine (README.md in backends/local_engine: the rooms)."""
