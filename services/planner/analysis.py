"""Typed, validated views of what the harness reports (its JSON is untrusted: the reference ran there)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class TensorInfo(_Model):
    name: str
    shape: list[int] = Field(default_factory=list)
    dtype: str = ""
    layout: str = "contiguous"
    bytes: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def is_tensor(self) -> bool:
        return self.layout != "scalar"


class TargetRef(_Model):
    module: str = ""
    name: str = ""


class ModuleInfo(_Model):
    class_: str = Field(alias="class")
    params: list[TensorInfo] = Field(default_factory=list)
    constants: dict[str, str] = Field(default_factory=dict)


class NodeInfo(_Model):
    name: str
    op: str
    target: TargetRef
    args: list[str] = Field(default_factory=list)
    kwargs: dict[str, str] = Field(default_factory=dict)
    inputs: list[str] = Field(default_factory=list)
    users: list[str] = Field(default_factory=list)
    outputs: list[TensorInfo] = Field(default_factory=list)
    counted_flops: float = 0.0
    aten: list[str] = Field(default_factory=list)
    line: int | None = None
    module: ModuleInfo | None = None


class FailureInfo(_Model):
    stage: str
    line: int | None = None
    type: str = ""
    message: str = ""


class Analysis(_Model):
    ok: bool
    error: FailureInfo | None = None
    internal_error: str = ""
    materialized: str = "meta"
    capture: str = "none"
    capture_error: str = ""
    warnings: list[str] = Field(default_factory=list)
    inputs: list[TensorInfo] = Field(default_factory=list)
    outputs: list[TensorInfo] = Field(default_factory=list)
    parameters: list[TensorInfo] = Field(default_factory=list)
    input_bytes: int = 0
    parameter_bytes: int = 0
    fits: bool = False
    nodes: list[NodeInfo] = Field(default_factory=list)
    eager_flops: float = 0.0
    eager_aten: dict[str, int] = Field(default_factory=dict)
    torch_version: str = ""
    peak_rss_bytes: int = 0


class Timing(_Model):
    median: float
    min: float = 0.0
    max: float = 0.0


class KernelTime(_Model):
    name: str
    ms: float
    calls: float = 0.0


class RunResult(_Model):
    ok: bool
    error: FailureInfo | None = None
    internal_error: str = ""
    warnings: list[str] = Field(default_factory=list)
    device_name: str = ""
    eager_flops: float | None = None
    eager_ms: Timing | None = None
    node_ms: dict[str, float] = Field(default_factory=dict)
    kernels: list[KernelTime] = Field(default_factory=list)
    profiler: str = ""
    peak_rss_bytes: int = 0


class CompileResult(_Model):
    ok: bool
    error: Any = None
    internal_error: str = ""
    compile_s: float = 0.0
    compile_ms: Timing | None = None


class EagerResult(_Model):
    ok: bool
    error: Any = None
    internal_error: str = ""
    iters: int = 0
