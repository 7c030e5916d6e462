"""Helpers for the D11 static-scan tests: build a candidate from snippets and scan it."""

from __future__ import annotations

import textwrap
from collections.abc import Callable

import pytest

from stitchcuda.api.v1 import code_pb2, verify_pb2
from stitchcuda.verifier.static import scan

REF_GEMM = """
import torch
import torch.nn as nn

M, K, N = 256, 512, 256


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(M, K)]


def get_init_inputs():
    return [K, N]
"""

HEADER = """
import torch
import torch.nn as nn
import kit as ext
"""


class Scan:
    """scan() over one model_new.py (and optional sources) with the GEMM reference."""

    def __init__(
        self,
        src: str,
        sources: dict[str, str] | None = None,
        allowed: tuple[str, ...] = (),
        reference: str = REF_GEMM,
        header: bool = True,
    ) -> None:
        body = textwrap.dedent(src)
        text = (HEADER + body) if header else body
        files = [code_pb2.SourceFile(path="model_new.py", content=text)]
        for path, content in (sources or {}).items():
            files.append(code_pb2.SourceFile(path=path, content=textwrap.dedent(content)))
        backend = "cuda" if any(p.endswith(".cu") for p in (sources or {})) else "cpu"
        cand = code_pb2.Candidate(
            files=files,
            build=code_pb2.BuildManifest(extension_name="kit", sources=list(sources or {}), backend=backend),
            entry="model_new.py",
        )
        self.findings = scan(cand, reference, allowed)

    def rules(self, severity: int | None = None) -> set[str]:
        return {f.rule for f in self.findings if severity is None or f.severity == severity}

    @property
    def rejects(self) -> set[str]:
        return self.rules(verify_pb2.SEVERITY_REJECT)

    @property
    def warnings(self) -> set[str]:
        return self.rules(verify_pb2.SEVERITY_WARNING)

    def where(self, rule: str) -> list[str]:
        return [f.where for f in self.findings if f.rule == rule]

    def __repr__(self) -> str:
        return "\n".join(f"{f.severity} {f.rule} {f.where}: {f.detail}" for f in self.findings)


@pytest.fixture
def run_scan() -> Callable[..., Scan]:
    return Scan


def module(forward_body: str, init_body: str = "pass", extra: str = "", signature: str = "self, x") -> str:
    """A model_new.py with the given forward body (indented 8 spaces inside ModelNew)."""
    fwd = textwrap.indent(textwrap.dedent(forward_body).strip(), " " * 8)
    init = textwrap.indent(textwrap.dedent(init_body).strip(), " " * 8)
    return (
        textwrap.dedent(extra)
        + "\n\nclass ModelNew(nn.Module):\n"
        + "    def __init__(self, in_features=512, out_features=256):\n"
        + "        super().__init__()\n"
        + "        self.dims = (in_features, out_features)\n"
        + init
        + "\n\n"
        + f"    def forward({signature}):\n"
        + fwd
        + "\n"
    )
