"""The benchmarks' helpers: modules with no command of their own that bench/'s benchmarks import.

Processes and ports (harness, engine_http, llama_cpp), the data sets and their loaders (routellm_data,
trivia_data, trace_data, verifier_pairs), and the parts a benchmark splits off or shares with another
(cascade_*, engine_gpu_*, admission_*, ...). training/ and studies/ import some of them too. Nothing here
imports a benchmark of bench/'s top level, so the two cannot close an import circle (pyproject.toml's
import-linter contracts).
"""
