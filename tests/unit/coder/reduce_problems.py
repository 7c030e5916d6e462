"""Reduction problems in KernelBench format shared by the reduction tests (CPU and GPU): every reduction
kind along the innermost, outermost and middle dims, over several dims, and over everything. The product
reads signs (exact in fp32): a product of 10^5 rounded factors drifts past the tolerance in any precision."""

from __future__ import annotations

KINDS = (
    "torch.sum(x, {d}), torch.mean(x, {d}), torch.amax(x, {d}), torch.min(x, {d})[0], "
    "torch.argmax(x, {d}), torch.argmin(x, {d}), torch.prod(torch.sign(x), {d}), "
    "torch.norm(x, dim={d}), x / torch.sum(torch.abs(x), {d}, keepdim=True), torch.softmax(x, {d}), "
    "torch.log_softmax(x, {d}), torch.logsumexp(x, {d}), torch.var(x, dim={d})"
)


def problem(forward: str, inputs: str) -> str:
    return (
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        f"    def forward(self, x):\n        return {forward}\n\n"
        f"def get_inputs():\n    return {inputs}\n\n"
        "def get_init_inputs():\n    return []\n"
    )


def layouts(inner: str, middle: str, outer: str, several: str, total: str) -> dict[str, str]:
    """One problem per layout; the arguments are the input shapes, as Python tuples."""
    return {
        "inner": problem("(" + KINDS.format(d=-1) + ")", f"[torch.randn{inner}]"),
        "middle": problem("(" + KINDS.format(d=1) + ")", f"[torch.randn{middle}]"),
        "outer": problem("(" + KINDS.format(d=0) + ")", f"[torch.randn{outer}]"),
        # Two reduced dims (two strided segments), an RMSNorm and a softmax over a middle dim.
        "several": problem(
            "(torch.mean(x, (0, 2)), torch.sum(x, (0, 2), keepdim=True), torch.amax(x, (0, 2)), "
            "x / torch.sqrt(torch.mean(x ** 2, 1, keepdim=True) + 1e-5), torch.softmax(x, 1))",
            f"[torch.randn{several}]",
        ),
        # Over everything: a Frobenius norm and its division, a global softmax, a sum and an argmax.
        "total": problem(
            "(x / torch.norm(x, p='fro'), torch.softmax(x.view(-1), 0), torch.sum(x), torch.argmax(x))",
            f"[torch.randn{total}]",
        ),
    }


# Odd sizes everywhere (no multiple of 4 in the contiguous dim): the scalar paths and the tile edges.
SMALL = layouts("(6, 5, 1001)", "(5, 37, 13)", "(37, 6, 7)", "(3, 9, 5, 7)", "(3, 333, 17)")


# Pooling windows (max with dilation and padding plus an epilogue, 3-D and 1-D average, adaptive average).
POOLING = (
    "import torch\nimport torch.nn as nn\n\n"
    "class Model(nn.Module):\n"
    "    def __init__(self):\n        super().__init__()\n"
    "        self.mp = nn.MaxPool2d(3, stride=2, padding=1, dilation=2)\n"
    "        self.ap = nn.AvgPool3d(3, stride=2, padding=1)\n"
    "        self.a1 = nn.AvgPool1d(4, stride=2, padding=1)\n"
    "        self.ad = nn.AdaptiveAvgPool2d((5, 7))\n\n"
    "    def forward(self, x, y, z):\n"
    "        return torch.relu(self.mp(x)) * 2, self.ap(y), self.a1(z), self.ad(x)\n\n"
    "def get_inputs():\n"
    "    return [torch.randn(4, 3, 33, 35), torch.randn(2, 3, 9, 10, 11), torch.randn(3, 5, 101)]\n\n"
    "def get_init_inputs():\n    return []\n"
)
