"""Policies: HF transformers, in-process vLLM, OpenAI-compatible HTTP, scripted. Loaded lazily."""
