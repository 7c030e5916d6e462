"""`python -m stitchcuda.gateway`: the gateway process (gRPC and HTTP), configured by the environment."""

from __future__ import annotations

import sys

from stitchcuda.gateway.server import main

if __name__ == "__main__":
    sys.exit(main())
