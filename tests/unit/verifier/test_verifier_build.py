"""Builds: the content-hash cache behind the ArtifactStore, and trimmed compiler errors."""

from __future__ import annotations

import pytest
from verifier_support import FIXTURES, fast_settings

from stitchcuda.shared import cutlass
from stitchcuda.shared.artifacts import LocalArtifactStore
from stitchcuda.shared.candidate import read_dir
from stitchcuda.shared.isolation import system_binds
from stitchcuda.verifier.build import cache_key, cutlass_flags, first_error, object_key, shared_units
from stitchcuda.verifier.service import VerifierService


def test_a_logged_warning_is_never_the_reported_build_error():
    log = (
        "W1206 16:14:30.006000 2 torch/utils/cpp_extension.py:140] No CUDA runtime is found, using CUDA_HOME\n"
        "ninja: build stopped: subcommand failed.\n"
        "W1206 16:14:31.000000 2 torch/utils/cpp_extension.py:141] No CUDA runtime is found\n"
    )
    assert first_error(log) == "ninja: build stopped: subcommand failed."
    assert (
        first_error("W1206 16:14:30.006000 2 x.py:1] nothing\n")
        == "build failed: the compiler printed no error"
    )


def test_first_error_is_trimmed_to_file_line_message():
    log = (
        "[1/2] c++ -MMD -c /sandbox/src/kernel.cpp -o kernel.o\nFAILED: kernel.o\n"
        "/sandbox/src/kernel.cpp: In function 'at::Tensor f(at::Tensor)':\n"
        "/sandbox/src/kernel.cpp:6:3: error: 'undeclared_helper' was not declared in this scope\n"
        "/sandbox/src/kernel.cpp:9:1: error: expected ';'\n"
    )
    assert first_error(log) == "kernel.cpp:6: error: 'undeclared_helper' was not declared in this scope"
    nvcc = '/sandbox/src/k.cu(12): error: identifier "blockIdx_" is undefined\n'
    assert first_error(nvcc) == 'k.cu:12: error: identifier "blockIdx_" is undefined'
    assert first_error("kernel.o: undefined reference to `helper(int)'\n").startswith("link error")


def test_cache_key_ignores_model_new_but_not_sources_or_flags():
    base = read_dir(FIXTURES / "honest_cpu")
    glue = read_dir(FIXTURES / "honest_cpu")
    next(f for f in glue.files if f.path == "model_new.py").content += "\n# different glue\n"
    assert cache_key(base, "9.0") == cache_key(glue, "9.0")
    flags = read_dir(FIXTURES / "honest_cpu")
    flags.build.cflags.append("-DDIFFERENT")
    assert cache_key(base, "9.0") != cache_key(flags, "9.0")
    src = read_dir(FIXTURES / "honest_cpu")
    next(f for f in src.files if f.path == "elementwise.cpp").content += "\n// edit\n"
    assert cache_key(base, "9.0") != cache_key(src, "9.0")


@pytest.mark.slow
def test_second_build_is_a_cache_hit_on_any_worker(tmp_path, build_store: LocalArtifactStore):
    cand = read_dir(FIXTURES / "honest_cpu")
    first = VerifierService(fast_settings(tmp_path / "w1"), artifacts=build_store)
    r1 = first.build(cand, device="cpu")
    assert r1.ok, r1.error
    r2 = first.build(cand, device="cpu")
    assert r2.ok and r2.cached and r2.cache_key == r1.cache_key
    assert r2.seconds < 5
    # A second worker with an empty local cache fetches the archive from the shared store: no compile.
    second = VerifierService(fast_settings(tmp_path / "w2"), artifacts=build_store)
    r3 = second.build(cand, device="cpu")
    assert r3.ok and r3.cached and second.builder.compiles == 0
    assert build_store.exists(f"cache/builds/{r1.cache_key}.tar.gz")


@pytest.mark.slow
def test_broken_build_reports_first_real_error(service: VerifierService):
    result = service.build(read_dir(FIXTURES / "broken_build"), device="cpu")
    assert not result.ok
    assert result.error.startswith("kernel.cpp:6: error:"), result.error
    assert "undeclared_helper" in result.error
    again = service.build(read_dir(FIXTURES / "broken_build"), device="cpu")
    assert not again.ok and again.cached and again.error == result.error


def cutlass_candidate():
    """A CUDA candidate whose sources include a CUTLASS header (written here; never built in this test)."""
    cand = read_dir(FIXTURES / "honest_cpu")
    cand.build.backend = "cuda"
    source = next(f for f in cand.files if f.path == "elementwise.cpp")
    source.content = "#include <cutlass/gemm/device/gemm_universal.h>\n" + source.content
    return cand


@pytest.mark.skipif(cutlass.include_dir() is None, reason="the nvidia-cutlass package is not installed")
def test_a_cuda_build_that_includes_cutlass_gets_its_headers_and_the_sandbox_binds_them(monkeypatch):
    cand = cutlass_candidate()
    # The headers and the utility headers (cutlass/util/, which the Hopper convolution includes).
    assert cutlass_flags(cand) == [f"-I{cutlass.include_dir()}", f"-I{cutlass.util_include_dir()}"]
    util = cutlass.util_include_dir()
    assert util is not None and str(util).startswith(str(cutlass.package_dir()))
    assert cutlass_flags(read_dir(FIXTURES / "honest_cpu")) == [], "no CUTLASS header, no flag"
    binds = system_binds(False)
    assert str(cutlass.package_dir()) in binds, "the builder's sandbox reads the headers"
    # The headers' version is part of the build's cache key.
    key = cache_key(cand, "9.0")
    monkeypatch.setattr(cutlass, "version", lambda: "0.0.1")
    assert cache_key(cand, "9.0") != key


def test_a_cutlass_build_without_the_package_fails_saying_what_to_install(monkeypatch):
    monkeypatch.setattr(cutlass, "include_dir", lambda: None)
    with pytest.raises(FileNotFoundError, match=r"stitchcuda\[cuda\]"):
        cutlass_flags(cutlass_candidate())


# A unit that instantiates CUTLASS (a host-only header here, so the CPU builder compiles it): the same text in
# two programs is compiled once, its object linked into the second.
SHARED_UNIT = """#include <cutlass/uint128.h>
#include <cstdint>
uint64_t unit_high_product(uint64_t a, uint64_t b) {
  return static_cast<uint64_t>((cutlass::uint128_t(a) * b) >> 64);
}
"""


def binding(tag: str) -> str:
    # pybind11 alone (torch ships it): the four builds below compile this in seconds, not a torch header's half minute.
    return f"""#include <pybind11/pybind11.h>
#include <cstdint>
uint64_t unit_high_product(uint64_t a, uint64_t b);
int64_t high_{tag}(int64_t a, int64_t b) {{ return (int64_t)unit_high_product((uint64_t)a, (uint64_t)b); }}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ m.def("high", &high_{tag}); }}
"""


def two_unit_candidate(tag: str):
    cand = read_dir(FIXTURES / "honest_cpu")
    del cand.files[:]
    cand.files.add(path="model_new.py", content="# glue\n")
    cand.files.add(path="binding.cpp", content=binding(tag))
    cand.files.add(path="unit.cpp", content=SHARED_UNIT)
    cand.build.extension_name = f"sc_test_shared_{tag}"
    del cand.build.sources[:]
    cand.build.sources.extend(["binding.cpp", "unit.cpp"])
    return cand


def call_high(service: VerifierService, result, name: str) -> int:
    import importlib.util

    import torch  # noqa: F401  (the extension links against torch's libraries)

    so = service.builder.local_dir(result.cache_key) / f"{name}.so"
    spec = importlib.util.spec_from_file_location(name, so)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return int(module.high(1 << 40, 1 << 40))


def test_only_units_that_instantiate_cutlass_and_never_name_the_extension_are_shared():
    cand = two_unit_candidate("a")
    assert list(shared_units(cand)) == ["unit.cpp"]
    named = two_unit_candidate("a")
    named.files[2].content += "\n// built for TORCH_EXTENSION_NAME\n"
    assert shared_units(named) == {}, "an object that expands the extension's name is its build's own"
    relocatable = two_unit_candidate("a")
    relocatable.build.cflags.append("-rdc=true")
    assert shared_units(relocatable) == {}
    alone = two_unit_candidate("a")
    del alone.build.sources[0]
    assert shared_units(alone) == {}, "a build of one source is cached whole"
    # The key follows the unit, the headers it includes, the flags; never the other sources.
    reads = shared_units(cand)["unit.cpp"]
    key = object_key(cand, "unit.cpp", reads, "9.0")
    assert object_key(two_unit_candidate("b"), "unit.cpp", reads, "9.0") == key
    flagged = two_unit_candidate("a")
    flagged.build.cflags.append("-DOTHER")
    assert object_key(flagged, "unit.cpp", reads, "9.0") != key
    with_header = two_unit_candidate("a")
    with_header.files[2].content = '#include "shared.h"\n' + SHARED_UNIT
    with_header.files.add(path="shared.h", content="#pragma once\n")
    reads = shared_units(with_header)["unit.cpp"]
    assert reads == ["unit.cpp", "shared.h"]
    edited = two_unit_candidate("a")
    edited.files[2].content = with_header.files[2].content
    edited.files.add(path="shared.h", content="#pragma once\n#define EDITED 1\n")
    assert object_key(edited, "unit.cpp", reads, "9.0") != object_key(with_header, "unit.cpp", reads, "9.0")


@pytest.mark.slow
@pytest.mark.skipif(cutlass.include_dir() is None, reason="the nvidia-cutlass package is not installed")
def test_a_unit_another_build_compiled_is_linked_from_its_object(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    store = LocalArtifactStore(tmp_path / "store")
    first = VerifierService(fast_settings(tmp_path / "w1"), artifacts=store)
    # Two programs with the same unit built at once on one worker: one compiles it, the other waits for
    # that and links its object.
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda t: first.build(two_unit_candidate(t), device="cpu"), ["a", "b"])
    assert a.ok and b.ok, (a.error, b.error)
    assert first.builder.objects_reused == 1
    assert call_high(first, b, "sc_test_shared_b") == 1 << 16
    key = object_key(two_unit_candidate("a"), "unit.cpp", ["unit.cpp"], first.settings.cuda_arch_list)
    assert store.exists(f"cache/objects/{key}.o"), "the compiled unit is kept for other builds"
    # Another worker fetches the object from the shared store.
    second = VerifierService(fast_settings(tmp_path / "w2"), artifacts=store)
    c = second.build(two_unit_candidate("c"), device="cpu")
    assert c.ok, c.error
    assert second.builder.objects_reused == 1
    assert call_high(second, c, "sc_test_shared_c") == 1 << 16
    # A broken object never costs a verdict: the build that cannot link it builds from sources.
    (second.builder.objects_dir / f"{key}.o").write_bytes(b"not an object")
    d = second.build(two_unit_candidate("d"), device="cpu")
    assert d.ok, d.error
    assert second.builder.objects_reused == 1, "the broken object was not counted as linked"
    assert call_high(second, d, "sc_test_shared_d") == 1 << 16
    assert (second.builder.objects_dir / f"{key}.o").read_bytes()[:4] == b"\x7fELF", "replaced"
    first.close()
    second.close()
