"""Helpers for compiling LLM inference with a static KV cache (PFN's llm_infer.py): the cache as
one tensor between calls (`kv_cache`), the attention mask prepared on the host (`attention_mask`)."""
