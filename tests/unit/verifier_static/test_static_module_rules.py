"""D11 whole-file rules: tampering, I/O, threads, subclasses, streams, precision, redefinitions, policy."""

import pytest
from conftest import module

from stitchcuda.api.v1 import verify_pb2

OK = "return ext.op(x)"


@pytest.mark.parametrize(
    "extra, rule",
    [
        ("torch.cuda.synchronize = lambda device=None: None", "D11.monkeypatch"),
        ("import time\ntime.perf_counter = lambda: 0.0", "D11.monkeypatch"),
        ("import time as _t\nsetattr(_t, 'perf_counter', lambda: 0.0)", "D11.monkeypatch"),
        ("E = torch.cuda.Event\nE.elapsed_time = lambda s, e: 0.0", "D11.monkeypatch"),
        ("import builtins\nbuiltins.print = lambda *a: None", "D11.monkeypatch"),
        ("torch.allclose = lambda *a, **k: True", "D11.monkeypatch"),
        ("object.__setattr__(torch.cuda, 'synchronize', None)", "D11.monkeypatch"),
        ("torch.backends.cuda.matmul.allow_tf32 = True", "D11.global-state"),
        ("torch.backends.cudnn.benchmark = True", "D11.global-state"),
        ("torch.set_float32_matmul_precision('high')", "D11.global-state"),
        ("torch.set_num_threads(1)", "D11.global-state"),
        ("torch.use_deterministic_algorithms(False)", "D11.global-state"),
        ("import sys\nf = sys._getframe(1)", "D11.introspection"),
        ("import inspect", "D11.introspection"),
        ("import gc\nobjs = gc.get_objects()", "D11.introspection"),
        ("import sys\nm = sys.modules['__main__']", "D11.introspection"),
        ("import __main__", "D11.introspection"),
        ("import ctypes", "D11.introspection"),
        ("g = globals()", "D11.introspection"),
        ("exec('x = 1')", "D11.dynamic-code"),
        ("import importlib\nm = importlib.import_module('torch')", "D11.dynamic-code"),
        ("name = 'mat' + 'mul'\nf = getattr(torch, name)", "D11.dynamic-code"),
        ("data = open('/tmp/ref.pt', 'rb').read()", "D11.io"),
        ("import glob\nfiles = glob.glob('/tmp/*.pt')", "D11.io"),
        ("from pathlib import Path\np = Path('/tmp')", "D11.io"),
        ("ref = torch.load('/tmp/ref.pt')", "D11.io"),
        ("import os\nfiles = os.listdir('/tmp')", "D11.io"),
        ("import urllib.request\nurllib.request.urlopen('http://x')", "D11.network"),
        ("import socket", "D11.network"),
        ("import subprocess\nsubprocess.run(['nvidia-smi'])", "D11.process"),
        ("import os\nos.system('ls')", "D11.process"),
        ("import os\nos._exit(0)", "D11.exit"),
        ("import sys\nsys.exit(0)", "D11.exit"),
        ("import atexit\natexit.register(print)", "D11.exit"),
        ("raise SystemExit(0)", "D11.exit"),
        ("import os\nseed = os.environ.get('SEED')", "D11.environ"),
        ("from os import getenv\nseed = getenv('SEED')", "D11.environ"),
        ("import threading\nthreading.Thread(target=print).start()", "D11.thread"),
        ("from concurrent.futures import ThreadPoolExecutor", "D11.thread"),
        ("import multiprocessing", "D11.thread"),
        ("class Lazy(torch.Tensor):\n    pass", "D11.tensor-subclass"),
        ("class P(nn.Parameter):\n    pass", "D11.tensor-subclass"),
        (
            "def __torch_function__(cls, func, types, args=(), kwargs=None):\n    return func(*args)",
            "D11.tensor-subclass",
        ),
        ("make = torch.Tensor._make_wrapper_subclass", "D11.tensor-subclass"),
        ("from torch.utils._python_dispatch import TorchDispatchMode", "D11.tensor-subclass"),
        ("lib = torch.library.Library('aten', 'IMPL')", "D11.monkeypatch"),
        ("torch.cuda.reset_peak_memory_stats()", "D11.gpu-control"),
        ("import pynvml", "D11.gpu-control"),
        ("ARENA = torch.empty(1 << 30)", "D11.memory"),
        ("free, _ = torch.cuda.mem_get_info()\nARENA = torch.empty(int(free * 0.6) // 4)", "D11.memory"),
        ("from torch.utils.cpp_extension import load_inline", "D11.guarded-build"),
        ("def get_inputs():\n    return [torch.randn(8, 8)]", "D11.redefine"),
        ("def get_init_inputs():\n    return [8, 8]", "D11.redefine"),
        ("M = K = N = 128", "D11.redefine"),
        ("class Model(nn.Module):\n    pass", "D11.redefine"),
        ("ref = Model(512, 256)", "D11.reference"),
        ("from reference import Model", "D11.reference"),
    ],
)
def test_hard_rules_fire(run_scan, extra, rule):
    s = run_scan(module(OK, extra=extra))
    assert rule in s.rejects, s


@pytest.mark.parametrize(
    "extra, rule",
    [
        ("print('hello')", "D11.print"),
        ("import logging\nlog = logging.getLogger(__name__)", "D11.print"),
        ("import time\nt0 = time.perf_counter()", "D11.timing"),
        ("g = torch.cuda.CUDAGraph()", "D11.cuda-graph"),
        ("used = torch.cuda.mem_get_info()", "D11.memory-probe"),
        ("import einops", "D11.import"),
        ("from math import *", "D11.import"),
        ("# out = ext.op(x)  # disabled", "D11.commented-launch"),
    ],
)
def test_soft_rules_warn_without_rejecting(run_scan, extra, rule):
    s = run_scan(module(OK, extra=extra))
    assert rule in s.warnings and s.rejects == set(), s


def test_honest_module_level_code_is_clean(run_scan):
    extra = """
    import math
    from typing import Optional

    BLOCK = 256
    LOG2E = math.log2(math.e)
    flag = torch.backends.cuda.matmul.allow_tf32  # reading is fine


    def _cdiv(a: int, b: int) -> int:
        return (a + b - 1) // b


    if __name__ == "__main__":
        pass
    """
    s = run_scan(module("return ext.op(x, _cdiv(x.numel(), BLOCK))", extra=extra))
    assert s.rejects == set() and s.warnings == set(), s


def test_streams_unjoined_reject_joined_warn(run_scan):
    unjoined = module(
        "out = torch.empty_like(x)\nwith torch.cuda.stream(self.s):\n    ext.op(x, out)\nreturn out",
        "self.s = torch.cuda.Stream()",
    )
    assert "D11.stream-unjoined" in run_scan(unjoined).rejects
    joined = module(
        "out = torch.empty_like(x)\nself.s.wait_stream(torch.cuda.current_stream())\n"
        "with torch.cuda.stream(self.s):\n    ext.op(x, out)\ntorch.cuda.current_stream().wait_stream(self.s)\n"
        "return out",
        "self.s = torch.cuda.Stream()",
    )
    s = run_scan(joined)
    assert s.rejects == set() and "D11.stream" in s.warnings, s


def test_stale_graph_needs_the_pointer_check(run_scan):
    stale = module(
        "if x.data_ptr() != self.ptr:\n    self.sx.copy_(x)\n    self.ptr = x.data_ptr()\n"
        "self.g.replay()\nreturn self.out.clone()",
        "self.g = torch.cuda.CUDAGraph()\nself.ptr = 0\nself.sx = None\nself.out = None",
    )
    s = run_scan(stale)
    assert "D11.identity-key" in s.rejects and "D11.cuda-graph" in s.warnings, s
    honest = module(
        "self.sx.copy_(x)\nself.g.replay()\nreturn self.out.clone()",
        "self.g = torch.cuda.CUDAGraph()\nself.sx = None\nself.out = None",
    )
    s = run_scan(honest)
    assert s.rejects == set(), s


def test_modelnew_bases(run_scan):
    assert (
        "D11.modelnew-base"
        in run_scan("class ModelNew(object):\n    def forward(self, x):\n        return ext.op(x)\n").rejects
    )
    local = """
    class Base(nn.Module):
        pass


    class ModelNew(Base):
        def forward(self, x):
            return ext.op(x)
    """
    assert run_scan(local).rejects == set()
    parent = run_scan("class ModelNew(Model):\n    pass\n")
    assert {"D11.modelnew-base", "D11.reference"} <= parent.rejects, parent


def test_structure_errors(run_scan):
    assert "D11.structure" in run_scan("def forward(x):\n    return x\n").rejects
    assert "D11.structure" in run_scan("class ModelNew(nn.Module:\n", header=False).rejects
    assert "D11.structure" in run_scan("class ModelNew(nn.Module):\n    pass\n").rejects


def test_reference_copy(run_scan):
    s = run_scan(
        module("return torch.relu(self.linear(x))", "self.linear = nn.Linear(in_features, out_features)")
    )
    assert "D11.ref-copy" in s.rejects, s


def test_precision_casts_reject_unless_the_problem_is_reduced_precision(run_scan):
    for body in ("return ext.op(x.half())", "return ext.op(x.to(torch.bfloat16))",
                 "with torch.autocast('cuda'):\n    return ext.op(x)",
                 "out = torch.empty(4, dtype=torch.float16)\next.op(x, out)\nreturn out"):  # fmt: skip
        assert "D11.precision" in run_scan(module(body)).rejects, body
    check = run_scan(
        module("if x.dtype == torch.float16:\n    raise TypeError('fp32 only')\nreturn ext.op(x)")
    )
    assert "D11.precision" not in check.rules(), check
    ref16 = "import torch\nx = torch.randn(4, dtype=torch.float16)\n"
    assert "D11.precision" not in run_scan(module("return ext.op(x.half())"), reference=ref16).rules()


def test_allowed_rules_downgrade_only_downgradable_rules(run_scan):
    src = module("return torch.relu(ext.op(x))", extra="torch.cuda.synchronize = None")
    s = run_scan(src, allowed=("torch-op-in-forward", "D11.monkeypatch"))
    torch_op = [f for f in s.findings if f.rule == "D11.torch-op"]
    assert torch_op and all(f.severity == verify_pb2.SEVERITY_WARNING for f in torch_op), s
    assert all("allowed by policy" in f.detail for f in torch_op)
    assert "D11.monkeypatch" in s.rejects, s
    assert "D11.precision" in run_scan(module("return ext.op(x.half())"), allowed=("precision",)).warnings


def test_triton_kernels_count_as_custom_and_tf32_dots_warn(run_scan):
    extra = """
    import triton
    import triton.language as tl


    @triton.jit
    def _kern(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        a = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(y_ptr + offs, tl.dot(a, a), mask=offs < n)


    @triton.jit
    def _never(x_ptr):
        pass
    """
    body = "out = torch.empty_like(x)\ngrid = lambda meta: (triton.cdiv(x.numel(), meta['BLOCK']),)\n"
    body += "_kern[grid](x, out, x.numel(), BLOCK=1024)\nreturn out"
    s = run_scan(module(body, extra=extra))
    assert s.rejects == set(), s
    assert {"D11.tf32-default", "D11.unlaunched-kernel"} <= s.warnings, s


def test_findings_carry_rule_severity_detail_and_line(run_scan):
    s = run_scan(module("return torch.matmul(x, x)"))
    f = next(f for f in s.findings if f.rule == "D11.torch-op")
    assert f.severity == verify_pb2.SEVERITY_REJECT
    assert "torch.matmul" in f.detail
    path, line = f.where.split(":")
    assert path == "model_new.py" and int(line) > 5
