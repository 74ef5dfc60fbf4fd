"""Gemma 3 (text) in the local engine: GGUF loading, the SentencePiece tokenizer, the model, sliding windows."""
