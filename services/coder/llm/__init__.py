"""The LLM Coder: prompts, the OpenAI-compatible client and its templates."""
