"""Coder: writes the CUDA/C++ program for a plan (LLM backend or the built-in synthesizer)."""
