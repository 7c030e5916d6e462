"""Builds: the content-hash cache behind the ArtifactStore, and trimmed compiler errors."""

from __future__ import annotations

import pytest
from verifier_support import FIXTURES, fast_settings

from stitchcuda.shared import cutlass
from stitchcuda.shared.artifacts import LocalArtifactStore
from stitchcuda.shared.candidate import read_dir
from stitchcuda.shared.isolation import system_binds
from stitchcuda.verifier.build import cache_key, cutlass_flags, first_error
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
    assert cutlass_flags(cand) == [f"-I{cutlass.include_dir()}"]
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
