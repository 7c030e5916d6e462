"""Parsing LLM answers into candidates: every accepted form, and the reasons for rejecting the rest."""

from __future__ import annotations

import json
import re

import pytest

from stitchcuda.api.v1 import code_pb2
from stitchcuda.coder.llm.parse import ParseError, parse_answer
from stitchcuda.shared.candidate import validate

MODEL_NEW = """import torch
import torch.nn as nn
import relu_ext as ext


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.forward(x)
"""

CUDA = """#include <torch/extension.h>
__global__ void relu_kernel(const float* x, float* y, int64_t n) {}
torch::Tensor forward(torch::Tensor x) { return x; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward); }
"""

CPP = CUDA.replace("__global__ void relu_kernel(const float* x, float* y, int64_t n) {}\n", "")


def fenced(*blocks: tuple[str, str]) -> str:
    return "Here is the program.\n\n" + "\n\n".join(f"```{info}\n{body}```" for info, body in blocks)


def as_candidate(parsed) -> code_pb2.Candidate:  # type: ignore[no-untyped-def]
    return code_pb2.Candidate(
        files=[code_pb2.SourceFile(path=p, content=c) for p, c in parsed.files.items()],
        build=parsed.build,
        entry="model_new.py",
    )


def test_fenced_blocks_with_file_names_after_the_language() -> None:
    parsed = parse_answer(
        fenced(("python model_new.py", MODEL_NEW), ("cuda forward.cu", CUDA)), backend="cuda"
    )
    assert set(parsed.files) == {"model_new.py", "forward.cu"}
    assert parsed.build.extension_name == "relu_ext"
    assert parsed.build.backend == "cuda"
    assert list(parsed.build.sources) == ["forward.cu"]
    assert "--expt-relaxed-constexpr" in parsed.build.cuda_cflags
    assert parsed.rationale.startswith("Here is the program")
    validate(as_candidate(parsed))


def test_file_name_on_the_first_line_or_in_a_heading() -> None:
    text = (
        "### binding.cpp\n```cpp\n" + CPP + "```\n\n"
        "```python\n# model_new.py\n" + MODEL_NEW + "```\n"
        "```cpp\n// file: helpers.cpp\nint helper() { return 1; }\n```\n"
    )
    parsed = parse_answer(text, backend="cpu")
    assert set(parsed.files) == {"binding.cpp", "model_new.py", "helpers.cpp"}
    assert parsed.build.backend == "cpu"
    assert "-fopenmp" in parsed.build.cflags
    assert list(parsed.build.sources) == ["binding.cpp", "helpers.cpp"]


def test_unnamed_blocks_get_names_from_their_language() -> None:
    parsed = parse_answer(fenced(("python", MODEL_NEW), ("cuda", CUDA)), backend="cuda")
    assert set(parsed.files) == {"model_new.py", "kernels.cu"}


def test_structured_json_answer_with_flags() -> None:
    payload = {
        "rationale": "fused relu",
        "files": [{"path": "model_new.py", "content": MODEL_NEW}, {"path": "forward.cu", "content": CUDA}],
        "cuda_cflags": ["-O3", "--use_fast_math"],
    }
    parsed = parse_answer(json.dumps(payload), backend="cuda")
    assert parsed.form == "json"
    assert parsed.rationale == "fused relu"
    assert list(parsed.build.cuda_cflags) == ["-O3", "--use_fast_math"]
    # JSON inside a fence, with files as a mapping, is accepted too.
    mapping = {"files": {"model_new.py": MODEL_NEW, "forward.cu": CUDA}}
    parsed = parse_answer("```json\n" + json.dumps(mapping) + "\n```", backend="cuda")
    assert parsed.build.extension_name == "relu_ext"


def test_single_kernelbench_file_with_load_inline() -> None:
    source = (
        "import torch\nfrom torch.utils.cpp_extension import load_inline\n"
        "cpp_src = 'torch::Tensor forward(torch::Tensor x);'\n"
        "cuda_src = '''"
        + CUDA.replace('PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward); }\n', "")
        + "'''\n"
        "mod = load_inline(name='kb_relu', cpp_sources=cpp_src, cuda_sources=cuda_src, functions=['forward'])\n"
        "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return mod.forward(x)\n"
    )
    parsed = parse_answer(fenced(("python", source)), backend="cuda")
    assert parsed.form == "kernelbench"
    assert parsed.build.extension_name == "kb_relu"
    assert "import kb_relu as ext" in parsed.files["model_new.py"]
    assert "load_inline(" not in parsed.files["model_new.py"]


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("", "empty"),
        ("I cannot help with that.", "no JSON candidate and no fenced code"),
        (fenced(("cuda forward.cu", CUDA)), "no model_new.py"),
        (
            fenced(
                ("python model_new.py", MODEL_NEW.replace("import relu_ext as ext\n", "")),
                ("cuda k.cu", CUDA),
            ),
            "exactly one",
        ),
        (
            fenced(("python model_new.py", MODEL_NEW + "import other as ext\n"), ("cuda k.cu", CUDA)),
            "found 2",
        ),
        (fenced(("python model_new.py", MODEL_NEW)), "no C++/CUDA source"),
        (
            fenced(("python model_new.py", MODEL_NEW), ("cuda k.cu", "__global__ void k() {}\n")),
            "PYBIND11_MODULE",
        ),
        (
            fenced(("python model_new.py", MODEL_NEW + "def broken(:\n"), ("cuda k.cu", CUDA)),
            "does not parse",
        ),
        (
            fenced(("python model_new.py", MODEL_NEW.replace("ModelNew", "Net")), ("cuda k.cu", CUDA)),
            "no class ModelNew",
        ),
        (json.dumps({"files": [{"path": "model_new.py"}]}), "'path' and 'content'"),
        (json.dumps({"files": "model_new.py"}), "must be a list"),
    ],
)
def test_malformed_answers_say_why(answer: str, reason: str) -> None:
    with pytest.raises(ParseError, match=re.escape(reason)):
        parse_answer(answer, backend="cuda")


def test_cuda_sources_are_refused_for_a_cpu_target() -> None:
    with pytest.raises(ParseError, match="CPU"):
        parse_answer(fenced(("python model_new.py", MODEL_NEW), ("cuda k.cu", CUDA)), backend="cpu")


def test_paths_escaping_the_candidate_folder_are_refused() -> None:
    payload = {"files": {"model_new.py": MODEL_NEW, "../evil.cpp": CPP}}
    with pytest.raises(ParseError, match="escapes"):
        parse_answer(json.dumps(payload), backend="cpu")
