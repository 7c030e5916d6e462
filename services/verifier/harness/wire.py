"""Framing of the private channel between the Verifier and its sandboxed runners (stdlib + torch only).

A frame is MAGIC, two big-endian u64 lengths, a JSON header and an opaque payload (a torch.save blob of
CPU tensors, or nothing). Readers bound every length so a hostile writer cannot make them allocate
without limit, and blobs are loaded with weights_only=True so they cannot run code in the reader.
"""

from __future__ import annotations

import io
import json
import os
import struct
from collections.abc import Iterator
from typing import Any, BinaryIO

MAGIC = b"SCV1"
_LENGTHS = struct.Struct(">QQ")
MAX_HEADER = 16 << 20


class WireError(Exception):
    """The peer wrote something that is not a well-formed frame."""


def write_frame(out: BinaryIO, header: dict[str, Any], payload: bytes = b"") -> None:
    head = json.dumps(header, separators=(",", ":"), default=str).encode()
    out.write(MAGIC + _LENGTHS.pack(len(head), len(payload)))
    out.write(head)
    if payload:
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


def read_frames(src: BinaryIO, max_payload: int) -> Iterator[tuple[dict[str, Any], bytes]]:
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
            payload = _read_exact(src, body_len) if body_len else b""
        except EOFError:
            raise WireError("truncated frame") from None
        except ValueError as exc:
            raise WireError(f"bad frame header: {exc}") from None
        if not isinstance(header, dict):
            raise WireError("frame header is not an object")
        yield header, payload


def dumps(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def loads(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def open_fd(fd: int, mode: str) -> BinaryIO:
    """Wraps an inherited fd in a buffered binary file and makes it non-inheritable."""
    os.set_inheritable(fd, False)
    return os.fdopen(fd, mode + "b", buffering=1 << 20)  # type: ignore[return-value]
