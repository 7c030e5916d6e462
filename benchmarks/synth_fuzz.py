"""Random level-2-style problems through the built-in Coder: which ones it cannot write, which CPU programs
disagree with PyTorch, and which CUDA programs nvcc refuses.

    python benchmarks/synth_fuzz.py [--count 30] [--seed 0] [--cuda] [--keep DIR]

Each problem is a KernelBench-format reference written here from a small grammar: an optional head (Linear,
Conv2d, ConvTranspose2d, Conv3d) and a tail of two to five operations of the kinds levels 1-2 combine
(activations, scalings, broadcast parameters, reductions and logsumexp over a dim, softmax, GroupNorm,
InstanceNorm, BatchNorm in training mode, LayerNorm, pooling, residuals). Per problem: the strict CPU program
is built and compared with float64 PyTorch on fresh inputs (the Verifier's rule: relative L2 within 1e-5 or
ten times the float32 reference's own error); with --cuda the strict CUDA program's kernels.cu goes through
nvcc. Tunes mechanisms, not problems: nothing here is a KernelBench file. A line per problem, then a summary.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from stitchcuda.coder.synth.ir import Unsupported
from stitchcuda.coder.synth.synthesizer import Synthesizer
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.policy import STRICT, KernelPolicy


@dataclass
class Problem:
    """A reference being written: its module lines, forward lines and the tensor's current shape."""

    shape: list[int]
    init: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)

    def layer(self, text: str) -> str:
        name = f"m{len(self.init)}"
        self.init.append(f"self.{name} = {text}")
        return f"self.{name}"

    def step(self, text: str, name: str) -> None:
        self.body.append(f"x = {text}")
        self.names.append(name)

    def source(self, inputs: list[int]) -> str:
        init = "\n        ".join(self.init) or "pass"
        body = "\n        ".join(self.body)
        return f"""import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        {init}

    def forward(self, x):
        {body}
        return x


def get_inputs():
    return [torch.randn({", ".join(map(str, inputs))})]


def get_init_inputs():
    return []
"""


POINTWISE = [
    ("relu", "torch.relu(x)"),
    ("gelu", "F.gelu(x)"),
    ("tanh", "torch.tanh(x)"),
    ("sigmoid", "torch.sigmoid(x)"),
    ("mish", "F.mish(x)"),
    ("hardswish", "F.hardswish(x)"),
    ("leaky_relu", "F.leaky_relu(x, 0.1)"),
    ("clamp", "torch.clamp(x, min=-0.4, max=0.6)"),
    ("scale", "x * 0.7"),
    ("divide", "x / 1.5"),
    ("swish", "x * torch.sigmoid(x)"),
    ("hardtanh", "F.hardtanh(x, -0.5, 0.5)"),
    ("softplus", "F.softplus(x)"),
    ("elu", "F.elu(x)"),
    ("hardsigmoid", "F.hardsigmoid(x)"),
    ("selu", "torch.selu(x)"),
    ("softsign", "F.softsign(x)"),
    ("gelu_tanh", "F.gelu(x, approximate='tanh')"),
    ("where", "torch.where(x > 0, x, x * 0.2)"),
    ("pow", "x.pow(2) / torch.sqrt(x.abs() + 1e-3)"),
    ("exp_log", "torch.log(torch.exp(x * 0.5) + 1.0)"),
]


def tail_op(rng: random.Random, p: Problem) -> None:
    rank, c = len(p.shape), p.shape[1]
    choices = ["pointwise"] * 5 + ["param", "residual", "reduce", "lse", "softmax", "center"]
    if rank == 4 and c > 1:
        choices += ["groupnorm", "batchnorm", "pool", "gap"]
        # InstanceNorm in training mode needs more than one element per plane (PyTorch raises otherwise).
        choices += ["instancenorm"] if p.shape[2] * p.shape[3] > 1 else []
    if rank == 2 and c > 1:
        choices += ["layernorm", "batchnorm1d"]
    choices += ["max_values", "normalize", "cumsum", "norm", "cat"]
    if c % 2 == 0:
        choices.append("glu")
    if rank == 4:
        choices.append("flatten_linear")
    if rank == 2:
        choices.append("matmul_param")
    kind = rng.choice(choices)
    if kind == "pointwise":
        name, text = rng.choice(POINTWISE)
        p.step(text, name)
    elif kind == "param":
        shape = [c] + [1] * (rank - 2)
        param = p.layer(f"nn.Parameter(torch.randn({tuple(shape)!r}) * 0.1)")
        p.step(f"x {rng.choice(['+', '-', '*'])} {param}", "param")
    elif kind == "residual":
        p.body.append("r = x.clone().detach()" if rng.random() < 0.2 else "r = x")
        name, text = rng.choice(POINTWISE)
        p.step(f"{text} + r", f"{name}+residual")
    elif kind == "reduce":
        fn = rng.choice(["sum", "mean", "amax", "amin"])
        p.step(f"torch.{fn}(x, dim=1, keepdim=True)", f"{fn}(dim=1)")
        p.shape[1] = 1
    elif kind == "lse":
        p.step("torch.logsumexp(x, dim=1, keepdim=True)", "logsumexp(dim=1)")
        p.shape[1] = 1
    elif kind == "softmax":
        dim = rng.choice([1, -1])
        p.step(f"torch.{rng.choice(['softmax', 'log_softmax'])}(x, dim={dim})", f"softmax({dim})")
    elif kind == "max_values":
        fn = rng.choice(["max", "min"])
        p.step(f"torch.{fn}(x, dim=1, keepdim=True)[0]", f"{fn}(dim=1).values")
        p.shape[1] = 1
    elif kind == "normalize":
        p.step("F.normalize(x, dim=1)", "normalize(dim=1)")
    elif kind == "cumsum":
        p.step(f"torch.cumsum(x, dim={rank - 1})", "cumsum")
    elif kind == "norm":
        p.step("x / (torch.norm(x, dim=1, keepdim=True) + 1e-4)", "x/norm(dim=1)")
    elif kind == "cat":
        p.step("torch.cat([x, x * 0.5], dim=1)", "cat(dim=1)")
        p.shape[1] *= 2
    elif kind == "glu":
        p.body.append("a, b = x.chunk(2, dim=1)")
        p.step("a * torch.sigmoid(b)", "chunk+glu")
        p.shape[1] //= 2
    elif kind == "flatten_linear":
        features = c * p.shape[2] * p.shape[3]
        if features > 4096:
            p.step("torch.mean(x, dim=(2, 3))", "mean(dim=(2,3))")
            features = c
        else:
            p.step("x.flatten(1)", "flatten")
        n_out = rng.choice([16, 24])
        p.step(f"{p.layer(f'nn.Linear({features}, {n_out})')}(x)", "linear")
        p.shape = [p.shape[0], n_out]
    elif kind == "matmul_param":
        n_out = rng.choice([8, 20])
        weight = p.layer(f"nn.Parameter(torch.randn({c}, {n_out}) * 0.2)")
        p.step(f"torch.matmul(x, {weight})", "matmul(param)")
        p.shape[1] = n_out
    elif kind == "center":
        p.step("x - x.mean(dim=1, keepdim=True)", "center")
    elif kind == "groupnorm":
        groups = next(g for g in (4, 2, 1) if c % g == 0)
        p.step(f"{p.layer(f'nn.GroupNorm({groups}, {c})')}(x)", "groupnorm")
    elif kind == "instancenorm":
        p.step(f"{p.layer(f'nn.InstanceNorm2d({c})')}(x)", "instancenorm")
    elif kind == "batchnorm":
        p.step(f"{p.layer(f'nn.BatchNorm2d({c})')}(x)", "batchnorm(train)")
    elif kind == "batchnorm1d":
        p.step(f"{p.layer(f'nn.BatchNorm1d({c})')}(x)", "batchnorm1d(train)")
    elif kind == "layernorm":
        p.step(f"{p.layer(f'nn.LayerNorm({c})')}(x)", "layernorm")
    elif kind == "pool" and p.shape[2] >= 4:
        fn = rng.choice(["max_pool2d", "avg_pool2d"])
        p.step(f"F.{fn}(x, 2)", fn)
        p.shape[2:] = [p.shape[2] // 2, p.shape[3] // 2]
    elif kind == "gap":
        p.step("torch.mean(x, dim=(2, 3), keepdim=True)", "global_avg_pool")
        p.shape[2:] = [1, 1]
    else:
        p.step("torch.relu(x)", "relu")


def generate(rng: random.Random) -> tuple[str, list[str]]:
    head = rng.choice(["linear", "conv2d", "conv_transpose2d", "conv3d", "none4d", "none2d"])
    batch = rng.choice([2, 3, 4])
    if head == "linear":
        n_in, n_out = rng.choice([24, 40, 64]), rng.choice([16, 48, 72])
        p = Problem([batch, n_out])
        p.step(f"{p.layer(f'nn.Linear({n_in}, {n_out})')}(x)", "linear")
        inputs = [batch, n_in]
    elif head in ("conv2d", "conv_transpose2d"):
        cin, cout, size = rng.choice([3, 8, 16]), rng.choice([8, 16, 32]), rng.choice([8, 11, 16])
        k, stride = rng.choice([1, 3]), rng.choice([1, 2])
        if head == "conv2d":
            layer = f"nn.Conv2d({cin}, {cout}, {k}, stride={stride}, padding={k // 2})"
            out = (size + 2 * (k // 2) - k) // stride + 1
        else:
            layer = f"nn.ConvTranspose2d({cin}, {cout}, {k}, stride={stride}, padding={k // 2})"
            out = (size - 1) * stride - 2 * (k // 2) + k
        p = Problem([batch, cout, out, out])
        p.step(f"{p.layer(layer)}(x)", head)
        inputs = [batch, cin, size, size]
    elif head == "conv3d":
        cin, cout, size = rng.choice([3, 4]), rng.choice([8, 16]), rng.choice([6, 8])
        p = Problem([batch, cout, size - 2, size - 2, size - 2])
        p.step(f"{p.layer(f'nn.Conv3d({cin}, {cout}, 3)')}(x)", head)
        inputs = [batch, cin, size, size, size]
        p.step("torch.mean(x, dim=2)", "mean(dim=2)")
        p.shape = [batch, cout, size - 2, size - 2]
    elif head == "none4d":
        c, size = rng.choice([4, 8, 16]), rng.choice([6, 9, 16])
        p = Problem([batch, c, size, size])
        inputs = list(p.shape)
    else:
        p = Problem([batch * 8, rng.choice([17, 64, 100])])
        inputs = list(p.shape)
    for _ in range(rng.randint(2, 5)):
        tail_op(rng, p)
    if not p.body:
        p.step("torch.relu(x)", "relu")
    return p.source(inputs), p.names


def runs(source: str) -> bool:
    """Whether PyTorch itself runs the generated reference (a grammar slip is regenerated, not reported)."""
    ns: dict[str, Any] = {"__name__": "reference"}
    try:
        exec(compile(source, "reference.py", "exec"), ns)
        with torch.no_grad():
            ns["Model"](*ns["get_init_inputs"]())(*ns["get_inputs"]())
    except Exception:  # any failure of the reference itself
        return False
    return True


def check_cpu(synth: Synthesizer, source: str, root: Path) -> str:
    """'' when the CPU program matches float64 PyTorch on two fresh input sets, else why not."""
    from torch.utils.cpp_extension import load

    synthesis = synth.synthesize(source, None, variant=Variant(), device="cpu", policy=KernelPolicy(STRICT))
    name = synthesis.build.extension_name
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    for path, content in synthesis.files.items():
        (folder / path).write_text(content)
    try:
        sys.modules[name] = load(
            name=name,
            sources=[str(folder / s) for s in synthesis.build.sources],
            extra_cflags=list(synthesis.build.cflags),
            extra_ldflags=list(synthesis.build.ldflags),
            build_directory=str(folder),
        )
    except Exception as exc:  # a build failure is a finding
        return "cpu build failed: " + str(exc).strip().splitlines()[-1][:200]
    ns: dict[str, Any] = {"__name__": "reference"}
    exec(compile(source, "reference.py", "exec"), ns)
    mn: dict[str, Any] = {"__name__": "model_new"}
    exec(compile(synthesis.files["model_new.py"], "model_new.py", "exec"), mn)
    torch.manual_seed(0)
    ref = ns["Model"]()
    torch.manual_seed(0)
    new = mn["ModelNew"]()
    torch.manual_seed(0)
    ref64 = ns["Model"]().double()
    for seed in (1, 2):
        torch.manual_seed(seed)
        xs = ns["get_inputs"]()
        with torch.no_grad():
            want = ref64(*[x.double() for x in xs])
            own = float((ref(*xs).double() - want).norm() / want.norm().clamp_min(1e-30))
            got = new(*xs)
        if got.shape != want.shape:
            return f"shape {tuple(got.shape)} != {tuple(want.shape)}"
        rel = float((got.double() - want).norm() / want.norm().clamp_min(1e-30))
        if not rel < max(1e-5, 10 * own):
            return f"mismatch: relative L2 {rel:.2e} (float32 reference's own {own:.2e})"
    return ""


def check_cuda(synth: Synthesizer, source: str, root: Path) -> str:
    """'' when the strict CUDA program's kernels.cu compiles with nvcc, else the first error."""
    synthesis = synth.synthesize(source, None, variant=Variant(), device="cuda", policy=KernelPolicy(STRICT))
    folder = root / (synthesis.build.extension_name + "_cuda")
    folder.mkdir(parents=True, exist_ok=True)
    for path, content in synthesis.files.items():
        (folder / path).write_text(content)
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    flags = ["-O1", "-std=c++17", "--expt-relaxed-constexpr", "-gencode=arch=compute_90,code=sm_90"]
    command = [nvcc, "-c", str(folder / "kernels.cu"), "-o", str(folder / "kernels.o"), *flags]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "error" in line]
        return "nvcc: " + (errors[0] if errors else done.stderr[-200:])[:200]
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cuda", action="store_true", help="also compile the strict CUDA program's kernels")
    parser.add_argument("--keep", type=Path, help="write every failing reference here")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    synth = Synthesizer(in_process=True)  # references written here: trusted
    counts = {"ok": 0, "unsupported": 0, "failed": 0}
    with tempfile.TemporaryDirectory(prefix="stitch-fuzz-") as tmp:
        for i in range(args.count):
            source, names = generate(rng)
            while not runs(source):
                source, names = generate(rng)
            started = time.monotonic()
            try:
                why = check_cpu(synth, source, Path(tmp))
                if not why and args.cuda:
                    why = check_cuda(synth, source, Path(tmp))
                status = "failed" if why else "ok"
            except Unsupported as exc:
                why, status = f"unsupported: {exc}", "unsupported"
            except Exception as exc:  # a crash of the Coder is a finding too
                why, status = f"{type(exc).__name__}: {str(exc)[:200]}", "failed"
            counts[status] += 1
            took = time.monotonic() - started
            print(f"{i:3d} {status:11s} {took:5.1f}s  {' > '.join(names)}  {why}", flush=True)
            if status != "ok" and args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                (args.keep / f"fuzz_{args.seed}_{i}.py").write_text(source)
    ok, unsupported, failed = counts["ok"], counts["unsupported"], counts["failed"]
    print(f"{args.count} problems: {ok} ok, {unsupported} unsupported, {failed} failed")


if __name__ == "__main__":
    main()
