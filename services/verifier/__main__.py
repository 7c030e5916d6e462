"""Entry point: `python -m stitchcuda.verifier verify REFERENCE.py CANDIDATE [--device ...] [--json]`."""

from __future__ import annotations

import sys

from stitchcuda.verifier.cli import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["verify"]:
        argv = argv[1:]
    raise SystemExit(main(argv))
