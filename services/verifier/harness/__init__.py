"""Scripts that run in sandboxed subprocesses: the standard library and torch only, never stitchcuda."""
