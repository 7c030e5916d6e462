"""Retrieval of CUDA examples and skills for the Coder's prompts."""
