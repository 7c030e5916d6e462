"""Checks in the tracing process that ModelNew's constructor makes exactly Model's state, within the memory
of one model: each model's state is reduced to digests before the other is built, and a model too large
for the memory left is compared on the meta device (names, shapes, dtypes and modes; not its values).

Standard library and torch only: the tracing process loads it next to trace_worker.py.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import os
import resource
from collections.abc import Callable
from typing import Any

import torch

# A model whose state is larger is traced on the meta device (its values are never read by a trace).
LARGE_MODEL_BYTES = 1 << 30
_CHUNK = 1 << 24


def state_bytes(make: Callable[[], torch.nn.Module]) -> int:
    """The size of the state the constructor makes, found by building it on the meta device (0 when the
    constructor cannot run there, e.g. it reads tensor values)."""
    try:
        with torch.device("meta"):
            model = make()
    except Exception:
        return 0
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def memory_budget() -> int:
    """Bytes this process can still allocate: below its address-space limit and the machine's free memory."""
    budgets = []
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        budgets.append(soft - _status_kib("VmSize") * 1024)
    available = _meminfo_kib("MemAvailable")
    if available:
        budgets.append(available * 1024)
    else:
        budgets.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return max(0, min(budgets))


def _status_kib(field: str) -> int:
    return _kib("/proc/self/status", field)


def _meminfo_kib(field: str) -> int:
    return _kib("/proc/meminfo", field)


def _kib(path: str, field: str) -> int:
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _digest(t: torch.Tensor) -> str:
    """A hash of the tensor's bytes, read in chunks (no second copy of a large parameter)."""
    c = t.detach().cpu().contiguous()
    h = hashlib.blake2b(digest_size=16)
    ptr, size = c.data_ptr(), c.numel() * c.element_size()
    for offset in range(0, size, _CHUNK):
        h.update(ctypes.string_at(ptr + offset, min(_CHUNK, size - offset)))
    return h.hexdigest()


def summary(make: Callable[[], torch.nn.Module], values: bool) -> dict[str, Any]:
    """Names, shapes, dtypes (and digests of the values) of a freshly built model's state, and its modes."""
    torch.manual_seed(1234)
    if values:
        model = make()
    else:
        with torch.device("meta"):
            model = make()
    state = {
        key: (list(t.shape), str(t.dtype), _digest(t) if values else "")
        for key, t in model.state_dict().items()
    }
    modes = [m.training for m in model.modules()]
    del model
    gc.collect()
    return {"state": state, "modes": modes}


def compare_constructors(
    make_ref: Callable[[], torch.nn.Module], make_new: Callable[[], torch.nn.Module]
) -> dict[str, Any]:
    """{"ok", "detail", "values"}: whether both constructors, from the same seed, make the same state."""
    # Room for one model and the transient copies its initialisation makes.
    values = 2 * state_bytes(make_ref) < memory_budget()
    ref = summary(make_ref, values)
    new = summary(make_new, values)
    result: dict[str, Any] = {"ok": True, "detail": "", "values": values}
    if list(ref["state"]) != list(new["state"]):
        return result | {
            "ok": False,
            "detail": f"state keys differ: {list(ref['state'])} vs {list(new['state'])}",
        }
    for key, value in ref["state"].items():
        if value != new["state"][key]:
            return result | {"ok": False, "detail": f"{key} differs between Model and ModelNew"}
    if ref["modes"] != new["modes"]:
        return result | {"ok": False, "detail": "train/eval modes differ between Model and ModelNew"}
    return result
