"""Framing of the private channel between the Verifier and its sandboxed runners (stdlib + torch only).

A frame is MAGIC, two big-endian u64 lengths, a JSON header and an opaque payload (nothing, or a packed
object). Readers bound every length so a hostile writer cannot make them allocate without limit, and
skeletons are loaded with weights_only=True so they cannot run code in the reader.

A packed object (`dumps`) is its skeleton (a torch.save blob in which every tensor of RAW_MIN bytes or
more is a placeholder) followed by those tensors' raw bytes. The raw bytes go from the writer's tensor
memory to the pipe and from the pipe into the reader's tensor memory without a copy in between: a
KernelBench output of several GiB costs one pass each way, not the five of pickling, joining and
unpickling it (the stage that dominated a large problem's time to verdict).

A writer given a share channel (a unix socket beside the pipe) sends a tensor of SHARE_MIN bytes or more
as sealed memory files instead: it copies the bytes into memfds (pieces within its file-size limit),
seals them against writing, shrinking and growing, and passes the fds over the socket before the frame;
the frame's table marks the entry `shared`. The reader takes the fds, checks the seals (only then can the
writer no longer change the bytes) and maps the pieces copy-on-write into one contiguous range: the bytes
cross no pipe at all. A 2 GiB output went through the pipe at about 1 GB/s; the writer's copy into the
memfd runs at memory speed and the reader's map is free.
"""

from __future__ import annotations

import ctypes
import fcntl
import io
import json
import mmap
import os
import resource
import socket
import struct
import weakref
from collections.abc import Iterator
from typing import Any, BinaryIO

MAGIC = b"SCV1"
_LENGTHS = struct.Struct(">QQ")
MAX_HEADER = 16 << 20
PACKED = b"SCP1"  # a payload that is a packed object
_PACK_LENGTHS = struct.Struct(">QQ")  # table and skeleton lengths
RAW_MIN = 1 << 16  # tensors this large travel as raw bytes
_SLICE = 1 << 22  # bytes per write/read call
_MARK = "__wire_tensor__"
SHARE_MIN = 16 << 20  # tensors this large travel as sealed memfds where the writer has a share channel
SHARE_PIECE = 1 << 30  # bytes per memfd at most (less where the writer's file-size limit is lower)
MAX_PIECES = 64  # memfds per tensor
SHARE_WAIT_S = 30.0  # a reader waits this long for fds the frame says were sent before it
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


class WireError(Exception):
    """The peer wrote something that is not a well-formed frame."""


class Packed:
    """A packed object: its skeleton blob, the table of its raw tensors and the tensors themselves
    (contiguous CPU tensors; on the reading side, views of the buffers the bytes were read into)."""

    __slots__ = ("skeleton", "table", "tensors")

    def __init__(self, skeleton: bytes, table: list[dict[str, Any]], tensors: list[Any]) -> None:
        self.skeleton = skeleton
        self.table = table
        self.tensors = tensors

    def prefix(self) -> bytes:
        table = json.dumps(self.table, separators=(",", ":")).encode()
        return PACKED + _PACK_LENGTHS.pack(len(table), len(self.skeleton)) + table + self.skeleton

    def __len__(self) -> int:
        """The frame body's length: shared tensors are not in it."""
        return len(self.prefix()) + sum(int(t["nbytes"]) for t in self.table if not t.get("shared"))

    def shared_over(self, channel: socket.socket, min_bytes: int = SHARE_MIN) -> Packed:
        """This object with each tensor of `min_bytes` or more sent over `channel` as sealed memfds now
        (before the frame that names them); a tensor that cannot be shared stays raw."""
        table = []
        for t, entry in zip(self.tensors, self.table, strict=True):
            nbytes = int(entry["nbytes"])
            shared = nbytes >= max(min_bytes, 1) and _share(t, nbytes, channel)
            table.append({**entry, "shared": True} if shared else entry)
        return Packed(self.skeleton, table, self.tensors)


Payload = bytes | Packed


def _memory(t: Any, nbytes: int) -> memoryview:
    """The bytes of contiguous CPU tensor `t` as a writable memoryview (no copy)."""
    if nbytes == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")


def _piece_bytes() -> int:
    """Bytes per memfd: SHARE_PIECE, or less where the file-size limit (which memfds obey) is lower."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    piece = SHARE_PIECE if soft == resource.RLIM_INFINITY else min(SHARE_PIECE, soft)
    return piece - piece % mmap.PAGESIZE


def _share(t: Any, nbytes: int, channel: socket.socket) -> bool:
    """Copies contiguous CPU tensor `t` into sealed memfds and sends them over `channel` in one message;
    False (nothing sent) where memfds cannot be made here. A failure of the channel itself is raised."""
    import torch

    piece = _piece_bytes()
    if piece <= 0 or -(-nbytes // piece) > MAX_PIECES:
        return False
    src = t.reshape(-1).view(torch.uint8)
    fds: list[int] = []
    try:
        try:
            for start in range(0, nbytes, piece):
                size = min(piece, nbytes - start)
                fd = os.memfd_create("stitchcuda-share", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
                fds.append(fd)
                os.ftruncate(fd, size)
                # torch's copy runs on all intra-op threads, which also fault the file's pages in (in
                # parallel): twice a single memcpy's speed on 2 cores, more on a GPU host's 16.
                with mmap.mmap(fd, size, prot=mmap.PROT_READ | mmap.PROT_WRITE) as mapped:
                    dst = torch.frombuffer(mapped, dtype=torch.uint8)
                    dst.copy_(src[start : start + size])
                    del dst
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS | fcntl.F_SEAL_SEAL)
        except (OSError, ValueError, BufferError, RuntimeError):
            return False  # no memfds here (limits, no sealing): the tensor goes through the pipe
        socket.send_fds(channel, [b"S"], fds)
        return True
    finally:
        for fd in fds:
            os.close(fd)


def write_frame(
    out: BinaryIO,
    header: dict[str, Any],
    payload: Payload = b"",
    share: socket.socket | None = None,
    share_min: int = SHARE_MIN,
) -> None:
    """Writes one frame; with `share`, the tensors of a packed payload of `share_min` bytes or more go
    as sealed memfds."""
    if isinstance(payload, Packed) and share is not None:
        payload = payload.shared_over(share, share_min)
    head = json.dumps(header, separators=(",", ":"), default=str).encode()
    out.write(MAGIC + _LENGTHS.pack(len(head), len(payload)))
    out.write(head)
    if isinstance(payload, Packed):
        out.write(payload.prefix())
        for t, entry in zip(payload.tensors, payload.table, strict=True):
            if entry.get("shared"):
                continue
            view = _memory(t, int(entry["nbytes"]))
            for start in range(0, len(view), _SLICE):
                out.write(view[start : start + _SLICE])
    elif payload:
        out.write(payload)
    out.flush()


def _read_exact(src: BinaryIO, n: int) -> bytes:
    chunks: list[bytes] = []
    left = n
    while left:
        chunk = src.read(min(left, 1 << 24))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frames(
    src: BinaryIO, max_payload: int, share: socket.socket | None = None
) -> Iterator[tuple[dict[str, Any], Payload]]:
    """Yields (header, payload) until a clean end of stream; raises WireError on garbage. `share` is
    the socket shared tensors arrive on (none: a frame that names one is garbage)."""
    while True:
        first = src.read(len(MAGIC))
        if not first:
            return
        try:
            if first != MAGIC:
                raise WireError("bad frame magic" if len(first) == len(MAGIC) else "truncated frame")
            head_len, body_len = _LENGTHS.unpack(_read_exact(src, _LENGTHS.size))
            if head_len > MAX_HEADER or body_len > max_payload:
                raise WireError(f"frame too large (header {head_len} B, payload {body_len} B)")
            header = json.loads(_read_exact(src, head_len))
            payload = _read_payload(src, body_len, share, max_payload) if body_len else b""
        except EOFError:
            raise WireError("truncated frame") from None
        except ValueError as exc:
            raise WireError(f"bad frame header: {exc}") from None
        if not isinstance(header, dict):
            raise WireError("frame header is not an object")
        yield header, payload


def _read_payload(src: BinaryIO, body_len: int, share: socket.socket | None, max_shared: int) -> Payload:
    """A frame's payload: plain bytes, or a packed object whose raw tensors are read straight into
    freshly allocated tensors (every declared size checked against the frame's before allocating) and
    whose shared tensors are mapped from the memfds taken from `share`."""
    import torch

    first = _read_exact(src, min(len(PACKED), body_len))
    if first != PACKED or body_len < len(PACKED) + _PACK_LENGTHS.size:
        return first + _read_exact(src, body_len - len(first))
    table_len, skel_len = _PACK_LENGTHS.unpack(_read_exact(src, _PACK_LENGTHS.size))
    left = body_len - len(PACKED) - _PACK_LENGTHS.size
    if table_len + skel_len > left or table_len > MAX_HEADER:
        raise WireError("packed payload lengths exceed the frame")
    table = json.loads(_read_exact(src, table_len))
    skeleton = _read_exact(src, skel_len)
    left -= table_len + skel_len
    if not isinstance(table, list) or not all(isinstance(e, dict) for e in table):
        raise WireError("packed payload table does not match the frame")
    raw = sum(_entry_bytes(e) for e in table if not e.get("shared"))
    if raw != left or sum(_entry_bytes(e) for e in table) - raw > max_shared:
        raise WireError("packed payload table does not match the frame")
    tensors = []
    for entry in table:
        n = _entry_bytes(entry)
        dtype = _dtype(entry.get("dtype"))
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise WireError("packed tensor has a bad shape")
        if entry.get("shared"):
            buf = _receive_shared(share, n)
        else:
            buf = torch.empty(n, dtype=torch.uint8)
            view = _memory(buf, n)
            got = 0
            while got < n:
                k = src.readinto(view[got : got + _SLICE])  # type: ignore[attr-defined]
                if not k:
                    raise EOFError
                got += k
        numel = 1
        for d in shape:
            numel *= d
        try:
            flat = buf.view(dtype) if n else torch.empty(0, dtype=dtype)
        except RuntimeError as exc:
            raise WireError(f"packed tensor cannot be read as {dtype}: {exc}") from None
        if flat.numel() != numel:
            raise WireError("packed tensor size does not match its shape")
        tensors.append(flat.reshape(shape))
    return Packed(skeleton, table, tensors)


def _receive_shared(channel: socket.socket | None, nbytes: int) -> Any:
    """The bytes of one shared tensor: its memfds taken from `channel`, checked sealed and of the
    announced size, mapped copy-on-write into one range (a uint8 tensor that unmaps it when freed)."""
    if channel is None:
        raise WireError("a frame names a shared tensor on a channel without shared memory")
    try:
        _msg, fds, flags, _addr = socket.recv_fds(channel, 16, MAX_PIECES, socket.MSG_CMSG_CLOEXEC)
    except OSError as exc:
        raise WireError(f"a shared tensor did not arrive ({exc or 'timed out'})") from None
    try:
        if flags & socket.MSG_CTRUNC or not fds:
            raise WireError("a shared tensor did not arrive (no memory files in its message)")
        sizes = []
        for fd in fds:
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError:
                raise WireError("a shared tensor is not a sealed memory file") from None
            if seals & _SEALS != _SEALS:
                raise WireError("a shared tensor's memory file is not sealed against writes")
            sizes.append(os.fstat(fd).st_size)
        if sum(sizes) != nbytes or any(size <= 0 or size % mmap.PAGESIZE for size in sizes[:-1]):
            raise WireError("a shared tensor's memory files do not match its size")
        return _map_pieces(fds, sizes)
    finally:
        for fd in fds:
            os.close(fd)


class _Libc:
    """mmap/munmap by address (the mmap module cannot place several files side by side)."""

    PROT_NONE, MAP_FIXED, MAP_ANONYMOUS = 0, 0x10, 0x20
    _lib: Any = None

    @classmethod
    def get(cls) -> Any:
        if cls._lib is None:
            lib = ctypes.CDLL(None, use_errno=True)
            lib.mmap.restype = ctypes.c_void_p
            lib.mmap.argtypes = [
                ctypes.c_void_p,
                ctypes.c_size_t,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_long,
            ]
            lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            cls._lib = lib
        return cls._lib


def _map_pieces(fds: list[int], sizes: list[int]) -> Any:
    import torch

    libc = _Libc.get()
    total = sum(sizes)
    span = -(-total // mmap.PAGESIZE) * mmap.PAGESIZE
    failed = ctypes.c_void_p(-1).value
    base = libc.mmap(None, span, _Libc.PROT_NONE, mmap.MAP_PRIVATE | _Libc.MAP_ANONYMOUS, -1, 0)
    if base in (None, failed):
        raise WireError(f"cannot map a shared tensor of {total} B: {os.strerror(ctypes.get_errno())}")
    try:
        offset = 0
        for fd, size in zip(fds, sizes, strict=True):
            prot = mmap.PROT_READ | mmap.PROT_WRITE  # copy-on-write: the reader's writes stay its own
            got = libc.mmap(base + offset, size, prot, mmap.MAP_PRIVATE | _Libc.MAP_FIXED, fd, 0)
            if got != base + offset:
                raise WireError(f"cannot map a shared tensor: {os.strerror(ctypes.get_errno())}")
            offset += size
    except BaseException:
        libc.munmap(base, span)
        raise
    region = (ctypes.c_char * total).from_address(base)
    weakref.finalize(region, libc.munmap, base, span)
    return torch.frombuffer(region, dtype=torch.uint8)


def _entry_bytes(entry: Any) -> int:
    n = entry.get("nbytes") if isinstance(entry, dict) else None
    if not isinstance(n, int) or n < 0:
        raise WireError("packed tensor has a bad size")
    return n


def _dtype(name: Any) -> Any:
    import torch

    value = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(value, torch.dtype):
        raise WireError(f"packed tensor has an unknown dtype {name!r}")
    return value


def shared_bytes(payload: Payload) -> int:
    """Bytes of `payload` that came as shared memory files."""
    if not isinstance(payload, Packed):
        return 0
    return sum(int(e["nbytes"]) for e in payload.table if e.get("shared"))


def dumps(obj: Any) -> Packed:
    """Packs `obj` (nested lists, tuples and dicts of tensors and plain values) for a frame."""
    import torch

    table: list[dict[str, Any]] = []
    tensors: list[Any] = []
    skeleton = _strip(obj, table, tensors, torch)
    buf = io.BytesIO()
    torch.save(skeleton, buf)
    return Packed(buf.getvalue(), table, tensors)


# _strip and _fill are plain functions, not closures: a recursive closure is a reference cycle that kept
# every tensor it saw (GiBs at KernelBench sizes) alive until the next garbage collection.
def _strip(o: Any, table: list[dict[str, Any]], tensors: list[Any], torch: Any) -> Any:
    if isinstance(o, torch.Tensor):
        nbytes = o.numel() * o.element_size()
        if (
            nbytes < RAW_MIN
            or o.device.type != "cpu"
            or o.layout != torch.strided
            or o.is_quantized
            or o.requires_grad
            or type(o) is not torch.Tensor
        ):
            return o
        flat = o.detach().contiguous()
        table.append(
            {"dtype": str(flat.dtype).removeprefix("torch."), "shape": list(o.shape), "nbytes": nbytes}
        )
        tensors.append(flat)
        return {_MARK: len(tensors) - 1}
    if isinstance(o, list):
        return [_strip(x, table, tensors, torch) for x in o]
    if isinstance(o, tuple):
        return tuple(_strip(x, table, tensors, torch) for x in o)
    if isinstance(o, dict):
        return {k: _strip(v, table, tensors, torch) for k, v in o.items()}
    return o


def loads(data: Payload) -> Any:
    """The object a payload holds (the inverse of dumps; plain torch.save blobs are read too)."""
    import torch

    if not isinstance(data, Packed):
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    skeleton = torch.load(io.BytesIO(data.skeleton), map_location="cpu", weights_only=True)
    return _fill(skeleton, data.tensors)


def _fill(o: Any, tensors: list[Any]) -> Any:
    if isinstance(o, dict):
        if len(o) == 1 and _MARK in o:
            i = o[_MARK]
            if not isinstance(i, int) or not 0 <= i < len(tensors):
                raise WireError("packed payload refers to a missing tensor")
            return tensors[i]
        return {k: _fill(v, tensors) for k, v in o.items()}
    if isinstance(o, list):
        return [_fill(x, tensors) for x in o]
    if isinstance(o, tuple):
        return tuple(_fill(x, tensors) for x in o)
    return o


def open_fd(fd: int, mode: str) -> BinaryIO:
    """Wraps an inherited fd in a buffered binary file and makes it non-inheritable."""
    os.set_inheritable(fd, False)
    return os.fdopen(fd, mode + "b", buffering=1 << 20)  # type: ignore[return-value]
