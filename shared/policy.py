"""The kernel policy of a job: which vendor-library calls a candidate may make. Read by Coder and Verifier.

`strict` (the default) is ../shared/VERIFIER_THREATS.md #1 and #6 as written: the bottleneck operators
(GEMM, convolution) must be the candidate's own kernels. A CUTLASS template instantiated in the
candidate's sources is its own kernel; a call into cuBLAS/cuDNN (directly or through an ATen op that
dispatches there) is not.

`library` is an opt-in per job: GEMM and convolution may go to cuBLAS/cuDNN through the calls listed
below, provided the candidate's manifest declares the library (BuildManifest.libraries). The
Verifier then reports the library's share of the time and applies the custom-share rule (D6) to the
time outside it. Nothing else becomes legal: attention, RNN or elementwise ATen ops stay rejected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stitchcuda.shared.errors import InvalidRequest

STRICT = "strict"
LIBRARY = "library"
NAMES = (STRICT, LIBRARY)

# Library family -> the ATen ops that dispatch to it (GEMM -> cuBLAS/MKL, convolution -> cuDNN/oneDNN).
LIBRARY_ATEN_OPS: dict[str, frozenset[str]] = {
    "cublas": frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "mv", "addmv", "einsum"}),
    "cudnn": frozenset(
        {
            "conv1d",
            "conv2d",
            "conv3d",
            "convolution",
            "conv_transpose1d",
            "conv_transpose2d",
            "conv_transpose3d",
        }
    ),
}
# Direct calls into the vendor library, by family.
LIBRARY_CALLS: dict[str, re.Pattern[str]] = {
    "cublas": re.compile(r"^cublas\w*$"),
    "cudnn": re.compile(r"^cudnn\w*$"),
}


@dataclass(frozen=True)
class KernelPolicy:
    """What a job's candidates may call; `libraries` are the families declared legal by the policy."""

    name: str = STRICT

    @property
    def accepts_library(self) -> bool:
        return self.name == LIBRARY

    def families(self) -> frozenset[str]:
        return frozenset(LIBRARY_ATEN_OPS) if self.accepts_library else frozenset()

    def family_of_aten(self, op: str) -> str:
        """The library family an ATen op dispatches to ("" when it is no GEMM/convolution)."""
        return next((f for f, ops in LIBRARY_ATEN_OPS.items() if op in ops), "")

    def family_of_call(self, function: str) -> str:
        return next((f for f, pat in LIBRARY_CALLS.items() if pat.match(function)), "")

    def allows_aten(self, op: str, declared: frozenset[str] | set[str]) -> bool:
        """May a candidate declaring `declared` libraries call ATen op `op` from its C++?"""
        family = self.family_of_aten(op)
        return bool(family) and family in self.families() and family in declared

    def allows_call(self, function: str, declared: frozenset[str] | set[str]) -> bool:
        family = self.family_of_call(function)
        return bool(family) and family in self.families() and family in declared

    def describe(self) -> str:
        if self.accepts_library:
            return "library (declared cuBLAS/cuDNN calls for GEMM and convolution accepted)"
        return "strict (GEMM and convolution must be the candidate's own kernels)"


def resolve(name: str | None) -> KernelPolicy:
    """The policy named by a request, CLI flag or job option ("" = the strict default)."""
    text = (name or "").strip().lower()
    if not text:
        return KernelPolicy(STRICT)
    if text not in NAMES:
        raise InvalidRequest(f"unknown kernel policy {name!r}: choose one of {', '.join(NAMES)}")
    return KernelPolicy(text)
