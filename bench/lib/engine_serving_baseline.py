"""The static-batching baseline: HF transformers `generate()` on up to 16 padded prompts at a time.

A batch starts only when the previous one finished and runs until its longest request is done. Step
times come from a logits processor, so the first token and every later token of each request are timed
like the engine's streamed tokens.
"""

import asyncio
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass
class Job:
    prompt_ids: list[int]
    max_tokens: int
    done: asyncio.Future
    loop: asyncio.AbstractEventLoop
    submitted: float = field(default_factory=time.perf_counter)


class _StepClock:
    """A logits processor that records when each decoding step's logits are ready."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return scores


class StaticBatchingServer:
    def __init__(self, gguf_path: Path, num_threads: int, max_batch: int = 16) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(num_threads)
        self.model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name).eval()
        self.max_batch = max_batch
        self._queue: list[Job] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._serve, daemon=True).start()

    async def generate(self, prompt_ids: list[int], max_tokens: int) -> tuple[float, list[float], int]:
        """(first-token time, later token times, number of tokens) for one request, like a stream."""
        loop = asyncio.get_running_loop()
        job = Job(prompt_ids, max_tokens, loop.create_future(), loop)
        with self._cond:
            self._queue.append(job)
            self._cond.notify()
        return await job.done

    def _serve(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue)
                batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            times = self._run_batch(batch)
            for job in batch:
                mine = times[: job.max_tokens]
                job.loop.call_soon_threadsafe(job.done.set_result, (mine[0], mine[1:], len(mine)))

    def _run_batch(self, batch: list[Job]) -> list[float]:
        width = max(len(job.prompt_ids) for job in batch)
        pad = 0
        ids = torch.tensor([[pad] * (width - len(j.prompt_ids)) + j.prompt_ids for j in batch])
        mask = torch.tensor([[0] * (width - len(j.prompt_ids)) + [1] * len(j.prompt_ids) for j in batch])
        clock = _StepClock()
        new_tokens = max(job.max_tokens for job in batch)
        with torch.inference_mode():
            self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=pad,
                logits_processor=[clock],
            )
        return clock.times
