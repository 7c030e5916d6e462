"""Build time of the built-in Coder's CPU programs (what CI and CPU verifiers pay on every cold verification).

    python benchmarks/build_time.py OUTDIR PROBLEM [PROBLEM ...]   (suite problem stems)

Emits each problem's CPU program, builds it with torch.utils.cpp_extension.load (MAX_JOBS from the
environment) and prints one JSON line: the package that wrote the programs and the seconds per build. Run it
with PYTHONPATH pointing at another checkout's link tree (.ci/linktree DIR) to time that version side by side.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import stitchcuda
from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.candidate import write_dir

PROBLEMS = Path(__file__).resolve().parent / "problems"


def main() -> None:
    from torch.utils import cpp_extension

    out, names = Path(sys.argv[1]), sys.argv[2:]
    synth = Synthesizer(in_process=True)  # the suite's references are trusted
    seconds: dict[str, float] = {}
    for name in names:
        source = (PROBLEMS / f"{name}.py").read_text()
        cand = to_candidate(synth.synthesize(source, None, device="cpu", variant=Variant()))
        folder = out / name
        shutil.rmtree(folder, ignore_errors=True)
        write_dir(cand, folder)
        started = time.monotonic()
        cpp_extension.load(
            name=cand.build.extension_name,
            sources=[str(folder / s) for s in cand.build.sources],
            extra_cflags=list(cand.build.cflags),
            extra_ldflags=list(cand.build.ldflags),
            build_directory=str(folder),
            verbose=False,
        )
        seconds[name] = round(time.monotonic() - started, 1)
    print(json.dumps({"package": str(Path(stitchcuda.__file__).parent), "build_s": seconds}))


if __name__ == "__main__":
    main()
