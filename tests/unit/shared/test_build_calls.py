"""Candidates that build their own extensions: every build call found, read statically, or refused by name."""

import importlib.util
import types
from pathlib import Path

import pytest

from stitchcuda.shared import build_calls
from stitchcuda.shared.candidate import builds, from_kernelbench_source, read_dir
from stitchcuda.shared.errors import InvalidRequest

SRC = "torch::Tensor f(torch::Tensor x) { return x; }"
HARNESS = Path(__file__).resolve().parents[3] / "services" / "verifier" / "harness" / "served_builds.py"

HEAD = """
import functools
import torch
import torch.nn as nn
from torch.utils import cpp_extension
from torch.utils.cpp_extension import load_inline

SRC = "torch::Tensor f(torch::Tensor x) { return x; }"
"""
MODEL = """
class ModelNew(nn.Module):
    def forward(self, x):
        return x
"""


def _served():
    spec = importlib.util.spec_from_file_location("served_builds", HARNESS)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    ("body", "fmt", "names"),
    [
        (
            'ext = load_inline(name="a", cpp_sources=SRC, functions=["f"])\n',
            "load_inline at module level",
            ["a"],
        ),
        (
            'class Holder:\n    def __init__(self):\n        self.a = load_inline("a", [SRC], functions="f")\n'
            '        self.b = cpp_extension.load_inline(name="b", cpp_sources=SRC, functions=["f"])\n',
            "load_inline \u00d72 in __init__",
            ["a", "b"],
        ),
        (
            '@functools.lru_cache(None)\ndef k():\n    return load_inline(name="a", cpp_sources=SRC)\n',
            "load_inline in cached helper k",
            ["a"],
        ),
    ],
)
def test_formats_are_recognised(body, fmt, names):
    cand = from_kernelbench_source(HEAD + body + MODEL, backend="cpu")
    assert cand.format == fmt
    assert [b.extension_name for b in builds(cand)] == names


def test_served_candidates_keep_their_source_and_every_extension_is_scanned():
    source = (
        HEAD + 'class M:\n    def __init__(self):\n        self.e = load_inline(name="a", cpp_sources=SRC)\n'
    )
    cand = from_kernelbench_source(source + MODEL, backend="cpu")
    files = {f.path: f.content for f in cand.files}
    assert files["model_new.py"] == source + MODEL
    assert "torch::Tensor f" in files["ext/a/binding.cpp"] and cand.build.call_digest


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (
            'e = load_inline(name="a", cpp_sources=open("k.cpp").read())\n',
            "line 9.*cpp_sources.*computed at run time",
        ),
        ('n = "a" + str(1)\ne = load_inline(name=n, cpp_sources=SRC)\n', "name argument is computed"),
        ('e = load_inline(name="a", cpp_sources=SRC, **{"verbose": True})\n', r"\*args/\*\*kwargs"),
        (
            'e = cpp_extension.load(name="a", sources=["k.cpp"])\n',
            "k.cpp.*single-file candidate ships no sources",
        ),
        (
            'e = load_inline(name="a", cpp_sources=SRC)\nf = load_inline(name="a", cpp_sources=SRC + " ")\n',
            "both name extension 'a'",
        ),
        ('SRC += "x"\ne = load_inline(name="a", cpp_sources=SRC)\n', "computed at run time"),
    ],
)
def test_build_arguments_computed_at_run_time_are_refused(body, match):
    with pytest.raises(InvalidRequest, match=match):
        from_kernelbench_source(HEAD + body + MODEL, backend="cpu")


def test_a_file_without_build_call_gets_a_usage_error_naming_what_was_looked_for():
    with pytest.raises(InvalidRequest, match=r"manifest\.json.*load_inline or load"):
        from_kernelbench_source("import torch\n" + MODEL, backend="cpu")


def test_load_of_shipped_files_in_a_folder(tmp_path):
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "k.cpp").write_text("// k")
    (tmp_path / "csrc" / "g.cu").write_text("// g")
    (tmp_path / "model_new.py").write_text(
        "import os\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load\n"
        'HERE = os.path.dirname(__file__)\nSRCS = [os.path.join(HERE, "csrc", "k.cpp"), f"{HERE}/csrc/g.cu"]\n'
        'e = load(name="kg", sources=SRCS, extra_cflags=["-O2"])\n' + MODEL
    )
    cand = read_dir(tmp_path)
    assert cand.format == "folder: cpp_extension.load of 2 files at module level"
    assert list(cand.build.sources) == ["csrc/k.cpp", "csrc/g.cu"] and cand.build.backend == "cuda"
    (tmp_path / "model_new.py").write_text("import torch\n" + MODEL)
    with pytest.raises(InvalidRequest, match=r"no manifest\.json.*makes no build call"):
        read_dir(tmp_path)


def test_the_sandbox_computes_the_same_digest_as_the_parent():
    served = _served()
    args = ("load_inline", "a", [["cpp", "x"], ["cuda", ""]], ["f"], ["-O2"], [], [])
    assert served.call_digest(*args) == build_calls.call_digest(*args)


def test_served_calls_return_the_prebuilt_module_only_for_the_arguments_that_were_built():
    source = HEAD + 'e = load_inline(name="a", cpp_sources=[SRC], functions="f", extra_cflags=["-O2"])\n'
    (call,) = build_calls.find(source + MODEL, {})

    class FakeExtension:
        pass

    refused: list[str] = []
    module = FakeExtension()
    served = _served()
    target = types.SimpleNamespace()
    served.install(target, {"a": module}, {"a": call.digest}, "/nonexistent", refused.append)
    assert target.load_inline("a", SRC, functions=["f"], extra_cflags=["-O2"]) is module
    with pytest.raises(RuntimeError, match="other sources or flags"):
        target.load_inline("a", SRC, functions=["f"], extra_cflags=["-O3"])
    with pytest.raises(RuntimeError, match="did not find"):
        target.load_inline("b", SRC)
    assert len(refused) == 2
