"""Helpers shared by the sandboxed runners: start-up, the private channel, inputs, timing (stdlib + torch)."""

# mypy: disable-error-code="no-untyped-call,no-any-return"

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, BinaryIO

import turns
import wire
from seeds import forward_seed  # noqa: F401 (the runners' name for it)

# A frozen copy of the clock, taken when this module is first imported (before any candidate code).
_PERF = time.perf_counter


def start(description: str) -> tuple[argparse.Namespace, BinaryIO, BinaryIO]:
    """Parses the runner's arguments, drops privileges, re-arms the parent-death signal, opens the fds."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--job-fd", type=int, required=True)
    parser.add_argument("--result-fd", type=int, required=True)
    # A unix socket beside the result pipe: large tensors go over it as sealed memfds (wire.write_frame).
    parser.add_argument("--share-fd", type=int, default=-1)
    parser.add_argument("--share-min", type=int, default=wire.SHARE_MIN)  # bytes; 0: the pipe only
    parser.add_argument("--uid", type=int, default=-1)
    parser.add_argument("--gid", type=int, default=-1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0)
    # A standby runner that gets no job in this long exits on its own.
    parser.add_argument("--idle-timeout", type=float, default=0.0)
    # The node's turn files of this run's GPU (turns.py): GPU work shared, timing alone.
    parser.add_argument("--turns", default="")
    # The node's GPU slot the verifier holds for this run, lent to it (turns.Turns.lend_slot).
    parser.add_argument("--slot", type=int, default=-1)
    args = parser.parse_args()
    if args.uid >= 0 and os.getuid() == 0:
        os.setgroups([])
        os.setgid(args.gid if args.gid >= 0 else args.uid)
        os.setuid(args.uid)
    rearm_parent_death_signal()
    job = wire.open_fd(args.job_fd, "r")
    # Move the result channel (and the share socket beside it) to unpredictable high fds so code that
    # guesses fd numbers misses them.
    target = _move_fd(args.result_fd, 200, 700)
    out = wire.open_fd(target, "w")
    args.share = None
    if args.share_fd >= 0 and args.share_min <= 0:
        os.close(args.share_fd)
    elif args.share_fd >= 0:
        args.share = socket.socket(fileno=_move_fd(args.share_fd, target + 1, 300))
    fds = turns.parse(args.turns)
    args.turns = turns.Turns(
        (_move_fd(fds[0], 100, 50), _move_fd(fds[1], 150, 50)) if fds is not None else None,
        slot=_move_fd(args.slot, 800, 100) if args.slot >= 0 else None,
    )
    return args, job, out


def _move_fd(fd: int, low: int, span: int) -> int:
    """Moves `fd` to a random free, non-inheritable fd in [low, low + span); returns the new number.

    The target must be free: the numbers the parent passed are its own, any of them may lie in the range,
    and dup2 onto an open descriptor would silently close it (the job channel, a turn file)."""
    # A random start, then every number of the range in turn: a free one is always found where one exists
    # (random picks alone missed the one free number of eight in 1.4 % of runs).
    start = int.from_bytes(os.urandom(2), "big") % span
    for i in range(span):
        target = low + (start + i) % span
        try:
            os.fstat(target)
        except OSError:
            os.dup2(fd, target, inheritable=False)
            os.close(fd)
            return target
    raise RuntimeError(f"no free file descriptor in [{low}, {low + span})")


def rearm_parent_death_signal() -> None:
    """setuid() clears PR_SET_PDEATHSIG; set it again so this process dies with its parent."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def read_job(
    job: BinaryIO, max_payload: int = 64 << 30, idle_timeout: float = 0.0
) -> tuple[dict[str, Any], bytes]:
    if idle_timeout > 0:
        import select

        readable, _, _ = select.select([job.fileno()], [], [], idle_timeout)
        if not readable:
            os._exit(5)
    frames = list(wire.read_frames(job, max_payload))
    job.close()
    if len(frames) != 1:
        raise wire.WireError(f"expected one job frame, got {len(frames)}")
    return frames[0]


def exit_now(out: BinaryIO, code: int) -> None:
    """Flushes the channel and leaves without running atexit handlers or finalizers."""
    try:
        out.flush()
    except (OSError, ValueError):
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def where_in(exc: BaseException, filename: str) -> tuple[int, str]:
    """The last traceback frame inside `filename`: (line, source text) or (0, "")."""
    line, code = 0, ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if os.path.abspath(frame.filename) == os.path.abspath(filename):
            line, code = frame.lineno or 0, (frame.line or "").strip()
    return line, code


def error_line(exc: BaseException, limit: int = 400) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return first[:limit]


def short_traceback(exc: BaseException, roots: tuple[str, ...], limit: int = 8) -> list[str]:
    """Traceback frames that lie under one of `roots` (the candidate's own files), newest last."""
    frames = []
    for frame in traceback.extract_tb(exc.__traceback__):
        path = os.path.abspath(frame.filename)
        if any(path.startswith(r) for r in roots):
            frames.append(f"{os.path.basename(path)}:{frame.lineno}: {(frame.line or '').strip()}")
    return frames[-limit:]


# --- inputs and outputs -------------------------------------------------------------------------


def to_device(items: list[Any], device: str) -> list[Any]:
    import torch

    return [x.to(device).contiguous() if isinstance(x, torch.Tensor) else x for x in items]


def refill(slot: list[Any], items: list[Any]) -> None:
    """Copies new data into the slot's existing tensors: same addresses, different contents."""
    import torch

    with torch.no_grad():
        for dst, src in zip(slot, items, strict=True):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)


def flatten(out: Any) -> list[Any]:
    if isinstance(out, list | tuple):
        flat: list[Any] = []
        for item in out:
            flat.extend(flatten(item))
        return flat
    return [out]


PINNED_MIN = 16 << 20  # device tensors this large are copied through page-locked memory


def to_cpu(outs: list[Any]) -> list[Any]:
    """Host copies of `outs`; a large device tensor lands in page-locked memory (several times the
    copy bandwidth of pageable memory, and the wire sends it from there without another copy)."""
    import torch

    def host(o: Any) -> Any:
        src = o.detach()
        if src.device.type != "cuda" or src.numel() * src.element_size() < PINNED_MIN:
            return src.to("cpu")
        try:
            dst = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        except RuntimeError:  # no page-locked memory left: the pageable copy is only slower
            return src.to("cpu")
        dst.copy_(src.contiguous())
        return dst

    return [host(o) if isinstance(o, torch.Tensor) else o for o in outs]


class HostStage:
    """One host buffer, page-locked where possible, that every output a runner sends is copied into.

    A fresh page-locked block per output (to_cpu) was never handed back by torch's caching host
    allocator on a KernelBench level-1 problem: each 6 GiB output added 6 GiB of locked memory until
    the host's OOM killer ended the run, and each block cost a page-locking pass. Here the buffer is
    allocated once, grown only when an output needs more, and the host tensors returned are views of
    it, valid until the next call (a frame is written before the next output is staged)."""

    ALIGN = 64

    def __init__(self, pinned: bool = True, min_bytes: int = PINNED_MIN) -> None:
        self.pinned = pinned
        # A staged tensor must travel raw: one inside the frame's torch.save skeleton would carry the
        # whole buffer with it.
        self.min_bytes = max(min_bytes, wire.RAW_MIN)
        self.buffer: Any = None

    def _staged(self, o: Any) -> bool:
        import torch

        return (
            isinstance(o, torch.Tensor)
            and (o.device.type == "cuda" or not self.pinned)
            and o.numel() * o.element_size() >= self.min_bytes
        )

    def copies(self, outs: list[Any]) -> list[Any]:
        import torch

        sizes = [
            -(-o.numel() * o.element_size() // self.ALIGN) * self.ALIGN if self._staged(o) else 0
            for o in outs
        ]
        need = sum(sizes)
        if need and (self.buffer is None or self.buffer.numel() < need):
            self.buffer = None  # the old block goes before a larger one is locked
            try:
                self.buffer = torch.empty(need, dtype=torch.uint8, pin_memory=self.pinned)
            except RuntimeError:  # no page-locked memory left: plain copies are only slower
                self.buffer = None
        host: list[Any] = []
        offset = 0
        for o, size in zip(outs, sizes, strict=True):
            if not isinstance(o, torch.Tensor):
                host.append(o)
                continue
            src = o.detach()
            if not size or self.buffer is None:
                host.append(src.to("cpu"))
                continue
            nbytes = src.numel() * src.element_size()
            dst = self.buffer[offset : offset + nbytes].view(src.dtype).view(src.shape)
            dst.copy_(src)
            host.append(dst)
            offset += size
        return host


def same_bits(a: Any, b: Any) -> bool:
    """Bitwise equality of two tensors (NaN equals the same NaN)."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    a8 = a.detach().contiguous().reshape(-1).view(torch.uint8)
    b8 = b.detach().contiguous().reshape(-1).view(torch.uint8)
    return bool(torch.equal(a8, b8))


# --- timing -------------------------------------------------------------------------------------


class Clock:
    """Timer and synchronisation functions captured once, before any untrusted code is imported."""

    def __init__(self, device: str) -> None:
        import torch

        self.cuda = device == "cuda"
        self.perf = _PERF
        self.sync: Callable[[], None] = lambda: None
        self.flush_buffer: Any = None
        if self.cuda:
            raw_sync = getattr(torch._C, "_cuda_synchronize", None)
            self.sync = raw_sync if raw_sync is not None else torch.cuda.synchronize
            self.event_cls = torch.cuda.Event
            self.record = torch.cuda.Event.record
            self.elapsed = torch.cuda.Event.elapsed_time
            self.zero = torch.Tensor.zero_
            # Larger than any L2 (H200: 50 MB); writing it evicts the previous iteration's data.
            self.flush_buffer = torch.empty(64 << 20, dtype=torch.float32, device="cuda")

    def flush(self) -> None:
        if self.flush_buffer is not None:
            self.zero(self.flush_buffer)

    def time_calls(
        self,
        fn: Callable[[int], Any],
        count: int,
        *,
        after: Callable[[int, Any], None] | None = None,
    ) -> tuple[list[float], list[float]]:
        """Runs fn(i) `count` times; returns (device-clock ms, wall-clock ms) per call.

        Each call: flush L2, synchronise the whole device, start both clocks, call, record the end
        event, synchronise the whole device again (so side-stream work is inside the window), stop.
        """
        events: list[tuple[Any, Any]] = []
        if self.cuda:
            events = [
                (self.event_cls(enable_timing=True), self.event_cls(enable_timing=True)) for _ in range(count)
            ]
        device_ms: list[float] = []
        wall_ms: list[float] = []
        perf, sync = self.perf, self.sync
        for i in range(count):
            self.flush()
            sync()
            if self.cuda:
                start_ev, end_ev = events[i]
                self.record(start_ev)
                t0 = perf()
                out = fn(i)
                self.record(end_ev)
                sync()
                t1 = perf()
                device_ms.append(float(self.elapsed(start_ev, end_ev)))
            else:
                t0 = perf()
                out = fn(i)
                t1 = perf()
                device_ms.append((t1 - t0) * 1e3)
            wall_ms.append((t1 - t0) * 1e3)
            if after is not None:
                after(i, out)
            del out
        return device_ms, wall_ms


def stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"median": 0.0, "p10": 0.0, "p90": 0.0, "n": 0}
    ordered = sorted(values)
    n = len(ordered)

    def pick(q: float) -> float:
        return ordered[min(n - 1, max(0, round(q * (n - 1))))]

    mid = ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])
    return {"median": mid, "p10": pick(0.1), "p90": pick(0.9), "n": n, "min": ordered[0]}


def environment(device: str) -> dict[str, Any]:
    import platform

    import torch

    info: dict[str, Any] = {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or "",
        "python_version": platform.python_version(),
        "device_name": platform.processor() or platform.machine(),
        "driver": "",
        "threads": torch.get_num_threads(),
    }
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["device_name"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    if device == "cuda":
        info["device_name"] = torch.cuda.get_device_name(0)
        try:
            with open("/proc/driver/nvidia/version") as fh:
                info["driver"] = fh.readline().strip()[:200]
        except OSError:
            pass
    return info


def now() -> float:
    return _PERF()


def ieee_fp32(torch: Any) -> None:
    """float32 work in IEEE float32, as the reference and the baselines are defined: PyTorch's default lets
    cuDNN run float32 convolutions on TF32 tensor cores (10-bit mantissas), which made the eager baseline
    of a convolution faster than float32 allows and the reference's own error, from which D3's tolerance
    is drawn, TF32-sized. Set before any user code runs, in the reference's and the candidate's runner
    alike (D8 then reports any change the candidate makes)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def seed_all(seed: int) -> None:
    import torch

    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def make_inputs(
    module: Any, spec: dict[str, Any], base: dict[str, list[Any]], where: str = "cpu"
) -> list[Any]:
    """One input set: plain seeded get_inputs(), or a probe derived from it. `where` other than the CPU
    runs get_inputs with that default device (a large set made on the GPU in a fraction of the time;
    the same seed gives the same bits on the same device, so a candidate's runner can make it again)."""
    import torch

    kind = spec["kind"]
    if kind in ("perturb",) and spec.get("base") in base:
        items = [x.clone() if isinstance(x, torch.Tensor) else x for x in base[spec["base"]]]
    else:
        seed_all(spec["seed"])
        if where == "cpu":
            items = list(module.get_inputs())
        else:
            with torch.device(where):
                items = list(module.get_inputs())
        items = [x.detach().to(where).contiguous() if isinstance(x, torch.Tensor) else x for x in items]
    gen = torch.Generator().manual_seed(spec["seed"] & 0x7FFF_FFFF_FFFF_FFFF)
    out: list[Any] = []
    for x in items:
        if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 0):
            out.append(x)
            continue
        if kind == "shift":
            x = x * 3.0 + 0.5
        elif kind == "uniform":
            x = (torch.rand(x.shape, generator=gen, dtype=torch.float32) * 4.0 - 2.0).to(x.device, x.dtype)
        elif kind == "perturb":
            flat = x.reshape(-1)
            n = flat.numel()
            i = int(torch.randint(0, n, (1,), generator=gen))
            flat[i] = flat[i] * -2.0 + 3.0
            seg = max(1, n // 64)
            j = int(torch.randint(0, max(1, n - seg), (1,), generator=gen))
            flat[j : j + seg] = flat[j : j + seg] * 1.5 - 0.25
            x = flat.reshape(x.shape)
        out.append(x.contiguous())
    return out
