"""ModelRunner: runs one flat forward pass over the scheduled sequences and returns their logits.

Interface used by the serving side (keep stable):

    runner = ModelRunner(settings)          # loads model + tokenizer, allocates the paged KV pool
    runner.num_blocks, runner.block_size    # size of the KV pool handed to the block manager
    runner.tokenizer                        # tokenizer.Tokenizer (encode, decode, apply_chat_template)
    runner.eos_token_ids                    # tuple[int, ...]
    runner.kv_bytes_per_token, runner.weight_bytes
    outputs = runner.execute([ScheduledSeq(seq, num_new_tokens, num_logits), ...])

`execute` computes seq.token_ids[seq.num_computed_tokens : seq.num_computed_tokens + num_new_tokens] for every
scheduled sequence in one forward pass, writing their K/V into the blocks of seq.block_table (allocated by the
block manager beforehand; it must cover all computed + new tokens). It returns one StepOutput per scheduled
sequence, in order, with logits [num_logits, vocab] (float32) for the last `num_logits` positions when the
chunk reaches the end of seq.token_ids, else None (a prefill chunk in the middle of a prompt).
`execute` never mutates the sequences: the scheduler advances seq.num_computed_tokens afterwards and samples
with `Sampler` (sampler.py) from the logits.

On CUDA (settings.device "cuda") steps go through cuda_runner.CudaStepRunner: paged-attention kernels,
one host-to-device copy per step, CUDA graphs for decode steps; the KV pool keeps one scratch block for
the graphs' padding rows. `ModelRunner(settings, checkpoint=...)` takes an in-memory checkpoint (e.g.
random weights built on the GPU); without a tokenizer source it has no tokenizer and no EOS ids.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine.sequence import ScheduledSeq
from backends.local_engine.engine.threads import CpuShare
from backends.local_engine.loading.checkpoint import Checkpoint
from backends.local_engine.loading.loader import build_model
from backends.local_engine.loading.weights import WeightFormat, weight_bytes
from backends.local_engine.model.attention import Layout, build_metadata
from backends.local_engine.model.cpu_decode import CpuDecoder
from backends.local_engine.model.kv_cache import KVCache, kv_bytes_per_token, num_blocks_for_memory


@dataclass
class StepOutput:
    scheduled: ScheduledSeq
    logits: Tensor | None  # [num_logits, vocab] float32, or None for a chunk that does not reach the end


class ModelRunner:
    def __init__(
        self,
        settings: EngineSettings,
        attention_layout: Layout = "auto",
        checkpoint: Checkpoint | None = None,
    ) -> None:
        torch.set_num_threads(settings.num_threads)
        self.num_threads = settings.num_threads
        self.single_thread_max_tokens = settings.single_thread_max_tokens
        self.threads = (
            CpuShare(settings.num_threads, yield_above=settings.threads_yield_above)
            if settings.adaptive_threads
            else None
        )
        self.device = torch.device(settings.device)
        self.block_size = settings.block_size
        self.attention_layout = attention_layout
        if checkpoint is None:
            from backends.local_engine.loading.loader import load_checkpoint  # gguf / safetensors readers

            checkpoint = load_checkpoint(settings.model)
        self.config = checkpoint.config
        self.model_name = checkpoint.name
        self.tokenizer = _tokenizer(checkpoint)
        self.eos_token_ids = self.tokenizer.eos_token_ids if self.tokenizer is not None else ()
        cuda = self.device.type == "cuda"
        if cuda and getattr(self.config, "sliding_window", None) is not None:
            raise ValueError(
                "Gemma 3 (sliding-window attention) runs on the CPU only for now; use device cpu"
            )
        fmt = WeightFormat(settings.dtype, settings.int4_group_size, cuda=cuda, kernels=settings)
        self.model = build_model(checkpoint, fmt, self.device, settings.max_model_len)
        self.weight_bytes = weight_bytes(self.model)
        auto = torch.bfloat16 if not cuda and settings.dtype != "fp32" else fmt.activation_dtype
        kv_dtype = {"auto": auto, "bf16": torch.bfloat16, "fp32": torch.float32}[settings.kv_cache_dtype]
        if cuda and kv_dtype != fmt.activation_dtype:
            raise ValueError("on CUDA the KV cache takes the activations' dtype (kv_cache_dtype auto)")
        self.kv_bytes_per_token = kv_bytes_per_token(self.config, kv_dtype)
        self.num_blocks = num_blocks_for_memory(
            settings.kv_cache_memory_mb, self.block_size, self.kv_bytes_per_token
        )
        self.kv_cache = KVCache(self.config, self.num_blocks + cuda, self.block_size, kv_dtype, self.device)
        self.cuda_steps = None
        cpu_fused = not cuda and settings.cpu_fused_decode
        self.cpu_decoder = CpuDecoder.build(self.model, self.kv_cache, self.block_size) if cpu_fused else None
        if cuda:
            from backends.local_engine.engine.cuda_runner import CudaStepRunner
            from backends.local_engine.model import attention_cuda

            attention_cuda.configure(settings.attention_kernel, settings.attention_max_splits)

            self.cuda_steps = CudaStepRunner(
                self.model, self.kv_cache, self.block_size, settings.max_num_seqs, settings.max_model_len,
                settings.max_num_batched_tokens, settings.mixed_graphs,
            )  # fmt: skip
            if settings.cuda_graphs:
                self.cuda_steps.capture()

    def accepts_device_input(self, num_seqs: int) -> bool:
        """Whether a decode step of `num_seqs` sequences can take its input tokens as a device tensor."""
        return self.cuda_steps is not None and self.cuda_steps.accepts_device_input(num_seqs)

    def execute(self, batch: list[ScheduledSeq], input_tokens: Tensor | None = None) -> list[StepOutput]:
        if self.cuda_steps is not None:
            for item in batch:
                self._check_blocks(item, item.seq.num_computed_tokens + item.num_new_tokens)
            return self._split(batch, self.cuda_steps.run(batch, input_tokens))
        if input_tokens is not None:
            raise ValueError("device input tokens need the CUDA step runner")
        input_ids: list[int] = []
        positions: list[int] = []
        spans: list[tuple[list[int], int, int]] = []
        logit_rows: list[int] = []
        for item in batch:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_new_tokens
            self._check_blocks(item, end)
            if end == len(seq.token_ids) or item.prompt_logits:
                logit_rows.extend(
                    range(
                        len(input_ids) + item.num_new_tokens - item.num_logits,
                        len(input_ids) + item.num_new_tokens,
                    )
                )
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            spans.append((seq.block_table, start, item.num_new_tokens))
        self._set_threads(len(input_ids))
        if self.cpu_decoder is not None:
            hidden = self.cpu_decoder.forward(input_ids, positions, spans)
            return self._split(batch, self._logits(hidden, logit_rows, len(input_ids)))
        meta = build_metadata(
            spans,
            self.block_size,
            self.device,
            self.attention_layout,
            self.config.num_heads // self.config.num_kv_heads,
        )
        hidden = self.model(self._tensor(input_ids), self._tensor(positions), meta, self.kv_cache)
        return self._split(batch, self._logits(hidden, logit_rows, len(input_ids)))

    def _logits(self, hidden: Tensor, logit_rows: list[int], tokens: int) -> Tensor | None:
        if not logit_rows:
            return None
        self._set_threads(None)  # the output layer is large enough for all threads at any row count
        rows = hidden if len(logit_rows) == hidden.shape[0] else hidden[self._tensor(logit_rows)]
        logits = self.model.logits(rows)
        self._set_threads(tokens)  # the sampler's small ops: as few threads as the step's
        return logits

    def _set_threads(self, tokens: int | None) -> None:
        """Threads for a step of `tokens` tokens (None: all of them): the cores other processes leave free
        (adaptive, whatever the size), or with the fixed rule one thread for steps of few tokens."""
        if self.threads is not None:
            threads = self.threads.allowed()
        else:
            few = tokens is not None and tokens <= self.single_thread_max_tokens
            threads = 1 if few else self.num_threads
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)

    def _tensor(self, values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _check_blocks(self, item: ScheduledSeq, end: int) -> None:
        if item.num_new_tokens < 1 or end > len(item.seq.token_ids):
            raise ValueError(f"sequence {item.seq.seq_id}: bad chunk of {item.num_new_tokens} tokens")
        if len(item.seq.block_table) * self.block_size < end:
            raise ValueError(f"sequence {item.seq.seq_id}: block table too short for {end} tokens")
        if not 1 <= item.num_logits <= item.num_new_tokens:
            raise ValueError(f"sequence {item.seq.seq_id}: num_logits must be in 1..num_new_tokens")

    def _split(self, batch: list[ScheduledSeq], logits: Tensor | None) -> list[StepOutput]:
        outputs, row = [], 0
        for item in batch:
            reaches_end = item.seq.num_computed_tokens + item.num_new_tokens == len(item.seq.token_ids)
            if (reaches_end or item.prompt_logits) and logits is not None:
                outputs.append(StepOutput(item, logits[row : row + item.num_logits]))
                row += item.num_logits
            else:
                outputs.append(StepOutput(item, None))
        return outputs


def _tokenizer(checkpoint: Checkpoint):  # -> tokenizer.Tokenizer | None
    source = checkpoint.tokenizer
    if source.tokenizer_json is None and not source.gguf_fields:
        return None  # an in-memory checkpoint without a tokenizer (benchmarks on random weights)
    from backends.local_engine.loading.tokenizer import load_tokenizer

    return load_tokenizer(source)
