"""Which KernelBench problems' strict CUDA programs run their pointwise tail inside the own GEMM's or
convolution's store (variant epilogue=fused), and which still launch a GEMM/convolution of their own (its
output read by a reduction, norm or pool). No GPU needed.

    python benchmarks/epilogue_coverage.py ../shared/kernelbench/level2
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PLAIN = re.compile(r"\bstitch_(conv|linear|bgemm|mm|matmul|bmm|addmm|einsum_gemm)\(")


def main() -> None:
    from stitchcuda.coder.synth.ir import Unsupported
    from stitchcuda.coder.synth.synthesizer import Synthesizer
    from stitchcuda.coder.synth.variants import Variant
    from stitchcuda.shared.policy import STRICT, KernelPolicy

    folder = Path(sys.argv[1])
    synth = Synthesizer(in_process=True)
    problems = fused_any = fused_all = 0
    for path in sorted(folder.glob("*.py")):
        try:
            synthesis = synth.synthesize(
                path.read_text(), None, variant=Variant(), device="cuda", policy=KernelPolicy(STRICT)
            )
        except Unsupported as exc:
            print(f"{path.name}: no program ({exc})")
            continue
        host = synthesis.files["forward.cpp"]
        forward = host[host.rindex(" forward(") :]
        fused = len(re.findall(r"_epilogue_launch\(", forward))
        plain = len(PLAIN.findall(forward))
        problems += 1
        fused_any += fused > 0
        fused_all += fused > 0 and plain == 0
        print(f"{path.name}: {fused} fused, {plain} launched on their own")
    print(f"{problems} programs: {fused_any} with a fused epilogue, {fused_all} with every GEMM/conv fused")


if __name__ == "__main__":
    main()
