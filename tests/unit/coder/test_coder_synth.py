"""The built-in synthesizer on the problem suite: valid candidates, the expected kernel structure, and a
ModelNew that only hands tensors to the extension (two programs are compiled and run, marked slow)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
from synth_build import load_program

from stitchcuda.api.v1 import code_pb2
from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.candidate import validate
from stitchcuda.shared.policy import LIBRARY, KernelPolicy

PROBLEMS = Path(__file__).resolve().parents[3] / "benchmarks" / "problems"
SUITE = sorted(p.stem for p in PROBLEMS.glob("[0-9]*.py"))


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    # The suite's references are trusted: trace them in this process (the service uses a subprocess).
    return Synthesizer(in_process=True)


def source(name: str) -> str:
    return (PROBLEMS / f"{name}.py").read_text()


def forward_of(module_source: str, cls: str) -> ast.FunctionDef:
    tree = ast.parse(module_source)
    klass = next(s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == cls)
    return next(s for s in klass.body if isinstance(s, ast.FunctionDef) and s.name == "forward")


def init_of(module_source: str, cls: str) -> ast.FunctionDef | None:
    tree = ast.parse(module_source)
    klass = next(s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == cls)
    return next((s for s in klass.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)


def check_model_new(ref: str, cand: code_pb2.Candidate) -> None:
    files = {f.path: f.content for f in cand.files}
    model_new = files["model_new.py"]
    tree = ast.parse(model_new)
    imports = [s for s in tree.body if isinstance(s, ast.Import) and any(a.asname == "ext" for a in s.names)]
    assert len(imports) == 1 and imports[0].names[0].name == cand.build.extension_name
    # No reference names are redefined, no try/except anywhere.
    assert not {"Model", "get_inputs", "get_init_inputs"} & {
        s.name for s in tree.body if isinstance(s, ast.ClassDef | ast.FunctionDef)
    }
    assert not any(isinstance(n, ast.Try) for n in ast.walk(tree))
    fwd = forward_of(model_new, "ModelNew")
    ref_fwd = forward_of(ref, "Model")
    assert [a.arg for a in fwd.args.args] == [a.arg for a in ref_fwd.args.args]
    # forward is exactly `return ext.forward(<names and attributes>)`, or, replayed from a CUDA graph,
    # `return self._stitch_replay([<the inputs>], [<the model's tensors and settings>])`.
    body = [s for s in fwd.body if not isinstance(s, ast.Expr)]
    assert len(body) == 1 and isinstance(body[0], ast.Return)
    call = body[0].value
    assert isinstance(call, ast.Call) and ast.unparse(call.func) in ("ext.forward", "self._stitch_replay")
    args = call.args
    if ast.unparse(call.func) == "self._stitch_replay":
        assert len(args) == 2 and all(isinstance(a, ast.List) for a in args), ast.unparse(call)
        assert [ast.unparse(a) for a in args[0].elts] == [a.arg for a in ref_fwd.args.args[1:]]  # type: ignore[attr-defined]
        args = [*args[0].elts, *args[1].elts]  # type: ignore[attr-defined]
    for arg in args:
        assert isinstance(arg, ast.Name | ast.Attribute), ast.unparse(arg)
    # Besides ext.forward, only self.get_submodule("<path>") (parameters of numbered submodules).
    calls = [n for n in ast.walk(fwd) if isinstance(n, ast.Call) and n is not call]
    for other in calls:
        assert ast.unparse(other.func) == "self.get_submodule", ast.unparse(other)
        assert len(other.args) == 1 and isinstance(other.args[0], ast.Constant), ast.unparse(other)
    # The constructor is the reference's (same statements, module constants inlined), then the guards
    # of int attributes the kernels were generated around (`if self.dim != 1: raise ValueError(...)`).
    ref_init, new_init = init_of(ref, "Model"), init_of(model_new, "ModelNew")
    if ref_init is not None:
        assert new_init is not None
        own = new_init.body[: len(ref_init.body)]
        guards = new_init.body[len(ref_init.body) :]
        assert [type(s).__name__ for s in own] == [type(s).__name__ for s in ref_init.body]
        for guard in guards:
            assert isinstance(guard, ast.If) and isinstance(guard.body[0], ast.Raise), ast.unparse(guard)
            assert "ValueError" in ast.unparse(guard.body[0])
        assert [a.arg for a in new_init.args.args] == [a.arg for a in ref_init.args.args]


@pytest.mark.parametrize("name", SUITE)
def test_cpu_program_for_every_suite_problem(synth: Synthesizer, name: str) -> None:
    ref = source(name)
    cand = to_candidate(synth.synthesize(ref, None, variant=Variant(), device="cpu"))
    validate(cand)
    assert cand.build.backend == "cpu" and list(cand.build.sources) == ["binding.cpp", "forward.cpp"]
    assert "-fopenmp" in cand.build.cflags
    check_model_new(ref, cand)
    files = {f.path: f.content for f in cand.files}
    cpp = files["forward.cpp"]
    # The binding is a unit of its own (pybind11 is most of the compile time) and binds forward() once.
    assert "PYBIND11_MODULE" not in cpp and "pybind" not in cpp
    assert files["binding.cpp"].count("PYBIND11_MODULE(TORCH_EXTENSION_NAME") == 1
    assert "try" not in cpp.split()
    assert "at::parallel_for" in cpp, "every program runs at least one custom parallel kernel"


@pytest.mark.parametrize("name", SUITE)
def test_cuda_program_for_every_suite_problem(synth: Synthesizer, name: str) -> None:
    ref = source(name)
    cand = to_candidate(synth.synthesize(ref, None, variant=Variant(), device="cuda"))
    validate(cand)
    files = {f.path: f.content for f in cand.files}
    # A program with GEMMs instantiates CUTLASS's in a unit of its own (variant gemm_kernel=cutlass_sm90), one
    # with convolutions CUTLASS's Hopper convolution in another (conv_kernel=cutlass_sm90).
    sources = [
        "binding.cpp",
        *(["cutlass_conv.cu"] if "cutlass_conv.cu" in files else []),
        *(["cutlass_gemm.cu"] if "cutlass_gemm.cu" in files else []),
        "forward.cpp",
        "kernels.cu",
    ]
    assert cand.build.backend == "cuda" and list(cand.build.sources) == sources
    for unit, entry in (
        ("cutlass_gemm.cu", "stitch_cutlass_gemm("),
        ("cutlass_conv.cu", "stitch_cutlass_conv("),
    ):
        if unit in files:
            assert entry in files["kernels.cu"] and "#include <cutlass/" in files[unit]
    assert ("cutlass_conv.cu" in files) == ("stitch_conv_with" in files["kernels.cu"])
    check_model_new(ref, cand)
    cu, host = files["kernels.cu"], files["forward.cpp"]
    assert "__global__" in cu and "__launch_bounds__" in cu
    assert "stitch::current_stream()" in cu and "STITCH_LAUNCH_CHECK" in cu
    # The kernels' file parses no torch header (nvcc takes seconds, not a minute); the host file no
    # torch/extension.h, and it launches nothing itself.
    for heavy in ("#include <torch", "#include <ATen", "#include <c10", "at::Tensor"):
        assert heavy not in cu
    assert "torch/extension.h" not in host and "<<<" not in host and "pybind" not in host
    assert files["binding.cpp"].count("PYBIND11_MODULE(TORCH_EXTENSION_NAME") == 1
    assert "cudaStreamCreate" not in cu and "getStreamFromPool" not in cu
    for banned in ("__half", "bfloat16", "allow_tf32", "__expf", "use_fast_math"):
        assert banned not in cu
    # Every launcher the host code declares is one the kernels' file exports.
    declared = set(re.findall(r"^void (\w+_launch)\(", host.split("namespace stitch_launch {")[1], re.M))
    exported = set(re.findall(r"^void (\w+_launch)\(", cu.split("namespace stitch_launch {")[1], re.M))
    assert declared and declared == exported


@pytest.mark.parametrize(
    ("name", "kinds", "library"),
    [
        ("01_elementwise_chain", ["pointwise"], []),
        ("03_row_sum", ["row"], []),
        ("04_softmax", ["row"], []),
        ("05_layernorm", ["row"], []),
        ("06_gemm_bias_relu", ["pointwise"], ["linear"]),
        ("07_conv_relu", ["pointwise"], ["conv2d"]),
        ("09_cnn_block", ["pool"], ["conv2d"]),
        ("10_rmsnorm", ["row"], []),
        ("11_mse_loss", ["row"], []),
        ("12_attention", ["row"], ["matmul", "matmul"]),
    ],
)
def test_fusion_structure(synth: Synthesizer, name: str, kinds: list[str], library: list[str]) -> None:
    trace = synth.trace(source(name))
    _, program = synth.lower(trace, Variant(), None)
    assert [k.kind for k in program.kernels] == kinds
    assert [s.op.fn for s in program.steps if s.op is not None and s.op.kind == "lib"] == library


def test_softmax_is_one_kernel_with_two_reduction_levels(synth: Synthesizer) -> None:
    from stitchcuda.coder.synth.codegen import analyze

    _, program = synth.lower(synth.trace(source("04_softmax")), Variant(), None)
    info = analyze(program.graph, program.kernels[0])
    assert [r.op.fn for r in info.reductions] == ["amax", "sum"]
    assert info.max_level == 2


def test_conv_epilogue_is_written_in_place_and_bias_moves_out_of_the_library(synth: Synthesizer) -> None:
    _, program = synth.lower(synth.trace(source("07_conv_relu")), Variant(), None)
    conv = next(s.op for s in program.steps if s.op is not None and s.op.kind == "lib")
    assert conv.attrs["bias"] is False
    kernel = program.kernels[0]
    assert kernel.inplace == conv.out
    _, lib_bias = synth.lower(synth.trace(source("07_conv_relu")), Variant(conv_bias="library"), None)
    conv = next(s.op for s in lib_bias.steps if s.op is not None and s.op.kind == "lib")
    assert conv.attrs["bias"] is True


def test_fusion_none_gives_one_kernel_per_op(synth: Synthesizer) -> None:
    _, program = synth.lower(synth.trace(source("01_elementwise_chain")), Variant(fusion="none"), None)
    assert len(program.kernels) == 4


def test_float_attributes_are_passed_at_run_time(synth: Synthesizer) -> None:
    cand = to_candidate(
        synth.synthesize(source("01_elementwise_chain"), None, variant=Variant(), device="cpu")
    )
    model_new = {f.path: f.content for f in cand.files}["model_new.py"]
    assert "ext.forward(x, self.scale, self.shift)" in model_new
    cpp = {f.path: f.content for f in cand.files}["forward.cpp"]
    assert "1.5" not in cpp and "0.25" not in cpp


def test_int_attributes_read_as_constants_are_guarded_in_the_constructor(synth: Synthesizer) -> None:
    cand = to_candidate(
        synth.synthesize(source("15_transformer_block"), None, variant=Variant(), device="cpu")
    )
    model_new = {f.path: f.content for f in cand.files}["model_new.py"]
    namespace: dict[str, object] = {"__name__": "model_new_check"}
    exec(model_new.replace(f"import {cand.build.extension_name} as ext", "ext = None"), namespace)
    model_cls = namespace["ModelNew"]
    assert callable(model_cls)
    model_cls(64, 4)  # the constructor arguments it was generated for (the problem's small size)
    with pytest.raises(ValueError, match=r"generated for heads=4 .*not heads=16"):
        model_cls(64, 16)  # heads is baked into the view shapes: refused, not silently wrong
    # Int attributes the forward never reads (nn.Linear's in_features) are not guarded.
    assert "in_features" not in model_new


def test_lstm_runs_a_custom_cell_kernel_between_library_gemms(synth: Synthesizer) -> None:
    for device, marker in (("cpu", "lstm_cell_launch"), ("cuda", "lstm_cell_kernel<<<")):
        cand = to_candidate(
            synth.synthesize(
                source("14_lstm"), None, variant=Variant(), device=device, policy=KernelPolicy(LIBRARY)
            )
        )
        text = "\n".join(f.content for f in cand.files if f.path.startswith(("forward", "kernels")))
        assert marker in text and "at::addmm" in text and "at::mm(h, w_hh.t())" in text


def test_module_constants_in_the_constructor_are_inlined(synth: Synthesizer) -> None:
    ref = (
        "import torch\nimport torch.nn as nn\nHIDDEN = 64\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(HIDDEN, HIDDEN * 2)\n"
        "    def forward(self, x):\n        return torch.tanh(self.fc(x))\n"
        "def get_inputs():\n    return [torch.randn(8, HIDDEN)]\n"
        "def get_init_inputs():\n    return []\n"
    )
    cand = to_candidate(synth.synthesize(ref, None, variant=Variant(), device="cpu"))
    model_new = {f.path: f.content for f in cand.files}["model_new.py"]
    assert "nn.Linear(64, 64 * 2)" in model_new and "HIDDEN" not in model_new


def test_subprocess_tracing_reports_a_broken_reference() -> None:
    from stitchcuda.coder.synth.trace import TraceError

    ref = "import torch\nclass Model(torch.nn.Module):\n    def __init__(self):\n        raise ValueError('boom')\n"
    ref += "    def forward(self, x):\n        return x\n"
    ref += "def get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n"
    with pytest.raises(TraceError, match=r"line 4.*ValueError: boom"):
        Synthesizer().trace(ref)


def test_unsupported_construct_is_reported(synth: Synthesizer) -> None:
    from stitchcuda.coder.synth.ir import Unsupported

    ref = (
        "import torch\nimport torch.nn as nn\n"
        "class Model(nn.Module):\n    def forward(self, x):\n        return torch.sort(x, dim=1)[0]\n"
        "def get_inputs():\n    return [torch.randn(4, 8)]\n"
        "def get_init_inputs():\n    return []\n"
    )
    with pytest.raises(Unsupported, match="sort"):
        synth.synthesize(ref, None, variant=Variant(), device="cpu")


def _build(synth: Synthesizer, name: str) -> tuple[dict[str, object], dict[str, object]]:
    """Builds the CPU program for a suite problem; returns the reference's and model_new's namespaces."""
    ref = source(name)
    mn = load_program(synth.synthesize(ref, None, variant=Variant(), device="cpu"))
    ns: dict[str, object] = {"__name__": "reference"}
    exec(compile(ref, "reference.py", "exec"), ns)
    return ns, mn


def _build_and_compare(synth: Synthesizer, name: str) -> None:
    ns, mn = _build(synth, name)
    init = ns["get_init_inputs"]()  # type: ignore[operator]
    torch.manual_seed(0)
    model = ns["Model"](*init)  # type: ignore[operator]
    torch.manual_seed(0)
    new = mn["ModelNew"](*init)  # type: ignore[operator]
    for seed in (11, 12):
        torch.manual_seed(seed)
        inputs = ns["get_inputs"]()  # type: ignore[operator]
        shifted = [x * 3 + 0.5 for x in inputs]
        for xs in (inputs, shifted):
            with torch.no_grad():
                expected = model.double()(*[x.double() for x in xs])
                model.float()
                got = new(*xs)
            assert got.dtype == torch.float32 and got.shape == expected.shape
            rel = ((got.double() - expected).norm() / expected.norm()).item()
            assert rel < 1e-5, f"{name}: relative L2 error {rel:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["01_elementwise_chain", "04_softmax"])
def test_compiled_cpu_program_matches_the_reference(synth: Synthesizer, name: str) -> None:
    _build_and_compare(synth, name)


@pytest.mark.slow
def test_batch_norm_in_training_mode_normalizes_by_the_batch_and_updates_the_running_statistics(
    synth: Synthesizer,
) -> None:
    ns, mn = _build(synth, "17_conv_batchnorm_train")
    init = ns["get_init_inputs"]()  # type: ignore[operator]
    torch.manual_seed(0)
    model = ns["Model"](*init)  # type: ignore[operator]
    torch.manual_seed(0)
    new = mn["ModelNew"](*init)  # type: ignore[operator]
    assert model.training and new.training
    for call in range(3):
        torch.manual_seed(20 + call)
        inputs = [x * (call + 1) for x in ns["get_inputs"]()]  # type: ignore[operator]
        with torch.no_grad():
            expected, got = model(*inputs), new(*inputs)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        # The same in-place update of the buffers as torch's (momentum 0.2, unbiased variance).
        for buffer in ("running_mean", "running_var"):
            mine, theirs = getattr(new.bn, buffer), getattr(model.bn, buffer)
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6, msg=f"{buffer} after call {call}")
    assert not torch.equal(new.bn.running_var, torch.ones_like(new.bn.running_var))


@pytest.mark.slow
def test_resnet_stage_with_module_level_block_class_matches_in_training_mode(synth: Synthesizer) -> None:
    ns, mn = _build(synth, "18_resnet_stage")
    init = ns["get_init_inputs"]()  # type: ignore[operator]
    torch.manual_seed(0)
    model = ns["Model"](*init)  # type: ignore[operator]
    torch.manual_seed(0)
    new = mn["ModelNew"](*init)  # type: ignore[operator]
    assert new.width == 2 and type(new.stage[0]).expansion == 1  # class attributes copied
    for call in range(2):
        torch.manual_seed(30 + call)
        inputs = ns["get_inputs"]()  # type: ignore[operator]
        with torch.no_grad():
            expected, got = model(*inputs), new(*inputs)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    for name, buffer in model.named_buffers():
        if "running" in name:
            torch.testing.assert_close(
                dict(new.named_buffers())[name], buffer, rtol=1e-5, atol=1e-6, msg=name
            )


LIBRARY_PROBLEMS = ["06_gemm_bias_relu", "07_conv_relu", "08_mlp", "09_cnn_block", "12_attention", "13_residual_block",
                    "14_lstm", "15_transformer_block"]  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name", LIBRARY_PROBLEMS)
def test_custom_variant_replaces_every_library_call(synth: Synthesizer, name: str, device: str) -> None:
    import re

    library = re.compile(
        r"\bat::(mm|addmm|bmm|baddbmm|matmul|conv[123]d|einsum|scaled_dot_product_attention)\s*\("
    )
    # The library policy keeps the cuBLAS/cuDNN calls; the strict default replaces every one of them.
    default = to_candidate(
        synth.synthesize(source(name), None, variant=Variant(), device=device, policy=KernelPolicy(LIBRARY))
    )
    custom = to_candidate(synth.synthesize(source(name), None, variant=Variant(), device=device))
    default_src = next(f.content for f in default.files if f.path.startswith("forward"))
    custom_src = next(f.content for f in custom.files if f.path.startswith("forward"))
    assert library.search(default_src)
    assert not library.search(custom_src), library.findall(custom_src)
    # The own kernels launched as they are, or with the pointwise kernel after them fused into their store.
    assert any(
        launch in custom_src for launch in ("stitch_gemm_launch", "stitch_conv_launch", "_epilogue_launch(")
    )
    assert default.build.extension_name != custom.build.extension_name


def test_programs_without_gemms_contain_no_library_code(synth: Synthesizer) -> None:
    cand = to_candidate(synth.synthesize(source("04_softmax"), None, variant=Variant(), device="cuda"))
    text = "\n".join(f.content for f in cand.files)
    assert "at::mm" not in text and "addmm" not in text and "infer_size" not in text


def test_plan_fusion_boundaries_are_respected(synth: Synthesizer) -> None:
    from stitchcuda.api.v1 import plan_pb2

    plan = plan_pb2.Plan()
    first = plan.subtasks.add(id="stats", kind=plan_pb2.SUBTASK_KIND_REDUCTION)
    for name in ("pow_1", "mean"):
        first.ops.add(name=name)
    second = plan.subtasks.add(id="scale", kind=plan_pb2.SUBTASK_KIND_ELEMENTWISE)
    for name in ("add", "rsqrt", "mul", "mul_1"):
        second.ops.add(name=name)
    trace = synth.trace(source("10_rmsnorm"))
    _, fused = synth.lower(trace, Variant(), plan)
    _, split = synth.lower(trace, Variant(fusion="plan"), plan)
    assert [k.kind for k in fused.kernels] == ["row"]
    assert [k.kind for k in split.kernels] == ["row", "pointwise"]
    assert split.kernels[0].origins == ["mean", "pow_1"]
