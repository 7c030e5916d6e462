"""Runs an untrusted reference in its own process: meta-device analysis, then a real run and a profile.

Standard library and torch only. The Planner executes this file by path (``python -I harness.py
REQUEST.json``) in a private work directory and reads the JSON files it writes there:
``analysis.json`` (graph, shapes, FLOPs; written as soon as the analysis is done), ``run.json`` (a real
forward on the device and its profile) or ``compile.json`` (torch.compile timing), and ``stage`` (the
phase in progress, so a timeout can say where it happened).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import resource
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

RANGE_PREFIX = "stitch::"
SKIPPED_MODULES = frozenset({"_guards_fn"})  # torch.export's guard check: no computation
_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


class ReferenceFailure(Exception):
    """The reference raised at a stage; carries the stage and the line of the reference that failed."""

    def __init__(self, stage: str, exc: BaseException, line: int | None) -> None:
        super().__init__(f"{stage}: {type(exc).__name__}: {exc}")
        self.info = {"stage": stage, "line": line, "type": type(exc).__name__, "message": first_line(exc)}
        self.exc = exc


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:300]


class Context:
    """The request, the reference's path and where results go."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request
        self.reference = str(Path(request["reference"]).resolve())
        self.out = Path(request["out_dir"])
        self.times: dict[str, float] = {}
        self._current = ("start", time.perf_counter())

    def stage(self, name: str) -> None:
        prev, since = self._current
        now = time.perf_counter()
        self.times[prev] = self.times.get(prev, 0.0) + now - since
        self._current = (name, now)
        (self.out / "stage").write_text(name)

    def write(self, name: str, payload: dict[str, Any]) -> None:
        payload["peak_rss_bytes"] = peak_rss_bytes()
        self.stage(self._current[0])
        payload["stage_seconds"] = {k: round(v, 4) for k, v in self.times.items()}
        tmp = self.out / f".{name}.tmp"
        tmp.write_text(json.dumps(payload, default=str))
        tmp.replace(self.out / name)  # atomic: the parent never reads half a file

    def line_of(self, exc: BaseException) -> int | None:
        """The last line of the reference in the exception's traceback."""
        line = None
        if (
            isinstance(exc, SyntaxError)
            and exc.filename
            and Path(exc.filename).resolve() == Path(self.reference)
        ):
            line = exc.lineno
        for frame in traceback.extract_tb(exc.__traceback__):
            if frame.filename == self.reference:
                line = frame.lineno
        return line

    def line_of_trace(self, stack_trace: str | None) -> int | None:
        lines = [int(m["line"]) for m in _LINE.finditer(stack_trace or "") if m["file"] == self.reference]
        return lines[-1] if lines else None

    def call(self, stage: str, fn: Callable[[], Any]) -> Any:
        self.stage(stage)
        try:
            return fn()
        except (Exception, SystemExit) as exc:
            raise ReferenceFailure(stage, exc, self.line_of(exc)) from exc


def peak_rss_bytes() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class PinDevice(TorchFunctionMode):
    """Sends every tensor the reference creates to one device: device= arguments, .cuda(), .to(device)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.cuda, torch.Tensor.cpu):
            return args[0].to(self.device)
        if func is torch.Tensor.to:
            args = tuple(self.device if isinstance(a, str | torch.device) else a for a in args)
        if kwargs.get("device") is not None:
            kwargs["device"] = self.device
        return func(*args, **kwargs)


class Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records the ATen ops dispatched inside it, in first-seen order, with counts."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: dict[str, int] = {}

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        name = f"aten.{func.overloadpacket.__name__}"
        self.ops[name] = self.ops.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


# ---------------------------------------------------------------------------------------------- tensors
def layout_of(t: torch.Tensor) -> str:
    if t.is_contiguous():
        return "contiguous"
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
        return "channels_last_3d"
    return "strided"


def spec(name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, torch.Tensor):
        return {
            "name": name,
            "shape": list(value.shape),
            "dtype": str(value.dtype).removeprefix("torch."),
            "layout": layout_of(value),
            "bytes": value.numel() * value.element_size(),
        }
    return {
        "name": name,
        "shape": [],
        "dtype": f"python:{type(value).__name__}",
        "layout": "scalar",
        "bytes": 0,
    }


def flatten(name: str, value: Any) -> list[dict[str, Any]]:
    """Specs of every tensor in a (nested) value; a non-tensor leaf gives one scalar spec."""
    if isinstance(value, tuple | list):
        return [s for i, v in enumerate(value) for s in flatten(f"{name}[{i}]", v)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in flatten(f"{name}[{k!r}]", v)]
    return [spec(name, value)]


def tensor_bytes(values: Iterator[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in values)


def fmt(value: Any) -> str:
    """An fx argument as text: node names, constants, nested lists."""
    if isinstance(value, torch.fx.Node):
        return value.name
    if isinstance(value, tuple | list):
        inner = ", ".join(fmt(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {fmt(v)}" for k, v in value.items()) + "}"
    if isinstance(value, slice):
        return f"slice({fmt(value.start)}, {fmt(value.stop)}, {fmt(value.step)})"
    if isinstance(value, torch.dtype | torch.device | torch.memory_format | torch.layout):
        return str(value)
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


# ---------------------------------------------------------------------------------------------- loading
def import_reference(ctx: Context) -> Any:
    ctx.stage("import")
    spec_ = importlib.util.spec_from_file_location("stitch_reference", ctx.reference)
    if spec_ is None or spec_.loader is None:
        raise ReferenceFailure("import", ImportError(f"cannot load {ctx.reference}"), None)
    module = importlib.util.module_from_spec(spec_)
    sys.modules["stitch_reference"] = module
    try:
        spec_.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        raise ReferenceFailure("import", exc, ctx.line_of(exc)) from exc
    missing = [
        n for n in ("Model", "get_inputs", "get_init_inputs") if not callable(getattr(module, n, None))
    ]
    if missing:
        raise ReferenceFailure(
            "definitions", NameError(f"the reference does not define {', '.join(missing)}"), None
        )
    return module


def build(ctx: Context, module: Any, device: str) -> tuple[torch.nn.Module, list[Any]]:
    """Model(*get_init_inputs()) and get_inputs(), every tensor created directly on `device`."""
    torch.manual_seed(int(ctx.request.get("seed", 0)))
    dev = torch.device(device)
    with torch.device(dev), PinDevice(dev):
        init = ctx.call("init_inputs", lambda: list(module.get_init_inputs()))
        model = ctx.call("model", lambda: module.Model(*init))
        inputs = ctx.call("inputs", lambda: list(module.get_inputs()))
    if not isinstance(model, torch.nn.Module):
        raise ReferenceFailure("model", TypeError(f"Model(...) returned {type(model).__name__}"), None)
    return model, inputs


def meta_specific(exc: BaseException) -> bool:
    """Errors that come from the meta device itself (no kernel, data needed), not from the reference."""
    text = f"{type(exc).__name__} {exc}".lower()
    return isinstance(exc, NotImplementedError) or any(
        word in text for word in ("meta", "data-dependent", "data dependent", "item()", "fake", "guard")
    )


# ---------------------------------------------------------------------------------------------- capture
def capture(ctx: Context, model: torch.nn.Module, inputs: list[Any]) -> tuple[Any, str, str]:
    """(graph module, "fx" | "export" | "none", why the earlier methods failed)."""
    errors = []
    ctx.stage("capture.fx")
    try:
        tracer = torch.fx.Tracer()
        tracer.record_stack_traces = True
        graph = tracer.trace(model)
        return torch.fx.GraphModule(tracer.root, graph), "fx", ""
    except Exception as exc:
        errors.append(f"fx: {at_line(ctx, exc)}{type(exc).__name__}: {first_line(exc)}")
    ctx.stage("capture.export")
    try:
        exported = torch.export.export(model, tuple(inputs))
        return exported.module(), "export", "; ".join(errors)
    except Exception as exc:
        errors.append(f"export: {at_line(ctx, exc)}{type(exc).__name__}: {first_line(exc)}")
    return None, "none", "; ".join(errors)


def at_line(ctx: Context, exc: BaseException) -> str:
    line = ctx.line_of(exc)
    return f"line {line}: " if line else ""


def target_ref(node: torch.fx.Node) -> dict[str, str]:
    target = node.target
    if node.op != "call_function":
        return {"module": "", "name": str(target)}
    if isinstance(target, torch._ops.OpOverload):
        return {"module": "aten", "name": target.overloadpacket.__name__}
    if isinstance(target, torch._ops.OpOverloadPacket):
        return {"module": "aten", "name": target.__name__}
    return {
        "module": str(getattr(target, "__module__", "") or ""),
        "name": getattr(target, "__name__", str(target)),
    }


def module_info(model: torch.nn.Module, path: str) -> dict[str, Any]:
    sub = model.get_submodule(path)
    tensors = [*sub.named_parameters(), *sub.named_buffers()]
    constants: dict[str, str] = {}
    for name in getattr(type(sub), "__constants__", []):
        if hasattr(sub, name):
            constants[name] = fmt(getattr(sub, name))
    if "bias" not in constants and hasattr(sub, "bias"):
        constants["bias"] = str(isinstance(sub.bias, torch.Tensor))
    constants["training"] = str(sub.training)
    return {
        "class": type(sub).__name__,
        "params": [spec(f"{path}.{name}", t) for name, t in tensors],
        "constants": constants,
    }


class Probe(torch.fx.Interpreter):
    """Runs the graph once, recording each node's output specs, counted FLOPs and ATen ops."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.specs: dict[str, list[dict[str, Any]]] = {}
        self.flops: dict[str, int] = {}
        self.aten: dict[str, list[str]] = {}
        self.failed: torch.fx.Node | None = None

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op == "call_module" and n.target in SKIPPED_MODULES:
            return None
        if n.op in ("placeholder", "get_attr", "output"):
            out = super().run_node(n)
        else:
            try:
                with FlopCounterMode(display=False) as counter, Recorder() as recorder:
                    out = super().run_node(n)
            except Exception:
                self.failed = n
                raise
            self.flops[n.name] = int(counter.get_total_flops())
            self.aten[n.name] = list(recorder.ops)
        if n.op != "output":
            self.specs[n.name] = flatten(n.name, out)
        return out


def describe(ctx: Context, gm: torch.fx.GraphModule, probe: Probe) -> list[dict[str, Any]]:
    nodes = []
    for n in gm.graph.nodes:
        if n.op == "call_module" and n.target in SKIPPED_MODULES:
            continue
        info: dict[str, Any] = {
            "name": n.name,
            "op": n.op,
            "target": target_ref(n),
            "args": [fmt(a) for a in n.args],
            "kwargs": {k: fmt(v) for k, v in n.kwargs.items()},
            "inputs": [m.name for m in n.all_input_nodes],
            "users": [u.name for u in n.users if not (u.op == "call_module" and u.target in SKIPPED_MODULES)],
            "outputs": probe.specs.get(n.name, []),
            "counted_flops": probe.flops.get(n.name, 0),
            "aten": probe.aten.get(n.name, []),
            "line": ctx.line_of_trace(n.stack_trace),
        }
        if n.op == "call_module":
            info["module"] = module_info(gm, str(n.target))
        nodes.append(info)
    return nodes


def probe_graph(ctx: Context, gm: torch.fx.GraphModule, inputs: list[Any]) -> list[dict[str, Any]]:
    ctx.stage("analysis")
    probe = Probe(gm)
    try:
        with torch.no_grad():
            probe.run(*inputs)
    except Exception as exc:
        line = ctx.line_of_trace(probe.failed.stack_trace) if probe.failed is not None else None
        raise ReferenceFailure("forward", exc, line or ctx.line_of(exc)) from exc
    return describe(ctx, gm, probe)


def eager_counts(ctx: Context, model: torch.nn.Module, inputs: list[Any]) -> tuple[int, dict[str, int], Any]:
    """FLOPs and the ATen-op histogram of one eager forward (for references no capture could trace)."""
    ctx.stage("forward")
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter, Recorder() as recorder:
            out = model(*inputs)
    except Exception as exc:
        raise ReferenceFailure("forward", exc, ctx.line_of(exc)) from exc
    return int(counter.get_total_flops()), dict(recorder.ops), out


# ---------------------------------------------------------------------------------------------- analysis
def input_names(model: torch.nn.Module, gm: Any, count: int) -> list[str]:
    if gm is not None:
        names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        if len(names) == count:
            return names
    try:
        params = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"input{i}" for i in range(count)]


def analyse(ctx: Context, module: Any) -> dict[str, Any]:
    """Graph, shapes and FLOPs on the meta device; real CPU tensors only where meta cannot do it and
    the problem is small enough. A failure on real tensors is the reference's own failure."""
    warnings: list[str] = []
    try:
        model, inputs = build(ctx, module, "meta")
        materialized = "meta"
    except ReferenceFailure as failure:
        warnings.append(
            f"the reference cannot be built on the meta device ({failure.info['type']}: "
            f"{failure.info['message']}); it was analysed on real CPU tensors"
        )
        model, inputs = build(ctx, module, "cpu")
        materialized = "cpu"
    in_bytes = tensor_bytes(t for t in inputs if isinstance(t, torch.Tensor))
    param_bytes = tensor_bytes(t for t in [*model.parameters(), *model.buffers()])
    fits = in_bytes + param_bytes <= int(ctx.request["max_real_bytes"])

    def to_cpu(reason: ReferenceFailure) -> None:
        nonlocal model, inputs, materialized
        warnings.append(
            f"meta-device analysis failed ({reason.info['type']}: {reason.info['message']}); "
            "analysed on real CPU tensors"
        )
        model, inputs = build(ctx, module, "cpu")
        materialized = "cpu"

    gm, method, capture_error = capture(ctx, model, inputs)
    nodes: list[dict[str, Any]] = []
    if gm is not None:
        try:
            nodes = probe_graph(ctx, gm, inputs)
        except ReferenceFailure as failure:
            if materialized == "meta" and not fits and not meta_specific(failure.exc):
                raise  # a shape error on meta is a shape error on the device too
            if materialized == "meta" and fits:
                to_cpu(failure)
                gm, method, capture_error = capture(ctx, model, inputs)
                if gm is not None:
                    try:
                        nodes = probe_graph(ctx, gm, inputs)
                    except ReferenceFailure as real_failure:
                        failure = real_failure
            if not nodes:
                warnings.append(f"the captured graph could not be analysed: {failure.info['message']}")
                gm, method = None, "none"
    eager_flops: int = 0
    eager_aten: dict[str, int] = {}
    out: Any = None
    if gm is None:
        try:
            eager_flops, eager_aten, out = eager_counts(ctx, model, inputs)
        except ReferenceFailure as failure:
            if materialized == "meta" and fits:
                to_cpu(failure)
                eager_flops, eager_aten, out = eager_counts(ctx, model, inputs)
            elif materialized == "meta" and meta_specific(failure.exc):
                warnings.append(f"the forward cannot run on the meta device: {failure.info['message']}")
            else:
                raise
    if nodes:
        specs = {n["name"]: n["outputs"] for n in nodes}
        out_node = next(n for n in nodes if n["op"] == "output")
        outputs = [s for name in out_node["inputs"] for s in specs.get(name, [])]
    else:
        outputs = flatten("output", out) if out is not None else []
    names = input_names(model, gm, len(inputs))
    return {
        "ok": True,
        "materialized": materialized,
        "capture": method,
        "capture_error": capture_error,
        "warnings": warnings,
        "inputs": [s for name, value in zip(names, inputs, strict=True) for s in flatten(name, value)],
        "outputs": outputs,
        "parameters": [spec(n, t) for n, t in [*model.named_parameters(), *model.named_buffers()]],
        "input_bytes": in_bytes,
        "parameter_bytes": param_bytes,
        "fits": fits,
        "nodes": nodes,
        "eager_flops": eager_flops,
        "eager_aten": eager_aten,
        "torch_version": torch.__version__,
    }


# ---------------------------------------------------------------------------------------------- running
def synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def time_ms(fn: Callable[[], Any], warmup: int, iters: int, sync: Callable[[], None]) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        sync()
        samples.append((time.perf_counter() - start) * 1e3)
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples)}


class Ranges(torch.fx.Interpreter):
    """Runs the graph with a profiler range around every node, so op times map to fx node names."""

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op in ("placeholder", "get_attr", "output") or (
            n.op == "call_module" and n.target in SKIPPED_MODULES
        ):
            return None if n.op == "call_module" else super().run_node(n)
        with torch.profiler.record_function(RANGE_PREFIX + n.name):
            return super().run_node(n)


def profile_ops(
    model: torch.nn.Module, inputs: list[Any], gm: Any, device: torch.device, iters: int
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Per-node times (ms per forward) and the top kernels (CUDA) or ATen ops (CPU)."""
    cuda = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    sync = synchronizer(device)

    def run() -> Any:
        return Ranges(gm).run(*inputs) if gm is not None else model(*inputs)

    run()
    sync()
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(iters):
            run()
        sync()
    node_us: dict[str, float] = {}
    device_us: dict[str, float] = {}
    kernels: dict[str, list[float]] = {}
    for evt in prof.events():
        name = str(evt.name)
        on_device = str(evt.device_type).rsplit(".", 1)[-1] != "CPU"
        if name.startswith(RANGE_PREFIX):
            key = name[len(RANGE_PREFIX) :]
            if on_device:  # the GPU-side span of the range (kineto's gpu_user_annotation)
                device_us[key] = device_us.get(key, 0.0) + float(evt.device_time_total or 0.0)
            else:
                total = float(evt.device_time_total if cuda else evt.cpu_time_total)
                node_us[key] = node_us.get(key, 0.0) + total
        elif (
            on_device if cuda else evt.cpu_parent is None or str(evt.cpu_parent.name).startswith(RANGE_PREFIX)
        ):
            us = float(evt.device_time_total if cuda else evt.cpu_time_total)
            slot = kernels.setdefault(name, [0.0, 0.0])
            slot[0] += us
            slot[1] += 1
    if cuda and device_us and not any(node_us.values()):
        node_us = device_us
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:20]
    return (
        {k: v / 1e3 / iters for k, v in node_us.items()},
        [{"name": k, "ms": v[0] / 1e3 / iters, "calls": v[1] / iters} for k, v in top],
    )


def run_phase(ctx: Context, module: Any, analysis: dict[str, Any]) -> dict[str, Any]:
    req = ctx.request
    device = torch.device(req["device"])
    model, inputs = build(ctx, module, req["device"])
    sync = synchronizer(device)

    def forward() -> Any:
        with torch.no_grad():
            return model(*inputs)

    ctx.call("run.forward", forward)
    sync()
    result: dict[str, Any] = {"ok": True, "warnings": [], "device_name": device_name(device)}
    if analysis["capture"] == "none" and not analysis["eager_flops"]:
        result["eager_flops"] = eager_counts(ctx, model, inputs)[0]
    if not req.get("profile"):
        return result
    ctx.stage("profile.eager")
    result["eager_ms"] = time_ms(forward, int(req["warmup"]), int(req["iters"]), sync)
    ctx.stage("profile.ops")
    gm = None
    if analysis["capture"] == "fx":
        gm = torch.fx.symbolic_trace(model)
    elif analysis["capture"] == "export":
        gm = torch.export.export(model, tuple(inputs)).module()
    with torch.no_grad():
        try:
            result["node_ms"], result["kernels"] = profile_ops(
                model, inputs, gm, device, int(req["op_iters"])
            )
        except Exception as exc:  # the profile is advisory: a failing profiler must not lose the plan
            result["warnings"].append(f"per-op profile failed: {type(exc).__name__}: {first_line(exc)}")
    result["profiler"] = f"torch.profiler ({device.type})"
    return result


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    return f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"


def compile_phase(ctx: Context, module: Any) -> dict[str, Any]:
    req = ctx.request
    device = torch.device(req["device"])
    model, inputs = build(ctx, module, req["device"])
    sync = synchronizer(device)
    ctx.stage("compile")
    try:
        compiled = torch.compile(model)
        start = time.perf_counter()
        with torch.no_grad():
            compiled(*inputs)
        sync()
        seconds = time.perf_counter() - start

        def forward() -> Any:
            with torch.no_grad():
                return compiled(*inputs)

        timing = time_ms(forward, int(req["warmup"]), int(req["iters"]), sync)
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {first_line(exc)}"}
    return {"ok": True, "compile_s": seconds, "compile_ms": timing}


def eager_phase(ctx: Context, module: Any) -> dict[str, Any]:
    """Warm-up and a bare loop of forwards: what an external profiler (nsys) records."""
    req = ctx.request
    device = torch.device(req["device"])
    model, inputs = build(ctx, module, req["device"])

    def forward() -> Any:
        with torch.no_grad():
            return model(*inputs)

    ctx.stage("eager")
    time_ms(forward, int(req["warmup"]), int(req["iters"]), synchronizer(device))
    return {"ok": True, "iters": int(req["iters"])}


def result_name(ctx: Context, mode: str) -> str:
    if mode in ("compile", "eager"):
        return f"{mode}.json"
    return "run.json" if (ctx.out / "analysis.json").exists() else "analysis.json"


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[1]).read_text())
    ctx = Context(request)
    mode = request.get("mode", "plan")
    try:
        module = import_reference(ctx)
        if mode in ("compile", "eager"):
            phase = compile_phase if mode == "compile" else eager_phase
            ctx.write(f"{mode}.json", phase(ctx, module))
            ctx.stage("done")
            return 0
        analysis = analyse(ctx, module)
        ctx.write("analysis.json", analysis)
        if request.get("run") and analysis["fits"]:
            ctx.write("run.json", run_phase(ctx, module, analysis))
    except ReferenceFailure as failure:
        ctx.write(result_name(ctx, mode), {"ok": False, "error": failure.info})
    except Exception:  # a harness defect: report it, the Planner falls back to a plan of last resort
        ctx.write(result_name(ctx, mode), {"ok": False, "internal_error": traceback.format_exc()[-2000:]})
    ctx.stage("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
