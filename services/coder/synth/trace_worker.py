"""Subprocess entry that runs a reference program, traces it with torch.fx and writes the graph as JSON.

Standard library and torch only: it executes user code, so the Coder runs it in its own process
(`python -I trace_worker.py OUT.json < request.json`) and reads nothing back but the JSON file.
The request is {"source": str, "init_source": str | null}; init_source is the ModelNew constructor the
synthesizer wrote, checked here for producing exactly the reference's parameters and buffers.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import math
import operator
import sys
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch.fx.node import Node

if TYPE_CHECKING or __package__:  # imported by the synthesizer (tests that trace in process)
    from stitchcuda.coder.synth.init_check import LARGE_MODEL_BYTES, compare_constructors, state_bytes
    from stitchcuda.coder.synth.shape_trace import is_leaf, specialized_trace, symbolic_trace
else:  # a script in the tracing sandbox, where only this folder is visible
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from init_check import LARGE_MODEL_BYTES, compare_constructors, state_bytes
    from shape_trace import is_leaf, specialized_trace, symbolic_trace

Retrace = Callable[[torch.nn.Module], torch.fx.GraphModule]
MISSING_MODULE_HINTS = {
    "einops": ": it is a dependency of StitchCUDA (pip install einops), or write its rearrange as torch "
    "reshape/permute/flatten calls",
}

SCALAR_TYPES = (bool, int, float, str, type(None))
# Float root-module attributes are perturbed by this factor to find which graph constants they feed.
PERTURB = 1.0 + 1.0 / 1021.0


def qualname(target: Any) -> str:
    """A stable dotted name for an fx call target: torch.relu, torch.nn.functional.gelu, operator.mul, ..."""
    if isinstance(target, str):
        return target
    short = getattr(target, "__name__", None)
    if short:
        for prefix, namespace in (
            ("torch.nn.functional", torch.nn.functional),
            ("torch", torch),
            ("torch.Tensor", torch.Tensor),
            ("math", math),
            ("operator", operator),
            ("builtins", builtins),
        ):
            if getattr(namespace, short, None) is target:
                return f"{prefix}.{short}"
    mod = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or short or repr(target)
    return (mod + "." if mod else "") + name


def encode(value: Any) -> Any:
    if isinstance(value, Node):
        return {"node": value.name}
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return {"float": repr(value)}
        return value
    if isinstance(value, SCALAR_TYPES):
        return value
    if isinstance(value, tuple | list | torch.Size):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {"dict": {str(k): encode(v) for k, v in value.items()}}
    if isinstance(value, slice):
        return {"slice": [encode(value.start), encode(value.stop), encode(value.step)]}
    if value is Ellipsis:
        return {"ellipsis": True}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).replace("torch.", "")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).replace("torch.", "")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.Tensor):
        return {"tensor_literal": list(value.shape)}
    return {"repr": repr(value)[:200]}


def tensor_meta(t: torch.Tensor) -> dict[str, Any]:
    return {
        "kind": "tensor",
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "dtype": str(t.dtype).replace("torch.", ""),
        "contiguous": bool(t.is_contiguous()),
    }


def value_meta(value: Any) -> dict[str, Any]:
    if isinstance(value, torch.Tensor):
        return tensor_meta(value)
    if isinstance(value, torch.Size):
        return {"kind": "shape", "value": list(value)}
    if isinstance(value, bool):
        return {"kind": "bool", "value": value}
    if isinstance(value, int):
        return {"kind": "int", "value": value}
    if isinstance(value, float):
        return {"kind": "float", "value": encode(value)}
    if isinstance(value, tuple | list):
        return {"kind": "list", "items": [value_meta(v) for v in value]}
    if value is None:
        return {"kind": "none"}
    return {"kind": "other", "repr": repr(value)[:200]}


class Recorder(torch.fx.Interpreter):
    """Runs the traced graph and keeps a description of every node's result."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm)
        self.meta: dict[str, dict[str, Any]] = {}

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        self.meta[n.name] = value_meta(result)
        return result


def module_info(mod: torch.nn.Module) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for key, value in vars(mod).items():
        if key.startswith("_"):
            continue
        if isinstance(value, SCALAR_TYPES) or (
            isinstance(value, tuple | list) and all(isinstance(v, SCALAR_TYPES) for v in value)
        ):
            attrs[key] = encode(value)
    params = {name: list(p.shape) for name, p in mod.named_parameters(recurse=False)}
    buffers = {name: list(b.shape) for name, b in mod.named_buffers(recurse=False) if b is not None}
    return {
        "class": type(mod).__name__,
        "module": type(mod).__module__,
        "attrs": attrs,
        "params": params,
        "buffers": buffers,
        "training": bool(mod.training),
    }


def one_known_element(value: Any) -> bool:
    """A tensor of one element whose value is here (not on the meta device), real."""
    if not isinstance(value, torch.Tensor):
        return False
    return value.numel() == 1 and value.device.type != "meta" and not value.is_complex()


def graph_nodes(
    gm: torch.fx.GraphModule, meta: dict[str, dict[str, Any]], state: set[str]
) -> list[dict[str, Any]]:
    """The graph's nodes as data; `state` names the model's own parameters and buffers."""
    nodes = []
    for n in gm.graph.nodes:
        entry: dict[str, Any] = {
            "name": n.name,
            "op": n.op,
            "target": qualname(n.target),
            "args": encode(n.args),
            "kwargs": {k: encode(v) for k, v in n.kwargs.items()},
            "meta": meta.get(n.name, {"kind": "unknown"}),
        }
        if n.op == "call_module":
            entry["module"] = module_info(gm.get_submodule(n.target))
        if n.op == "get_attr":
            path = str(n.target)
            entry["is_parameter"] = any(name == path for name, _ in gm.named_parameters())
            entry["is_buffer"] = any(name == path for name, _ in gm.named_buffers())
            # A tensor torch.fx made of a value the forward built from numbers (`torch.tensor(0.5)`): a
            # graph attribute `_tensor_constantN` (a buffer of the graph module) that the model does not
            # have. One element travels as its value.
            value: Any = getattr(gm, path, None)
            if path not in state and one_known_element(value):
                entry["constant"] = value.item()
        nodes.append(entry)
    return nodes


def _literals(gm: torch.fx.GraphModule, kind: type) -> dict[str, Any]:
    """(node, argument path) -> value of every `kind` literal (bools excluded) in the graph's arguments."""
    found: dict[str, Any] = {}

    def walk(value: Any, path: str) -> None:
        if isinstance(value, kind) and not isinstance(value, bool):
            found[path] = value
        elif isinstance(value, tuple | list):
            for i, v in enumerate(value):
                walk(v, f"{path}.{i}")

    for n in gm.graph.nodes:
        for i, a in enumerate(n.args):
            walk(a, f"{n.name}:args.{i}")
        for k, v in n.kwargs.items():
            walk(v, f"{n.name}:kwargs.{k}")
    return found


def float_constants(gm: torch.fx.GraphModule) -> dict[str, Any]:
    """Every float literal in the graph's arguments (scales, eps...)."""
    return _literals(gm, float)


def int_constants(gm: torch.fx.GraphModule) -> dict[str, Any]:
    """Every int literal in the graph's arguments (shapes, dims...)."""
    return _literals(gm, int)


def probed_modules(model: torch.nn.Module, specialized: bool) -> list[tuple[str, torch.nn.Module]]:
    """The modules whose attributes are changed in turn to see which graph constants they feed.

    A specialised trace runs torch.nn's own modules on fake tensors instead of recording them (re-tracing
    costs a whole fake run): their attributes reach the graph as module information, and the ones that
    size their parameters are checked by the program's shape guards, so only the other modules are probed.
    """
    return [(path, m) for path, m in model.named_modules() if not (specialized and is_leaf(m, path))]


def baked_ints(
    model: torch.nn.Module, gm: torch.fx.GraphModule, retrace: Retrace, specialized: bool
) -> dict[str, int]:
    """Int attributes of the model (self.heads, ...) that the traced forward turned into constants.

    The trace reads them once, so the kernels hold their values: ModelNew refuses to be built with
    other values instead of computing something else. Found by changing each in turn and re-tracing.
    """
    base = int_constants(gm)
    baked: dict[str, int] = {}
    for mod_path, mod in probed_modules(model, specialized):
        for key, value in list(vars(mod).items()):
            if key.startswith("_") or not isinstance(value, int) or isinstance(value, bool):
                continue
            setattr(mod, key, value + 1)
            try:
                moved = int_constants(retrace(model))
            except Exception:
                moved = None  # the forward cannot even be traced with another value: it depends on it
            finally:
                setattr(mod, key, value)
            if moved != base:
                baked[f"{mod_path}.{key}" if mod_path else key] = value
    return baked


def scalar_sources(
    model: torch.nn.Module, base: dict[str, Any], retrace: Retrace, specialized: bool
) -> dict[str, str]:
    """Which float constants of the graph come from float attributes of the model (self.scale, ...).

    Each attribute is perturbed in turn and the model re-traced: the constants that move by exactly
    the same factor are that attribute, so ModelNew can pass it at run time instead of baking it in.
    """
    sources: dict[str, str] = {}
    for mod_path, mod in probed_modules(model, specialized):
        for key, value in list(vars(mod).items()):
            if key.startswith("_") or not isinstance(value, float) or isinstance(value, bool):
                continue
            if value == 0.0 or math.isnan(value) or math.isinf(value):
                continue
            attr = f"{mod_path}.{key}" if mod_path else key
            setattr(mod, key, value * PERTURB)
            try:
                moved = float_constants(retrace(model))
            except Exception:
                moved = {}
            finally:
                setattr(mod, key, value)
            for path, old in base.items():
                new = moved.get(path)
                if old == value and new == value * PERTURB:
                    sources.setdefault(path, attr)
    return sources


def check_init(ns_ref: dict[str, Any], init_source: str) -> dict[str, Any]:
    """Constructs Model and the synthesized ModelNew from the same seed and compares their state."""
    # Module-level constants of the reference are visible to the constructor (the final ModelNew
    # has them inlined as literals).
    ns_new: dict[str, Any] = {"__name__": "model_new_init"}
    ns_new.update({k: v for k, v in ns_ref.items() if k in global_literals(ns_ref)})
    exec(compile(init_source, "model_new_init.py", "exec"), ns_new)
    args = ns_ref["get_init_inputs"]()
    verdict: dict[str, Any] = compare_constructors(
        lambda: ns_ref["Model"](*args), lambda: ns_new["ModelNew"](*args)
    )
    return verdict


def run_shapes(gm: torch.fx.GraphModule, make_inputs: Callable[[], list[Any]]) -> tuple[list[Any], Recorder]:
    """Shapes of every node, from fake tensors (no memory, no FLOPs) or, where that fails, a real run."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            torch.manual_seed(1)
            inputs = list(make_inputs())
            recorder = Recorder(gm)
            with torch.no_grad():
                recorder.run(*inputs)
        return inputs, recorder
    except Exception:
        torch.manual_seed(1)
        inputs = list(make_inputs())
        recorder = Recorder(gm)
        with torch.no_grad():
            recorder.run(*inputs)
        return inputs, recorder


def global_literals(ns: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in ns.items():
        if key.startswith("__") or isinstance(value, types.ModuleType):
            continue
        if isinstance(value, SCALAR_TYPES) or (
            isinstance(value, tuple) and all(isinstance(v, SCALAR_TYPES) for v in value)
        ):
            out[key] = encode(value)
    return out


def input_count(make_inputs: Callable[[], list[Any]]) -> int:
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            return len(make_inputs())
    except Exception:
        return len(make_inputs())


def assigned_state(model: torch.nn.Module) -> list[str]:
    """Module attributes the traced forward assigned a traced value to (`self.hidden = ...`)."""
    return [
        f"{path}.{key}" if path else key
        for path, mod in model.named_modules()
        for key, value in vars(mod).items()
        if isinstance(value, torch.fx.Proxy)
    ]


class KeptStateError(torch.fx.proxy.TraceError):
    """The forward keeps module state from one call to the next: final, whichever way it is traced."""


def plain_tensors(model: torch.nn.Module) -> dict[tuple[str, str], torch.Tensor]:
    """The model's plain tensor attributes, neither parameters nor buffers."""
    return {
        (path, key): value
        for path, mod in model.named_modules()
        for key, value in vars(mod).items()
        if isinstance(value, torch.Tensor)
    }


def split_name(name: str) -> tuple[str, str]:
    """`block.cell.hidden` as (module path, attribute)."""
    path, _, key = name.rpartition(".")
    return path, key


def restoring_state(trace_fn: Retrace) -> Retrace:
    """trace_fn, with the plain tensor attributes the traced forward assigned put back afterwards: a trace
    leaves a Proxy where the forward assigned `self.hidden = ...`, which the next trace must not read."""

    def traced(m: torch.nn.Module) -> torch.fx.GraphModule:
        saved = plain_tensors(m)
        try:
            gm = trace_fn(m)
        finally:
            state = assigned_state(m)
            modules = dict(m.named_modules())
            for name in state:
                path, key = split_name(name)
                if (path, key) in saved:
                    setattr(modules[path], key, saved[(path, key)])
                else:
                    delattr(modules[path], key)
        if state:
            overwrite_state(gm, {name: saved.get(split_name(name)) for name in state})
        return gm

    return traced


def overwrite_state(gm: torch.fx.GraphModule, state: dict[str, torch.Tensor | None]) -> None:
    """Compile a forward that assigns module state only where that state never carries from one call to the
    next: each call either never reads the attribute, or first overwrites all of it in place
    (`self.hidden.copy_(initial_hidden)`, KernelBench's stateful RNN cells), so every later read in the
    call is the overwriting value. The graph's reads become that value (expanded to the attribute's shape
    and cast to its dtype, as copy_ does); any other read is state kept across calls and is refused."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for name, saved in state.items():
        reads = [n for n in order if n.op == "get_attr" and n.target == name]
        if not reads:
            continue  # assigned, never read: the state is written and nothing depends on it
        first = reads[0]
        copy = next(iter(first.users), None)
        overwrites = (
            saved is not None
            and len(first.users) == 1
            and copy is not None
            and copy.op == "call_method"
            and copy.target == "copy_"
            and copy.args[0] is first
            and len(copy.args) >= 2
            and isinstance(copy.args[1], torch.fx.Node)
            and all(order[n] > order[copy] for n in reads[1:])
        )
        if not overwrites:
            raise KeptStateError(
                f"the forward assigns self.{name} and reads it before overwriting it: "
                "state kept from one call to the next is not compiled"
            )
        assert saved is not None and copy is not None
        with gm.graph.inserting_after(copy):
            expanded = gm.graph.call_method("expand", (copy.args[1], *saved.shape))
        with gm.graph.inserting_after(expanded):
            value = gm.graph.call_method("to", (expanded, saved.dtype))
        for n in [copy, *reads[1:]]:
            n.replace_all_uses_with(value)
        for n in [copy, *reads]:
            gm.graph.erase_node(n)
    gm.graph.lint()
    gm.recompile()


def builds_shape_tuples(gm: torch.fx.GraphModule) -> bool:
    """Does the forward build shapes by tuple arithmetic (`(x.shape[0],) + (1,) * (x.ndim - 1)`, timm's
    drop_path)? The program's host code has no tuples: such a forward is traced specialised instead, where
    those shapes are numbers."""
    return any(
        n.op == "call_function"
        and n.target in (operator.add, operator.mul)
        and any(isinstance(a, tuple | list) for a in n.args)
        for n in gm.graph.nodes
    )


def fx_trace(
    model: torch.nn.Module, make_inputs: Callable[[], list[Any]]
) -> tuple[torch.fx.GraphModule, Retrace, bool]:
    """The model's graph, how to trace it again (after changing an attribute), and whether the graph
    is specialised to the inputs' shapes: symbolically where torch.fx can, else for the inputs of
    get_inputs() (a forward that reads its input shapes as numbers, loops over them or branches on them)."""
    count = input_count(make_inputs)

    @restoring_state
    def symbolic(m: torch.nn.Module) -> torch.fx.GraphModule:
        gm: torch.fx.GraphModule = symbolic_trace(m, count)
        return gm

    try:
        gm = symbolic(model)
        if not builds_shape_tuples(gm):
            return gm, symbolic, False
    except KeptStateError:
        raise
    except Exception:
        pass

    @restoring_state
    def retrace(m: torch.nn.Module) -> torch.fx.GraphModule:
        torch.manual_seed(1)
        gm: torch.fx.GraphModule = specialized_trace(m, make_inputs)
        return gm

    return retrace(model), retrace, True


def own_state(model: torch.nn.Module) -> set[str]:
    return {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}


def trace(source: str, init_source: str | None) -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "reference"}
    exec(compile(source, "reference.py", "exec"), ns)
    init_args = ns["get_init_inputs"]()
    # A trace reads shapes only: a large model (and its inputs) is built on the meta device, so
    # tracing takes no memory for its values.
    large = state_bytes(lambda: ns["Model"](*init_args)) > LARGE_MODEL_BYTES
    place: Any = torch.device("meta") if large else contextlib.nullcontext()

    def make_inputs() -> list[Any]:
        with place:
            return list(ns["get_inputs"]())

    torch.manual_seed(0)
    with place:
        model = ns["Model"](*init_args)
    gm, retrace, specialized = fx_trace(model, make_inputs)
    inputs, recorder = run_shapes(gm, make_inputs)
    result: dict[str, Any] = {
        "ok": True,
        "nodes": graph_nodes(gm, recorder.meta, own_state(model)),
        "inputs": [value_meta(x) for x in inputs],
        "init_inputs": encode(list(ns["get_init_inputs"]())),
        "training": bool(model.training),
        "scalar_sources": scalar_sources(model, float_constants(gm), retrace, specialized),
        "baked_ints": baked_ints(model, gm, retrace, specialized),
        "specialized": specialized,
        "globals": global_literals(ns),
        "torch_version": torch.__version__,
    }
    if init_source is not None:
        del model, gm, recorder, inputs  # room for the constructors' real state
        result["init_check"] = check_init(ns, init_source)
    return result


def safe_trace(source: str, init_source: str | None) -> dict[str, Any]:
    """trace(), with a failure described as JSON (the line of the reference that raised) instead of raised."""
    try:
        return trace(source, init_source)
    except Exception as exc:
        tb = traceback.extract_tb(exc.__traceback__)
        where = next((f"line {f.lineno}" for f in reversed(tb) if f.filename == "reference.py"), "")
        return {"ok": False, "error": describe(exc), "where": where}


def describe(exc: Exception) -> str:
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        # Packages are never installed for a reference: say what to do rather than what is missing.
        return (
            f"ModuleNotFoundError: the reference imports {exc.name}, which is not installed where references "
            "run (they may use torch and the standard library)" + MISSING_MODULE_HINTS.get(exc.name, "")
        )
    return f"{type(exc).__name__}: {exc}"


def main() -> None:
    request = json.loads(sys.stdin.read())
    out_path = sys.argv[1]
    torch.set_num_threads(1)
    result = safe_trace(request["source"], request.get("init_source"))
    with open(out_path, "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main()
