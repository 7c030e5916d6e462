"""A CUDA program with many launches replays its calls from a CUDA graph (variant graph=auto, where
synthesizer.graph_pays): model_new.py copies the inputs into the graph's buffers on every call and the
outputs out, captures on the second call with the first call's shapes, and runs each call's work exactly
once. The replay logic is run here with a stand-in extension and a stand-in of torch's CUDA graph (the
capture records the extension's work, a replay runs it); GPU runs are in tests/gpu/test_synth_gpu.py."""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from stitchcuda.coder.synth.synthesizer import Synthesizer, capture_safe, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.policy import STRICT, KernelPolicy
from stitchcuda.verifier import static


def layers(count: int, batch: int = 4, width: int = 32) -> str:
    """A reference of `count` Linear + ReLU layers."""
    return (
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        f"        self.layers = nn.ModuleList([nn.Linear({width}, {width}) for _ in range({count})])\n\n"
        "    def forward(self, x):\n"
        "        for layer in self.layers:\n            x = torch.relu(layer(x))\n        return x\n\n"
        f"def get_inputs():\n    return [torch.randn({batch}, {width})]\n\n"
        "def get_init_inputs():\n    return []\n"
    )


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer(in_process=True)  # the references here are this test's own


def model_new(synth: Synthesizer, source: str, device: str = "cuda", **variant: str) -> tuple[str, str]:
    synthesis = synth.synthesize(
        source, None, variant=Variant(**variant), device=device, policy=KernelPolicy(STRICT)
    )
    return synthesis.files["model_new.py"], synthesis.build.extension_name


@pytest.mark.parametrize(
    ("count", "device", "variant", "replays"),
    [
        (12, "cuda", {}, True),
        (12, "cuda", {"graph": "off"}, False),
        (12, "cpu", {}, False),
        (2, "cuda", {}, False),
    ],
)
def test_replay_where_launches_outweigh_the_copies(
    synth: Synthesizer, count: int, device: str, variant: dict[str, str], replays: bool
) -> None:
    """Twelve layers (36 launches) replay; the variant graph=off, the CPU back end and two layers do not."""
    source, _ = model_new(synth, layers(count), device, **variant)
    assert ("self._stitch_replay([x], [self.get_submodule('layers.0').weight, " in source) is replays
    assert ("torch.cuda.CUDAGraph()" in source) is replays


def test_large_inputs_are_not_worth_copying(synth: Synthesizer) -> None:
    """The same twelve layers over 2^22 rows: copying 2 x 512 MiB each call costs more than the launches."""
    source, _ = model_new(synth, layers(12, batch=1 << 22))
    assert "_stitch_replay" not in source


class StandInGraph:
    """torch.cuda.CUDAGraph's stand-in: the work recorded while capturing runs on each replay."""

    capturing: StandInGraph | None = None

    def __init__(self) -> None:
        self.work: list[Callable[[], None]] = []

    def replay(self) -> None:
        for work in self.work:
            work()


@contextlib.contextmanager
def stand_in_capture(graph: StandInGraph, capture_error_mode: str = "global") -> Iterator[None]:
    assert capture_error_mode == "relaxed"
    StandInGraph.capturing = graph
    try:
        yield
    finally:
        StandInGraph.capturing = None


def stand_in_extension(name: str, runs: list[int]) -> types.ModuleType:
    """The extension's stand-in: forward(x, *weights) = relu(x @ w0.T + b0) ... computed now, or recorded
    into the graph being captured (its output allocated, written on replay)."""

    def compute(x: torch.Tensor, state: tuple[Any, ...], out: torch.Tensor) -> None:
        runs.append(1)
        for w, b in zip(state[0::2], state[1::2], strict=True):
            x = torch.relu(x @ w.T + b)
        out.copy_(x)

    def forward(x: torch.Tensor, *state: Any) -> torch.Tensor:
        out = torch.empty(x.shape[0], state[0].shape[0])
        if StandInGraph.capturing is not None:
            StandInGraph.capturing.work.append(lambda: compute(x, state, out))
        else:
            compute(x, state, out)
        return out

    module = types.ModuleType(name)
    module.forward = forward  # type: ignore[attr-defined]
    return module


def test_each_call_runs_once_on_its_own_inputs(synth: Synthesizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first call runs directly, the second captures and replays, later ones replay, each on its own
    inputs (copied in) and returning its own tensors (copied out); new shapes or new model tensors run
    directly and capture again."""
    source, ext_name = model_new(synth, layers(12))
    runs: list[int] = []
    monkeypatch.setitem(sys.modules, ext_name, stand_in_extension(ext_name, runs))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", StandInGraph)
    monkeypatch.setattr(torch.cuda, "graph", stand_in_capture)
    namespace: dict[str, Any] = {"__name__": "model_new"}
    exec(compile(source, "model_new.py", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["ModelNew"]()

    def want(x: torch.Tensor) -> torch.Tensor:
        for layer in model.layers:
            x = torch.relu(layer(x))
        return x

    with torch.no_grad():
        xs = [torch.randn(4, 32) for _ in range(4)]
        outs = [model(x) for x in xs[:3]]
        assert len(runs) == 3, "each call's work ran once (the capture ran none)"
        graph = model._stitch_graph
        assert isinstance(graph, StandInGraph) and len(graph.work) == 1
        for x, out in zip(xs, outs, strict=False):
            torch.testing.assert_close(out, want(x))
        assert outs[1] is not model._stitch_outputs and outs[1].data_ptr() != outs[2].data_ptr()
        # In place into the same input tensor: copied in again, not replayed on the old values.
        xs[0].copy_(xs[3])
        torch.testing.assert_close(model(xs[0]), want(xs[3]))
        assert model._stitch_graph is graph
        # Another batch size: a direct call, then a new capture.
        wide = torch.randn(6, 32)
        torch.testing.assert_close(model(wide), want(wide))
        assert model._stitch_graph is None
        torch.testing.assert_close(model(wide * 2), want(wide * 2))
        assert model._stitch_graph not in (None, graph)
        # A model tensor replaced by another: a direct call.
        model.layers[0].weight = torch.nn.Parameter(torch.randn(32, 32))
        torch.testing.assert_close(model(wide), want(wide))
        assert model._stitch_graph is None
        assert len(runs) == 7


def test_the_verifiers_static_scan_accepts_the_replay(synth: Synthesizer) -> None:
    """The replay is the honest pattern of VERIFIER_THREATS (inputs copied in every call, outputs copied out):
    the Verifier notes the CUDA graph and rejects nothing (no input written, no output kept as a result)."""
    source = layers(12)
    synthesis = synth.synthesize(source, None, variant=Variant(), device="cuda", policy=KernelPolicy(STRICT))
    findings = static.scan(to_candidate(synthesis), source)
    assert not [f for f in findings if f.severity >= 3], [
        (f.rule, f.detail) for f in findings if f.severity >= 3
    ]
    assert {f.rule for f in findings} >= {"D11.cuda-graph"}


@pytest.mark.parametrize(
    ("line", "safe"),
    [
        ("at::Tensor T_y = at::empty({4}, opts);", True),
        ("const float s = T_x.sum().item<float>();", False),
        ("at::Tensor T_i = at::nonzero(T_m);", False),
        ("STITCH_CUDA_CHECK(cudaMemcpy(&n, p, 8, cudaMemcpyDeviceToHost));", False),
        ("STITCH_CUDA_CHECK(cudaStreamSynchronize(stream));", False),
        ("at::Tensor T_c = T_x.cpu();", False),
    ],
)
def test_a_host_program_that_waits_for_the_device_is_not_captured(line: str, safe: bool) -> None:
    assert (
        capture_safe({"forward.cpp": f"void forward() {{\n  {line}\n}}\n", "kernels.cu": "cudaMemcpy("})
        is safe
    )
