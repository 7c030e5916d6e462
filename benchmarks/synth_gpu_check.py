"""The built-in Coder's CUDA program for each problem, built and run beside its reference at full size.

    python benchmarks/synth_gpu_check.py PROBLEM.py [PROBLEM.py ...] [--policy library]

A debugging aid next to the Verifier (no sandbox, one input set, the same process): per problem it prints
the build time, the largest absolute error against the float32 reference and where, and, on the first two
samples of the batch, both programs' error against a float64 reference (the float32 reference's own error
is the scale a tolerance has to allow). Needs a CUDA device; the references are trusted files.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.cpp_extension import load

from stitchcuda.coder.synth.synthesizer import Synthesizer
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared import cutlass
from stitchcuda.shared.policy import LIBRARY, STRICT, KernelPolicy


def to_device(values: list[Any], dtype: torch.dtype | None = None) -> list[Any]:
    out = []
    for v in values:
        if torch.is_tensor(v):
            v = v.cuda()
            out.append(v.to(dtype) if dtype is not None and v.is_floating_point() else v)
        else:
            out.append(v)
    return out


def check(path: Path, policy: str, root: Path) -> None:
    ref = path.read_text()
    synthesis = Synthesizer(in_process=True).synthesize(
        ref, None, variant=Variant(), device="cuda", policy=KernelPolicy(policy)
    )
    build = root / synthesis.build.extension_name
    build.mkdir(parents=True, exist_ok=True)
    for name, content in synthesis.files.items():
        (build / name).write_text(content)
    started = time.monotonic()
    ext = load(
        name=synthesis.build.extension_name,
        sources=[str(build / s) for s in synthesis.build.sources],
        extra_cflags=list(synthesis.build.cflags),
        extra_cuda_cflags=[*synthesis.build.cuda_cflags, *cutlass.build_flags(synthesis.files.values())],
        extra_ldflags=list(synthesis.build.ldflags),
        build_directory=str(build),
    )
    print(f"{path.stem}: built in {time.monotonic() - started:.1f} s", flush=True)
    sys.modules[synthesis.build.extension_name] = ext
    ns: dict[str, Any] = {"__name__": "reference"}
    exec(compile(ref, str(path), "exec"), ns)
    mn: dict[str, Any] = {"__name__": "model_new"}
    exec(compile(synthesis.files["model_new.py"], "model_new.py", "exec"), mn)
    init = ns["get_init_inputs"]()
    torch.manual_seed(0)
    model = ns["Model"](*init).cuda()
    torch.manual_seed(0)
    new = mn["ModelNew"](*init).cuda()
    torch.manual_seed(1)
    inputs = to_device(ns["get_inputs"]())
    with torch.no_grad():
        expected, got = model(*inputs), new(*inputs)
        err = (expected - got).abs()
        worst = int(err.argmax())
        print(
            f"  vs float32 reference: max abs err {err.max().item():.3g} at {worst} "
            f"(reference {expected.flatten()[worst].item():.6g}, ours {got.flatten()[worst].item():.6g}), "
            f"mean {err.mean().item():.3g}, {int((err > 1e-3).sum())} of {err.numel()} above 1e-3",
            flush=True,
        )
        head = [x[:2] if torch.is_tensor(x) and x.dim() > 0 else x for x in inputs]
        truth = model.double()(*to_device(head, torch.float64))
        model.float()
        ours = new(*head).double()
        print(
            f"  vs float64 on 2 samples: ours {(ours - truth).abs().max().item():.3g}, "
            f"float32 reference {(expected[:2].double() - truth).abs().max().item():.3g}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("problems", nargs="+", type=Path)
    parser.add_argument("--policy", choices=[STRICT, LIBRARY], default=LIBRARY)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stitch-synth-gpu-") as tmp:
        for path in args.problems:
            check(path, args.policy, Path(tmp))


if __name__ == "__main__":
    main()
