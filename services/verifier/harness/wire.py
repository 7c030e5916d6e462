"""Framing of the private channel between the Verifier and its sandboxed runners (stdlib + torch only).

A frame is MAGIC, two big-endian u64 lengths, a JSON header and an opaque payload (nothing, or a packed
object). Readers bound every length so a hostile writer cannot make them allocate without limit, and
skeletons are loaded with weights_only=True so they cannot run code in the reader.

A packed object (`dumps`) is its skeleton (a torch.save blob in which every tensor of RAW_MIN bytes or
more is a placeholder) followed by those tensors' raw bytes. The raw bytes go from the writer's tensor
memory to the pipe and from the pipe into the reader's tensor memory without a copy in between: a
KernelBench output of several GiB costs one pass each way, not the five of pickling, joining and
unpickling it (the stage that dominated a large problem's time to verdict).
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import struct
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
        return len(self.prefix()) + sum(int(t["nbytes"]) for t in self.table)


Payload = bytes | Packed


def _memory(t: Any, nbytes: int) -> memoryview:
    """The bytes of contiguous CPU tensor `t` as a writable memoryview (no copy)."""
    if nbytes == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")


def write_frame(out: BinaryIO, header: dict[str, Any], payload: Payload = b"") -> None:
    head = json.dumps(header, separators=(",", ":"), default=str).encode()
    out.write(MAGIC + _LENGTHS.pack(len(head), len(payload)))
    out.write(head)
    if isinstance(payload, Packed):
        out.write(payload.prefix())
        for t, entry in zip(payload.tensors, payload.table, strict=True):
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


def read_frames(src: BinaryIO, max_payload: int) -> Iterator[tuple[dict[str, Any], Payload]]:
    """Yields (header, payload) until a clean end of stream; raises WireError on garbage."""
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
            payload = _read_payload(src, body_len) if body_len else b""
        except EOFError:
            raise WireError("truncated frame") from None
        except ValueError as exc:
            raise WireError(f"bad frame header: {exc}") from None
        if not isinstance(header, dict):
            raise WireError("frame header is not an object")
        yield header, payload


def _read_payload(src: BinaryIO, body_len: int) -> Payload:
    """A frame's payload: plain bytes, or a packed object whose raw tensors are read straight into
    freshly allocated tensors (every declared size checked against the frame's before allocating)."""
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
    if not isinstance(table, list) or sum(_entry_bytes(e) for e in table) != left:
        raise WireError("packed payload table does not match the frame")
    tensors = []
    for entry in table:
        n = _entry_bytes(entry)
        dtype = _dtype(entry.get("dtype"))
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise WireError("packed tensor has a bad shape")
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


def dumps(obj: Any) -> Packed:
    """Packs `obj` (nested lists, tuples and dicts of tensors and plain values) for a frame."""
    import torch

    table: list[dict[str, Any]] = []
    tensors: list[Any] = []

    def strip(o: Any) -> Any:
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
            return [strip(x) for x in o]
        if isinstance(o, tuple):
            return tuple(strip(x) for x in o)
        if isinstance(o, dict):
            return {k: strip(v) for k, v in o.items()}
        return o

    skeleton = strip(obj)
    buf = io.BytesIO()
    torch.save(skeleton, buf)
    return Packed(buf.getvalue(), table, tensors)


def loads(data: Payload) -> Any:
    """The object a payload holds (the inverse of dumps; plain torch.save blobs are read too)."""
    import torch

    if not isinstance(data, Packed):
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    skeleton = torch.load(io.BytesIO(data.skeleton), map_location="cpu", weights_only=True)
    tensors = data.tensors

    def fill(o: Any) -> Any:
        if isinstance(o, dict):
            if len(o) == 1 and _MARK in o:
                i = o[_MARK]
                if not isinstance(i, int) or not 0 <= i < len(tensors):
                    raise WireError("packed payload refers to a missing tensor")
                return tensors[i]
            return {k: fill(v) for k, v in o.items()}
        if isinstance(o, list):
            return [fill(x) for x in o]
        if isinstance(o, tuple):
            return tuple(fill(x) for x in o)
        return o

    return fill(skeleton)


def open_fd(fd: int, mode: str) -> BinaryIO:
    """Wraps an inherited fd in a buffered binary file and makes it non-inheritable."""
    os.set_inheritable(fd, False)
    return os.fdopen(fd, mode + "b", buffering=1 << 20)  # type: ignore[return-value]
