"""Builds a synthesized CPU program with the real compiler into the tests' shared build cache, and pairs it
with its reference built from the same seed."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

BUILD_ROOT = Path(os.environ.get("STITCH_TEST_BUILD_DIR", Path.home() / ".cache" / "stitchcuda-tests"))


def load_program(synthesis: Any) -> dict[str, Any]:
    """Writes `synthesis`'s files (only those that changed, so a cached build stays valid), builds and
    imports its extension, and returns the namespace of its model_new.py."""
    from torch.utils.cpp_extension import load

    name = synthesis.build.extension_name
    root = BUILD_ROOT / name
    root.mkdir(parents=True, exist_ok=True)
    for path, content in synthesis.files.items():
        target = root / path
        if not target.exists() or target.read_text() != content:
            target.write_text(content)
    sys.modules[name] = load(
        name=name,
        sources=[str(root / s) for s in synthesis.build.sources],
        extra_cflags=list(synthesis.build.cflags),
        extra_ldflags=list(synthesis.build.ldflags),
        build_directory=str(root),
    )
    mn: dict[str, Any] = {"__name__": "model_new"}
    exec(compile(synthesis.files["model_new.py"], "model_new.py", "exec"), mn)
    return mn


def seeded_pair(source: str, mn: dict[str, Any], *init: Any) -> tuple[Any, Any]:
    """The reference's Model and the program's ModelNew, each built after the same seed (same weights)."""
    ns: dict[str, Any] = {"__name__": "reference"}
    exec(compile(source, "reference.py", "exec"), ns)
    torch.manual_seed(0)
    ref = ns["Model"](*init)
    torch.manual_seed(0)
    return ref, mn["ModelNew"](*init)
