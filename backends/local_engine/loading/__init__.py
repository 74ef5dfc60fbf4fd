"""Model locations to checkpoints (GGUF, HF folders), checkpoints to models, tokenizers and chat templates."""
