"""Recurrent layers (nn.GRU, nn.LSTM): multi-layer, bidirectional, batch- or time-major, with or without an
initial state, returning the output sequence or the final states. Each reference is synthesized for both
back ends (one rnn call, no at::gru/at::lstm), and (slow) its CPU program is compiled and compared with
PyTorch in float64."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from synth_build import load_program

from stitchcuda.coder.synth import rnn
from stitchcuda.coder.synth.ir import Unsupported
from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.candidate import validate
from stitchcuda.shared.policy import LIBRARY, STRICT, KernelPolicy


def problem(layer: str, forward: str, args: str, inputs: str) -> str:
    """A KernelBench-format reference around one recurrent layer `self.rnn`."""
    return (
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self, input_size, hidden_size, num_layers):\n"
        "        super().__init__()\n"
        f"        self.rnn = {layer}\n\n"
        f"    def forward(self, {args}):\n"
        f"{forward}\n\n"
        f"def get_inputs():\n    return {inputs}\n\n"
        "def get_init_inputs():\n    return [6, 8, 2]\n"
    )


# input_size 6, hidden 8; batch 3, sequence 5. Each problem's comment: what it exercises.
PROBLEMS = {
    # One layer, zero initial state, time-major: the output sequence.
    "gru_plain": problem(
        "nn.GRU(input_size, hidden_size, 1)",
        "        out, _ = self.rnn(x)\n        return out",
        "x",
        "[torch.randn(5, 3, 6)]",
    ),
    # Two layers with h0 (KernelBench 39/40): the output and h_n.
    "gru_h0": problem(
        "nn.GRU(input_size, hidden_size, num_layers)",
        "        output, h_n = self.rnn(x, h0)\n        return output, h_n",
        "x, h0",
        "[torch.randn(5, 3, 6), torch.randn(2, 3, 8)]",
    ),
    # Bidirectional, batch-first, no bias, h0 as a keyword: h_n scaled (KernelBench 42 plus an epilogue).
    "gru_bidirectional": problem(
        "nn.GRU(input_size, hidden_size, num_layers, bias=False, batch_first=True, bidirectional=True)",
        "        output, h_n = self.rnn(x, hx=h0)\n        return h_n * 2.0, output",
        "x, h0",
        "[torch.randn(3, 5, 6), torch.randn(4, 3, 8)]",
    ),
    # Bidirectional, time-major, zero initial state: the output sequence (KernelBench 41 without h0).
    "gru_bidirectional_zero": problem(
        "nn.GRU(input_size, hidden_size, num_layers, bidirectional=True)",
        "        output, h_n = self.rnn(x)\n        return output[-1] * 2.0, h_n.sum(0)",
        "x",
        "[torch.randn(5, 3, 6)]",
    ),
    # LSTM with (h0, c0), batch-first (KernelBench 36/37): a head on the last step, h_n and c_n.
    "lstm_state": problem(
        "nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)",
        "        out, state = self.rnn(x, (h0, c0))\n        return out[:, -1, :] * 3.0, state[0], state[1]",
        "x, h0, c0",
        "[torch.randn(3, 5, 6), torch.randn(2, 3, 8), torch.randn(2, 3, 8)]",
    ),
    # Bidirectional LSTM with (h0, c0) (KernelBench 38), time-major, c_n unpacked by name.
    "lstm_bidirectional": problem(
        "nn.LSTM(input_size, hidden_size, num_layers, bidirectional=True)",
        "        out, (h_n, c_n) = self.rnn(x, (h0, c0))\n        return out, c_n",
        "x, h0, c0",
        "[torch.randn(5, 3, 6), torch.randn(4, 3, 8), torch.randn(4, 3, 8)]",
    ),
    # Zero-state LSTM whose final cell state is the result.
    "lstm_zero_cn": problem(
        "nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)",
        "        _, (h_n, c_n) = self.rnn(x)\n        return c_n",
        "x",
        "[torch.randn(3, 5, 6)]",
    ),
}


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    # The references are the test's own: trace them in this process (the service uses a subprocess).
    return Synthesizer(in_process=True)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_each_recurrent_layer_is_one_host_loop_call(synth: Synthesizer, name: str, device: str) -> None:
    for policy in (LIBRARY, STRICT):
        synthesis = synth.synthesize(
            PROBLEMS[name], None, variant=Variant(), device=device, policy=KernelPolicy(policy)
        )
        validate(to_candidate(synthesis))
        host = synthesis.files["forward.cpp"]
        calls = re.findall(r"= stitch_rnn\(([^;]*)\);", host)
        assert len(calls) == 1, calls
        gates = 4 if name.startswith("lstm") else 3
        assert re.search(rf"\}}, [\w:()]+, [\w:()]+, {gates}, ", calls[0]), calls[0]  # weights, h0, c0, gates
        assert "at::lstm" not in host and "at::gru" not in host
        # Under the strict policy every GEMM of the loop is the synthesizer's own.
        assert ("at::addmm(" in host) == (policy == LIBRARY)
        sources = "\n".join(synthesis.files.values())
        assert ("gru_cell" if gates == 3 else "lstm_cell") in sources


def test_states_are_passed_only_when_the_reference_gives_them(synth: Synthesizer) -> None:
    host = synth.synthesize(PROBLEMS["lstm_state"], None, variant=Variant(), device="cpu").files[
        "forward.cpp"
    ]
    assert re.search(r"stitch_rnn\(T_x, \{[^}]*\}, T_h0, T_c0, 4, 2, 1, true, true\)", host)
    host = synth.synthesize(PROBLEMS["gru_bidirectional"], None, variant=Variant(), device="cpu").files[
        "forward.cpp"
    ]
    assert re.search(r"stitch_rnn\(T_x, \{[^}]*\}, T_h0, at::Tensor\(\), 3, 2, 2, false, true\)", host)
    host = synth.synthesize(PROBLEMS["gru_plain"], None, variant=Variant(), device="cpu").files["forward.cpp"]
    assert re.search(
        r"stitch_rnn\(T_x, \{[^}]*\}, at::Tensor\(\), at::Tensor\(\), 3, 1, 1, true, false\)", host
    )


def test_dropout_between_layers_in_training_mode_is_refused(synth: Synthesizer) -> None:
    source = problem(
        "nn.GRU(input_size, hidden_size, num_layers, dropout=0.5)",
        "        return self.rnn(x)[0]",
        "x",
        "[torch.randn(5, 3, 6)]",
    )
    with pytest.raises(Unsupported, match="dropout GRU"):
        synth.synthesize(source, None, variant=Variant(), device="cpu")


# The CUDA program's recurrent loop on the CPU: its kernel text with one thread of one block (the loops stride
# by blockDim and gridDim), launches as plain calls, in the CPU program in place of the CPU loop.
CUDA_ON_CPU = r"""
#define __global__
#define __launch_bounds__(n)
#define __shared__ static
#define __syncthreads()
struct StitchDim { unsigned x; };
static const StitchDim blockIdx{0}, threadIdx{0}, gridDim{1}, blockDim{1};
static inline float __ldg(const float* p) { return *p; }
static inline int sm_count() { return 1; }
#define STITCH_LAUNCH_CHECK()
"""


def cuda_loop_on_cpu(synthesis: Any) -> Any:
    """`synthesis` (a CPU program of the strict policy) with the CUDA back end's loop and kernels emulated."""
    host = synthesis.files["forward.cpp"]
    helper = rnn.cpu_helper(custom=True)
    assert helper in host
    device = re.sub(r"<<<[^>]*>>>", "", rnn.cuda_device())
    # One translation unit here: the constants both units define, once.
    loop = rnn.cuda_host(custom=True).replace(rnn.STEP_CONSTANTS, "", 1)
    name = synthesis.build.extension_name
    files = dict(synthesis.files)
    files["forward.cpp"] = host.replace(helper, CUDA_ON_CPU + device + "\n" + loop)
    files["model_new.py"] = files["model_new.py"].replace(f"import {name} ", f"import {name}_cuda_loop ")
    b = synthesis.build
    build = SimpleNamespace(
        extension_name=f"{name}_cuda_loop", sources=b.sources, cflags=b.cflags, ldflags=b.ldflags
    )
    return SimpleNamespace(files=files, build=build)


@pytest.mark.slow
@pytest.mark.parametrize("gemm", ["library", "custom"])
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_compiled_cpu_program_matches_pytorch(synth: Synthesizer, name: str, gemm: str) -> None:
    check_program(synth, name, gemm)


# Both cells with and without an initial state, both directions, batch- and time-major.
CUDA_LOOP = ["gru_bidirectional_zero", "gru_h0", "lstm_bidirectional", "lstm_state"]


@pytest.mark.slow
@pytest.mark.parametrize("name", CUDA_LOOP)
def test_cuda_loop_on_the_cpu_matches_pytorch(synth: Synthesizer, name: str) -> None:
    """The CUDA program's loop, whose time steps each run one kernel (the recurrent GEMM fused with the cell)
    at these batch sizes."""
    check_program(synth, name, "cuda_loop")


def check_program(synth: Synthesizer, name: str, gemm: str) -> None:
    """The program of PROBLEMS[name] against PyTorch in float64."""
    source = PROBLEMS[name]
    policy = KernelPolicy(LIBRARY if gemm == "library" else STRICT)
    synthesis = synth.synthesize(source, None, variant=Variant(), device="cpu", policy=policy)
    if gemm == "cuda_loop":
        assert "B <= kRnnRows" in rnn.cuda_host(custom=True)
        synthesis = cuda_loop_on_cpu(synthesis)
    mn = load_program(synthesis)
    ns: dict[str, object] = {"__name__": "reference"}
    exec(compile(source, "reference.py", "exec"), ns)
    torch.manual_seed(0)
    ref = ns["Model"](6, 8, 2).double()  # type: ignore[operator]
    torch.manual_seed(0)
    new = mn["ModelNew"](6, 8, 2)  # type: ignore[operator]
    for seed in (1, 2):
        torch.manual_seed(seed)
        xs = ns["get_inputs"]()  # type: ignore[operator]
        for inputs in (xs, [x * 3 + 0.5 for x in xs]):
            with torch.no_grad():
                want = ref(*[x.double() for x in inputs])
                got = new(*inputs)
            wants = want if isinstance(want, tuple) else (want,)
            gots = got if isinstance(got, tuple) else (got,)
            assert len(gots) == len(wants)
            for i, (g, w) in enumerate(zip(gots, wants, strict=True)):
                assert g.dtype == torch.float32 and g.shape == w.shape, (i, g.shape, w.shape)
                rel = ((g.double() - w).norm() / w.norm()).item()
                assert rel < 1e-5, f"{name} result {i}: relative L2 error {rel:.2e}"
