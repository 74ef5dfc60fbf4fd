"""Prefill / mixed-step CUDA graphs against the eager step (bench/engine_serving_gpu.py, scenario `graphs`).

`GraphCheck` wraps a CudaStepRunner's `run`: for the first `limit` steps that replay a graph beyond the small
prefill set (more than 256 tokens or 8 sequences), it runs the same step eagerly right after (the eager
forward writes the same K/V slots again, so the sequences go on unchanged) and keeps the relative logit
difference and the argmax agreement. `without_mixed` gives the graph table of the engine before mixed graphs.
"""

from typing import Any

from backends.local_engine.engine.cuda_runner import (
    PREFILL_SEQS,
    PREFILL_TOKENS,
    CudaStepRunner,
    host_step,
    prefill_bucket,
)


def is_mixed_shape(shape: tuple[int, int]) -> bool:
    return shape[0] > PREFILL_TOKENS[-1] or shape[1] > PREFILL_SEQS[-1]


def without_mixed(graphs: dict[tuple[int, int], Any]) -> dict[tuple[int, int], Any]:
    return {shape: graph for shape, graph in graphs.items() if not is_mixed_shape(shape)}


class GraphCheck:
    def __init__(self, steps: CudaStepRunner, limit: int = 8) -> None:
        self.steps, self.limit, self.rows = steps, limit, []
        self._run = steps.run
        steps.run = self.run  # type: ignore[method-assign]

    def close(self) -> None:
        del self.steps.run  # the class's method again (no runner -> bound method -> runner cycle)

    def run(self, batch, input_tokens=None):
        out = self._run(batch, input_tokens)
        if len(self.rows) >= self.limit or out is None or input_tokens is not None:
            return out
        step = host_step(batch, self.steps.block_size)
        if step.is_decode:
            return out
        shape = prefill_bucket(len(step.input_ids), len(step.context_lens), len(step.logit_rows),
                               self.steps.prefill_sizes)  # fmt: skip
        if shape is None or shape not in self.steps.prefill_graphs or not is_mixed_shape(shape):
            return out
        eager = self.steps._run_eager(step)
        a, b = out.float(), eager.float()
        self.rows.append({
            "tokens": len(step.input_ids), "seqs": len(step.context_lens), "graph": list(shape),
            "rel_diff": float((a - b).norm() / b.norm()),
            "argmax_agree": float((a.argmax(-1) == b.argmax(-1)).float().mean()),
        })  # fmt: skip
        return out

    def summary(self) -> dict[str, Any]:
        if not self.rows:
            return {"steps": 0}
        return {
            "steps": len(self.rows),
            "max_rel_diff": max(r["rel_diff"] for r in self.rows),
            "min_argmax_agree": min(r["argmax_agree"] for r in self.rows),
            "rows": self.rows,
        }
