"""Marks a Triton candidate's kernel launches as its own work (D6): a profiler range and a call count each.

The candidate's modules hold its kernels as Triton launcher objects (JITFunction, Autotuner, Heuristics,
InterpretedFunction), all launched through `kernel[grid](...)`, which calls the object's `run`. Wrapping
`run` of the outermost object puts every launch (autotuning's benchmark launches included) inside a
range `<token>::triton::<kernel name>`: the accounting counts the kernels launched there, and not inside
an ATen op, as the candidate's own, whatever they are called. Standard library only (triton is never
imported here).
"""

from __future__ import annotations

import types
from typing import Any

# The range of a Triton launch is `<token>::triton::<kernel name>`: no extension function (an identifier)
# can carry this prefix, so only a launch through a real Triton kernel object is named after its kernel.
TRITON_SPAN = "triton::"
KERNEL_TYPES = {"JITFunction", "Autotuner", "Heuristics", "InterpretedFunction"}


def is_kernel(obj: Any) -> bool:
    cls = type(obj)
    return (
        cls.__module__.split(".")[0] == "triton"
        and any(c.__name__ in KERNEL_TYPES for c in cls.__mro__)
        and callable(getattr(obj, "run", None))
    )


def kernel_name(obj: Any) -> str:
    """The jit function's name (the name its compiled kernel carries), under any autotune/heuristics."""
    for _ in range(8):
        if isinstance(obj, types.FunctionType):
            return obj.__name__
        name = obj.__dict__.get("__name__") if hasattr(obj, "__dict__") else None
        if isinstance(name, str):
            return name
        inner = getattr(obj, "fn", None)
        if inner is None:
            break
        obj = inner
    return "triton_kernel"


def wrap_kernels(
    modules: list[types.ModuleType],
    token: str,
    counter: list[int],
    prof_on: list[bool],
    record_function: Any,
) -> list[str]:
    """Wraps the launch of every Triton kernel the candidate's modules define; returns their names."""
    names: list[str] = []
    seen: set[int] = set()
    for module in modules:
        for obj in list(vars(module).values()):
            if id(obj) in seen or not is_kernel(obj):
                continue
            seen.add(id(obj))
            name = kernel_name(obj)
            obj.run = _counted(obj.run, f"{token}::{TRITON_SPAN}{name}", counter, prof_on, record_function)
            names.append(name)
    return names


def _counted(run: Any, label: str, counter: list[int], prof_on: list[bool], record_function: Any) -> Any:
    def launch(*args: Any, **kwargs: Any) -> Any:
        counter[0] += 1
        if prof_on[0]:
            with record_function(label):
                return run(*args, **kwargs)
        return run(*args, **kwargs)

    return launch
