"""Large tensors as sealed memory files: they come back equal without crossing the pipe, in pieces where the
writer's file-size limit is small, and a writer that sends anything but sealed memfds of the announced
size gets a wire error, never a buffer it can still change."""

from __future__ import annotations

import io
import mmap
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_wire_packed import hostile

from stitchcuda.verifier.harness import wire

PAGE = mmap.PAGESIZE


@pytest.fixture
def channel() -> Iterator[tuple[socket.socket, socket.socket]]:
    writer, reader = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    reader.settimeout(2.0)
    with writer, reader:
        yield writer, reader


def frames_of(data: bytes, reader: socket.socket | None, max_payload: int = 1 << 30) -> list[tuple]:
    return list(wire.read_frames(io.BytesIO(data), max_payload, reader))


def share_maps() -> int:
    with open("/proc/self/maps") as fh:
        return sum("stitchcuda-share" in line for line in fh)


def test_a_large_tensor_comes_back_equal_without_crossing_the_pipe(channel, monkeypatch) -> None:
    writer, reader = channel
    before = share_maps()  # tests run earlier in this process may still hold tensors of their own
    monkeypatch.setattr(wire, "SHARE_PIECE", 12 * PAGE)  # pieces, and a ragged last one
    big = torch.randn((40 * PAGE + 28) // 4)
    small = torch.randn(1 << 14)  # raw: under the threshold
    buf = io.BytesIO()
    wire.write_frame(buf, {"kind": "output"}, wire.dumps([big, small, 2.5]), writer, share_min=1 << 17)
    assert len(buf.getvalue()) < small.numel() * 4 + 4096  # the big tensor is not in the frame
    [(head, payload)] = frames_of(buf.getvalue(), reader)
    assert head == {"kind": "output"}
    assert wire.shared_bytes(payload) == big.numel() * 4
    back = wire.loads(payload)
    assert torch.equal(back[0], big) and torch.equal(back[1], small) and back[2] == 2.5
    assert share_maps() - before == 4  # four pieces mapped side by side, one tensor over them
    back[0].mul_(0.0)  # copy-on-write: the reader's tensor is its own
    del back, payload
    assert share_maps() == before  # the mapping goes with the last tensor over it


def test_without_a_channel_or_where_memfds_fail_the_tensor_goes_through_the_pipe(
    channel, monkeypatch
) -> None:
    writer, reader = channel
    big = torch.randn(1 << 16)
    buf = io.BytesIO()
    wire.write_frame(buf, {}, wire.dumps([big]), None, share_min=1)
    assert len(buf.getvalue()) > big.numel() * 4
    monkeypatch.setattr(wire, "_piece_bytes", lambda: 0)  # a file-size limit under one page
    buf2 = io.BytesIO()
    wire.write_frame(buf2, {}, wire.dumps([big]), writer, share_min=1)
    [(_, payload)] = frames_of(buf2.getvalue(), reader)
    assert wire.shared_bytes(payload) == 0 and torch.equal(wire.loads(payload)[0], big)


WRITER = """
import sys, socket, resource, torch
sys.path.insert(0, sys.argv[1])
import wire
resource.setrlimit(resource.RLIMIT_FSIZE, (5 * 4096, 5 * 4096))  # the sandbox's limit, small
sock = socket.socket(fileno=int(sys.argv[2]))
out = open(int(sys.argv[3]), "wb")
t = torch.arange(100_000, dtype=torch.float32)
wire.write_frame(out, {"kind": "output"}, wire.dumps([t]), sock, share_min=1 << 16)
out.close()
"""


def test_another_process_shares_under_its_file_size_limit(channel) -> None:
    """The runner's side: a process with a small RLIMIT_FSIZE sends pieces that fit it, fds travel."""
    writer, reader = channel
    harness = Path(wire.__file__).parent
    r, w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(harness), str(writer.fileno()), str(w)],
        pass_fds=(writer.fileno(), w),
    )
    os.close(w)
    with os.fdopen(r, "rb") as src:
        frames = list(wire.read_frames(src, 1 << 30, reader))
    assert proc.wait(timeout=60) == 0
    [(_, payload)] = frames
    assert wire.shared_bytes(payload) == 400_000
    assert torch.equal(wire.loads(payload)[0], torch.arange(100_000, dtype=torch.float32))


def announced(nbytes: int) -> bytes:
    """A frame whose table names one shared float32 tensor of `nbytes`."""
    return hostile([{"dtype": "float32", "shape": [nbytes // 4], "nbytes": nbytes, "shared": True}], b"")


def memfd(nbytes: int, seals: int) -> int:
    fd = os.memfd_create("stitchcuda-share", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    if seals:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def sealed(nbytes: int) -> int:
    import fcntl

    return memfd(nbytes, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)


def send(writer: socket.socket, fds: list[int]) -> None:
    socket.send_fds(writer, [b"S"], fds)
    for fd in fds:
        os.close(fd)


def test_an_unsealed_memory_file_is_refused(channel) -> None:
    """Unsealed, the writer could change the bytes after the reader checked them."""
    import fcntl

    writer, reader = channel
    send(writer, [memfd(PAGE, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)])
    with pytest.raises(wire.WireError, match="not sealed against writes"):
        frames_of(announced(PAGE), reader)


def test_an_ordinary_file_is_refused(channel) -> None:
    writer, reader = channel
    with tempfile.TemporaryFile() as fh:
        fh.write(b"\0" * PAGE)
        fh.flush()
        send(writer, [os.dup(fh.fileno())])
    with pytest.raises(wire.WireError, match="not a sealed memory file"):
        frames_of(announced(PAGE), reader)


@pytest.mark.parametrize(
    ("sizes", "nbytes"),
    [([PAGE], 2 * PAGE), ([2 * PAGE], PAGE), ([100, PAGE], PAGE + 100)],  # short, long, ragged middle
    ids=["short", "long", "unaligned-piece"],
)
def test_memory_files_of_another_size_are_refused(channel, sizes: list[int], nbytes: int) -> None:
    writer, reader = channel
    send(writer, [sealed(s) for s in sizes])
    with pytest.raises(wire.WireError, match="do not match its size"):
        frames_of(announced(nbytes), reader)


def test_a_shared_tensor_that_never_comes_is_a_wire_error(channel) -> None:
    _writer, reader = channel
    reader.settimeout(0.2)
    with pytest.raises(wire.WireError, match="did not arrive"):
        frames_of(announced(PAGE), reader)
    with pytest.raises(wire.WireError, match="without shared memory"):
        frames_of(announced(PAGE), None)


def test_shared_tensors_count_against_the_payload_bound(channel) -> None:
    writer, reader = channel
    send(writer, [sealed(4 * PAGE)])
    with pytest.raises(wire.WireError, match="does not match the frame"):
        frames_of(announced(4 * PAGE), reader, max_payload=PAGE)
