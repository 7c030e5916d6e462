"""nvcc's time on the kernels.cu of the built-in Coder's strict CUDA programs (sm_90, the Verifier's flags),
per problem, and the kernels it instantiates. No GPU needed: this is the build share of a cold verification.

    python benchmarks/kernels_build_time.py OUT PROBLEM.py... [--tree DIR] [--repeat N]

`--tree DIR`: synthesize with the `services/` of another checkout (a `git worktree` of an older commit) to
compare side by side on the same machine.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

NVCC_FLAGS = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-gencode=arch=compute_90,code=sm_90"]


def synthesize(problems: list[Path], out: Path) -> list[Path]:
    from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
    from stitchcuda.coder.synth.variants import Variant
    from stitchcuda.shared.candidate import write_dir
    from stitchcuda.shared.policy import STRICT, KernelPolicy

    synth = Synthesizer(in_process=True)
    folders = []
    for problem in problems:
        synthesis = synth.synthesize(
            problem.read_text(), None, variant=Variant(), device="cuda", policy=KernelPolicy(STRICT)
        )
        folder = out / problem.stem
        write_dir(to_candidate(synthesis), folder)
        folders.append(folder)
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("problems", type=Path, nargs="+")
    parser.add_argument("--tree", type=Path, help="a checkout whose services/ synthesizes the programs")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    if args.tree is not None:
        import stitchcuda

        stitchcuda.__path__[:] = [str(args.tree.resolve() / "services")]
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        sys.exit("nvcc is not on PATH")
    args.out.mkdir(parents=True, exist_ok=True)
    print("| problem | nvcc kernels.cu (s, each run) | kernels |")
    print("|---|---|---|")
    for folder in synthesize(args.problems, args.out):
        obj = folder / "kernels.o"
        times, kernels = [], 0
        for _ in range(args.repeat):
            started = time.monotonic()
            cmd = [nvcc, "-c", str(folder / "kernels.cu"), "-o", str(obj), *NVCC_FLAGS, "-Xcompiler", "-fPIC"]
            done = subprocess.run([*cmd, "-Xptxas", "-v"], check=True, capture_output=True, text=True)
            times.append(time.monotonic() - started)
            kernels = done.stderr.count("Compiling entry function")  # ptxas: one line per kernel
        print(f"| {folder.name} | {', '.join(f'{t:.1f}' for t in times)} | {kernels} |", flush=True)


if __name__ == "__main__":
    main()
