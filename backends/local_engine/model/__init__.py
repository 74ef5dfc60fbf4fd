"""Model code: Llama family (llama.py), Gemma 3 (gemma3/), attention, KV cache, RoPE."""
