"""The candidate format: folders, single-file KernelBench candidates, and the standalone export."""

import pytest

from stitchcuda.api.v1 import code_pb2
from stitchcuda.shared.candidate import (
    content_hash,
    export_standalone,
    from_kernelbench_source,
    read_dir,
    validate,
    write_dir,
)
from stitchcuda.shared.errors import InvalidRequest

KB_FILE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_src = """
torch::Tensor add_one(torch::Tensor x) { return x + 1; }
"""

ext_mod = load_inline(name="add_one_ext", cpp_sources=cpp_src, functions=["add_one"], extra_cflags=["-O3"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext_mod.add_one(x)
'''


def make() -> code_pb2.Candidate:
    return code_pb2.Candidate(
        files=[
            code_pb2.SourceFile(path="model_new.py", content="import torch\nimport demo_ext as ext\n"),
            code_pb2.SourceFile(path="k.cpp", content="// kernel"),
        ],
        build=code_pb2.BuildManifest(
            extension_name="demo_ext", sources=["k.cpp"], backend="cpu", cflags=["-O2"]
        ),
        entry="model_new.py",
    )


def test_folder_round_trip(tmp_path):
    cand = make()
    write_dir(cand, tmp_path / "c")
    back = read_dir(tmp_path / "c")
    assert content_hash(back) == content_hash(cand)
    # Declared library calls travel with the folder (the library policy reads them when it is verified).
    cand.build.libraries.append("cublas")
    write_dir(cand, tmp_path / "d")
    assert list(read_dir(tmp_path / "d").build.libraries) == ["cublas"]


def test_hash_changes_with_sources_and_flags():
    a, b, c = make(), make(), make()
    b.files[1].content = "// other"
    c.build.cflags.append("-DX")
    assert len({content_hash(a), content_hash(b), content_hash(c)}) == 3


def test_kernelbench_file_becomes_files_and_manifest():
    cand = from_kernelbench_source(KB_FILE, backend="cpu")
    files = {f.path: f.content for f in cand.files}
    assert cand.build.extension_name == "add_one_ext" and cand.build.cflags == ["-O3"]
    assert "PYBIND11_MODULE" in files["binding.cpp"] and "add_one" in files["binding.cpp"]
    assert "load_inline(" not in files["model_new.py"].split("import add_one_ext as ext")[1]
    assert "return ext.add_one(x)" in files["model_new.py"]
    assert "cpp_extension" not in files["model_new.py"]


def test_kernelbench_file_with_computed_sources_is_refused():
    source = KB_FILE.replace("cpp_sources=cpp_src", 'cpp_sources=open("k.cpp").read()')
    with pytest.raises(InvalidRequest, match="literals"):
        from_kernelbench_source(source, backend="cpu")


def test_export_embeds_sources_and_builds_them():
    text = export_standalone(make())
    assert "import demo_ext as ext" not in text
    assert "_load(" in text and "'k.cpp': '// kernel'" in text
    compile(text, "model_new.py", "exec")


def test_export_of_a_cutlass_program_finds_the_headers_where_it_runs():
    cand = make()
    cand.build.backend = "cuda"
    cand.files[1].content = "#include <cutlass/gemm/device/gemm_universal.h>\n// kernel"
    text = export_standalone(cand)
    assert "find_spec('cutlass_library')" in text and "+ _CUTLASS_FLAGS," in text
    compile(text, "model_new.py", "exec")
    assert "_CUTLASS" not in export_standalone(make()), "nothing added where no CUTLASS header is included"


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda c: c.files.pop(0), "no model_new.py"),
        (lambda c: setattr(c.build, "extension_name", "bad name"), "invalid extension name"),
        (lambda c: setattr(c.build, "backend", "rocm"), "backend"),
        (lambda c: c.build.sources.append("missing.cu"), "not among"),
    ],
)
def test_invalid_candidates(mutate, match):
    cand = make()
    mutate(cand)
    with pytest.raises(InvalidRequest, match=match):
        validate(cand)
