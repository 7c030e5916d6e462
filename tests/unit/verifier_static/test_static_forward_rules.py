"""D11 forward-path rules: each fires on its hack and stays quiet on the honest twin; aliases are resolved."""

import pytest
from conftest import module

HONEST = module(
    """
    out = torch.empty(x.shape[0], self.linear.weight.shape[0], dtype=x.dtype, device=x.device)
    ext.gemm(x.contiguous().view(x.size(0), -1), self.linear.weight, self.linear.bias, out)
    return out
    """,
    "self.linear = nn.Linear(in_features, out_features)",
)


def test_honest_allocation_views_and_parameter_container_are_clean(run_scan):
    s = run_scan(HONEST)
    assert s.rejects == set() and s.warnings == set(), s


@pytest.mark.parametrize(
    "extra, body",
    [
        ("", "return torch.matmul(x, self.w)"),
        ("import torch.nn.functional as F", "return F.relu(ext.op(x))"),
        ("from torch import matmul as mm", "return mm(x, self.w)"),
        ("t = torch", "return t.relu(ext.op(x))"),
        ("relu = getattr(torch, 'relu')", "return relu(ext.op(x))"),
        ("from torch.nn import functional as Fn\nlin = Fn.linear", "return lin(x, self.w)"),
        ("", "return ext.op(x).sum(dim=0)"),
        ("", "return ext.op(x) @ self.w"),
        ("", "return ext.op(x) * 2"),
        ("", "return -ext.op(x)"),
        ("", "return abs(ext.op(x))"),
        ("import numpy as np", "return np.matmul(x, self.w)"),
        ("", "return torch.Tensor.add(x, 1)"),
        ("", "return nn.functional.gelu(x)"),
        ("", "return torch.compile(ext.op)(x)"),
        ("", "return x.__matmul__(self.w)"),
        ("", "return getattr(ext.op(x), 'exp')()"),
        ("from torch import *", "return matmul(x, self.w)"),
        ("", "return torch.nn.functional.__dict__['relu'](ext.op(x))"),
        ("", "return torch.ops.aten.mm(x, self.w)"),
        ("", "return torch._C._nn.linear(x, self.w)"),
    ],
)
def test_torch_compute_on_inputs_is_rejected_through_aliases(run_scan, extra, body):
    s = run_scan(module(body, "self.w = nn.Parameter(torch.ones(512, 256))", extra=extra))
    assert "D11.torch-op" in s.rejects, s


def test_nn_layer_call_and_instance_alias_are_compute(run_scan):
    s = run_scan(module("return self.lin(x)", "self.lin = nn.Linear(in_features, out_features)"))
    assert "D11.torch-op" in s.rejects, s
    s = run_scan(module("return self.mm(x, x)", "self.mm = torch.matmul"))
    assert "D11.torch-op" in s.rejects, s


def test_call_graph_follows_methods_helpers_and_lambdas(run_scan):
    extra = """
    def _epilogue(y, b):
        return torch.relu(y + b)
    """
    body = """
    y = self._main(x)
    return _epilogue(y, self.b)
    """
    src = module(body, "self.b = nn.Parameter(torch.zeros(256))", extra=extra)
    src += "\n    def _main(self, x):\n        return ext.gemm(x)\n"
    s = run_scan(src)
    assert "D11.torch-op" in s.rejects, s
    assert any(w.startswith("model_new.py:") for w in s.where("D11.torch-op"))
    lam = run_scan(module("f = lambda t: torch.exp(t)\nreturn f(ext.op(x))"))
    assert "D11.torch-op" in lam.rejects, lam


def test_torch_ops_off_the_forward_path_are_not_flagged(run_scan):
    extra = """
    def _unused(x):
        return torch.matmul(x, x)
    """
    init = "self.w = nn.Parameter(torch.nn.init.kaiming_uniform_(torch.empty(256, 512)).t().contiguous())"
    s = run_scan(module("return ext.gemm(x, self.w)", init, extra=extra))
    assert "D11.torch-op" not in s.rules(), s


def test_compute_on_parameters_only_is_info(run_scan):
    s = run_scan(
        module("w = torch.tanh(self.w)\nreturn ext.gemm(x, w)", "self.w = nn.Parameter(torch.ones(4))")
    )
    assert "D11.torch-op" not in s.rules() and "D11.param-op" in s.rules(1), s


def test_metadata_arithmetic_is_allowed(run_scan):
    body = """
    n = x.numel()
    blocks = (n + 255) // 256
    assert x.data_ptr() % 16 == 0
    return ext.op(x, blocks, x.shape[-1] * 4)
    """
    s = run_scan(module(body))
    assert s.rejects == set(), s


def test_try_except_fallback_is_rejected_and_a_reraise_only_warns(run_scan):
    fallback = module("try:\n    return ext.op(x)\nexcept RuntimeError:\n    return torch.relu(x)")
    assert {"D11.fallback", "D11.torch-op"} <= run_scan(fallback).rejects
    swallow = module(
        "out = torch.empty_like(x)\ntry:\n    ext.op(x, out)\nexcept Exception:\n    pass\nreturn out"
    )
    assert "D11.fallback" in run_scan(swallow).rejects
    reraise = run_scan(
        module("try:\n    return ext.op(x)\nexcept RuntimeError as e:\n    raise ValueError('bad') from e")
    )
    assert reraise.rejects == set() and "D11.try-except" in reraise.warnings, reraise


def test_guarded_extension_import_and_missing_extension_branch(run_scan):
    src = """
    import torch
    import torch.nn as nn
    try:
        import kit as ext
    except ImportError:
        ext = None


    class ModelNew(nn.Module):
        def forward(self, x):
            if ext is None:
                return x.clone()
            return ext.op(x)
    """
    s = run_scan(src, header=False)
    assert {"D11.guarded-build", "D11.fallback"} <= s.rejects, s


def test_identity_keys_are_rejected_but_parameter_versions_are_not(run_scan):
    for body in (
        "k = (x.data_ptr(), x.shape)\nif k in self.memo:\n    return self.memo[k]\nreturn ext.op(x)",
        "if id(x) == self.last_id:\n    return ext.op(x)\nreturn ext.op(x)",
        "if x._version != self.v:\n    return ext.op(x)\nreturn ext.op(x)",
        "self.ptr = x.untyped_storage().data_ptr()\nreturn ext.op(x)",
    ):
        s = run_scan(module(body, "self.memo = {}\nself.last_id = 0\nself.v = 0"))
        assert "D11.identity-key" in s.rejects, (body, s)
    honest = """
    if self.wt is None or self.wt_version != self.w._version:
        self.wt = self.w.detach().t().contiguous()
        self.wt_version = self.w._version
    return ext.gemm(x, self.wt)
    """
    s = run_scan(
        module(honest, "self.w = nn.Parameter(torch.ones(4, 4))\nself.wt = None\nself.wt_version = -1")
    )
    assert s.rejects == set(), s


def test_output_caches_and_stored_outputs(run_scan):
    s = run_scan(module("out = ext.op(x)\nself.last = out\nreturn out"))
    assert "D11.output-cache" in s.rejects, s
    s = run_scan(module("return self.plan", "self.plan = ext.op(torch.ones(4))"))
    assert "D11.stored-output" in s.rejects, s
    glob = run_scan(module("y = ext.op(x)\n_CACHE[x.shape[0]] = y\nreturn y", extra="_CACHE = {}"))
    assert "D11.output-cache" in glob.rejects, glob
    memo = """
    import functools

    @functools.lru_cache(maxsize=None)
    def _run(t):
        return ext.op(t)
    """
    assert "D11.output-cache" in run_scan(module("return _run(x)", extra=memo)).rejects
    scratch = run_scan(
        module(
            "if self.buf is None:\n    self.buf = torch.empty(1024)\nreturn ext.op(x, self.buf)",
            "self.buf = None",
        )
    )
    assert scratch.rejects == set(), scratch


def test_call_counters_compared_or_used_as_cursor(run_scan):
    phase = module("self.n += 1\nif self.n > 10:\n    return ext.fast(x)\nreturn ext.op(x)", "self.n = 0")
    assert "D11.call-counter" in run_scan(phase).rejects
    cursor = module("out = ext.op(x)\nself.i += 1\nreturn self.outs[self.i]", "self.i = 0\nself.outs = []")
    assert "D11.call-counter" in run_scan(cursor).rejects
    logging_only = run_scan(module("self.n += 1\nreturn ext.op(x)", "self.n = 0"))
    assert logging_only.rejects == set(), logging_only


def test_input_mutation(run_scan):
    for body in ("x.zero_()\nreturn ext.op(x)", "x[0] = 0\nreturn ext.op(x)", "x += 1\nreturn ext.op(x)",
                 "v = x.view(-1)\nv.add_(1)\nreturn ext.op(x)"):  # fmt: skip
        assert "D11.input-mutation" in run_scan(module(body)).rejects, body
    fresh = run_scan(module("out = torch.empty_like(x)\nout.zero_()\next.op(x, out)\nreturn out"))
    assert fresh.rejects == set(), fresh


def test_inputs_must_reach_a_kernel_or_the_output(run_scan):
    const = run_scan(module("out = torch.empty(())\next.fill(out, 2.0)\nreturn out", signature="self, p, t"))
    assert "D11.ignores-inputs" in const.rejects, const
    half = run_scan(module("return ext.op(p)", signature="self, p, t"))
    assert "D11.ignores-inputs" not in half.rules() and "D11.unused-input" in half.warnings, half
    torch_only = run_scan(module("return x.clone()"))
    assert "D11.no-custom-call" in torch_only.rejects, torch_only


def test_seeds_and_random_data(run_scan):
    seeded = run_scan(module("return ext.op(x)", "torch.manual_seed(42)\nself.p = ext.op(torch.randn(4))"))
    assert "D11.seed" in seeded.rejects, seeded
    at_import = run_scan(module("return ext.op(x)", extra="NOISE = torch.randn(16)"))
    assert "D11.seed" in at_import.rejects
    # A draw from torch's generator on the forward path is how a random reference's numbers are drawn again
    # (the Verifier seeds every call alike): reported, and a draw the reference lacks fails the comparison.
    in_forward = run_scan(module("return ext.op(x, torch.randn_like(x))"))
    assert "D11.seed" not in in_forward.rejects and "D11.random-draw" in in_forward.rules(), in_forward
    # Reading the generator's seed names the call's input set: a cache keyed by it would fake timing.
    peeking = run_scan(module("return ext.op(x, torch.initial_seed())"))
    assert "D11.seed" in peeking.rejects, peeking
    init = run_scan(module("return ext.op(x, self.w)", "self.w = nn.Parameter(torch.randn(4, 4))"))
    assert init.rejects == set() and "D11.random" in init.warnings, init


def test_soft_signals_warn_only(run_scan):
    cases = {
        "D11.shape-gate": "if x.shape[0] == 2048:\n    return ext.fast(x)\nreturn ext.op(x)",
        "D11.expand-output": "return ext.op(x[:1]).expand(x.shape[0], -1)",
        "D11.subsample": "return ext.op(x[::16])",
        "D11.host-read": "return ext.op(x, float(ext.peek(x)) > 0)",
        "D11.nan-literal": "return ext.op(x, float('nan'))",
        "D11.input-alias": "ext.op(x)\nreturn x.view(-1)",
    }
    for rule, body in cases.items():
        s = run_scan(module(body))
        assert rule in s.warnings, (rule, s)
        assert not (s.rejects - {"D11.torch-op"}), (rule, s)


def test_forward_hooks_are_entry_points(run_scan):
    extra = """
    def _hook(module, inputs, output):
        return torch.relu(output)
    """
    s = run_scan(module("return ext.op(x)", "self.register_forward_hook(_hook)", extra=extra))
    assert "D11.call-override" in s.warnings and "D11.torch-op" in s.rejects, s


def test_hidden_state_writes_and_dynamic_method_names(run_scan):
    s = run_scan(module("out = ext.op(x)\nself.register_buffer('last', out)\nreturn out"))
    assert "D11.output-cache" in s.rejects, s
    s = run_scan(module("name = 'ex' + 'p'\nreturn getattr(ext.op(x), name)()"))
    assert "D11.dynamic-code" in s.rejects, s


def test_extension_held_on_the_instance_still_counts(run_scan):
    s = run_scan(module("return self.k.op(x)", "self.k = ext"))
    assert s.rejects == set(), s
    s = run_scan(module("return self.fn(x)", "self.fn = ext.op"))
    assert s.rejects == set(), s


def test_mutable_default_argument_is_a_cache(run_scan):
    body = "k = x.shape\nif k in _cache:\n    return _cache[k]\n_cache[k] = ext.op(x)\nreturn _cache[k]"
    s = run_scan(module(body, signature="self, x, _cache={}"))
    assert {"D11.output-cache", "D11.stored-output"} <= s.rejects, s
