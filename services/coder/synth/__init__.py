"""The offline synthesizer: traces a reference and writes its CUDA/C++ program."""
