"""CUTLASS's C++ headers in the build environment, next to torch's.

A candidate may instantiate CUTLASS templates in its sources (`#include <cutlass/...>`): under the strict
kernel policy such a kernel is the candidate's own (services/verifier/README.md, D6), unlike a call into
cuBLAS/cuDNN. The headers come from the `nvidia-cutlass` package (the `cuda` extra); the
Verifier's builder adds their folder to a CUDA build whose sources include one, so a candidate names no
machine's path, and the sandbox binds that folder read-only.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

# `#include <cutlass/...>` or `#include "cutlass/..."` (cute/ comes with it).
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](?:cutlass|cute)/', re.MULTILINE)


@lru_cache(maxsize=1)
def package_dir() -> Path | None:
    """The installed `cutlass_library` package (found without importing it: it imports cuda-python)."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def include_dir() -> Path | None:
    """CUTLASS's `include` folder (holding cutlass/ and cute/), or None where the package is missing."""
    package = package_dir()
    if package is None:
        return None
    include = package / "source" / "include"
    return include if (include / "cutlass" / "cutlass.h").is_file() else None


def util_include_dir() -> Path | None:
    """CUTLASS's utility headers (cutlass/util/, which the Hopper convolution includes), or None."""
    package = package_dir()
    if package is None:
        return None
    util = package / "source" / "tools" / "util" / "include"
    return util if (util / "cutlass" / "util" / "packed_stride.hpp").is_file() else None


def version() -> str:
    """The installed nvidia-cutlass package's version ("" where missing): part of a build's cache key."""
    try:
        return importlib.metadata.version("nvidia-cutlass")
    except importlib.metadata.PackageNotFoundError:
        return ""


def used_by(sources: Iterable[str]) -> bool:
    """Whether any of these source texts includes a CUTLASS (or CuTe) header."""
    return any(INCLUDE.search(text) for text in sources)


def build_flags(sources: Iterable[str]) -> list[str]:
    """The CUDA compiler flags a build of these sources needs for CUTLASS: its include folders (headers and
    utility headers) where one of them includes a CUTLASS header (nothing otherwise). Raises where CUTLASS
    is needed and missing."""
    if not used_by(sources):
        return []
    include = include_dir()
    if include is None:
        raise FileNotFoundError(
            "the sources include CUTLASS headers and the nvidia-cutlass package is not installed "
            "(pip install 'stitchcuda[cuda]')"
        )
    util = util_include_dir()
    return [f"-I{include}", *([f"-I{util}"] if util is not None else [])]


__all__ = ["build_flags", "include_dir", "package_dir", "used_by", "util_include_dir", "version"]
