"""StitchCUDA: a PyTorch reference program in, a verified, faster GPU program out."""

__version__ = "0.1.0"
