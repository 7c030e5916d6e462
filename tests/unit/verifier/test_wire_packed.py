"""The private channel's packed payloads: tensors travel as raw bytes (no pickling of the data), every
value comes back equal, and a hostile writer's table cannot make the reader allocate or misread."""

from __future__ import annotations

import io
import json
import struct

import pytest
import torch

from stitchcuda.verifier.harness import wire


def roundtrip(obj: object) -> tuple[object, wire.Payload]:
    buf = io.BytesIO()
    wire.write_frame(buf, {"kind": "output"}, wire.dumps(obj))
    buf.seek(0)
    frames = list(wire.read_frames(buf, 1 << 30))
    assert len(frames) == 1
    head, payload = frames[0]
    assert head == {"kind": "output"}
    return wire.loads(payload), payload


def test_nested_objects_come_back_equal_with_large_tensors_sent_raw() -> None:
    big = torch.randn(300, 500)
    view = torch.randn(1000, 1000, dtype=torch.float64)[10:20]  # a view: only its own bytes travel
    strided = torch.randn(400, 300).t()
    obj = {
        "outs": [big, torch.arange(10), None, 3.5, "x"],
        "pair": (view, strided, torch.tensor([True, False] * 40000)),
        "half": torch.randn(70000).half(),
        "empty": torch.empty(0, 5),
    }
    back, payload = roundtrip(obj)
    assert isinstance(payload, wire.Packed)
    assert len(payload.tensors) == 5  # big, view, strided, bool, half: the small ones stay in the skeleton
    assert sum(int(e["nbytes"]) for e in payload.table) == (
        big.numel() * 4 + view.numel() * 8 + strided.numel() * 4 + 80000 + 70000 * 2
    )
    assert isinstance(back, dict)
    assert torch.equal(back["outs"][0], big) and torch.equal(back["outs"][1], torch.arange(10))
    assert back["outs"][2:] == [None, 3.5, "x"]
    assert torch.equal(back["pair"][0], view) and torch.equal(back["pair"][1], strided)
    assert back["pair"][2].dtype == torch.bool and torch.equal(back["pair"][2], obj["pair"][2])
    assert torch.equal(back["half"], obj["half"]) and back["empty"].shape == (0, 5)


def test_plain_torch_save_blobs_are_still_read() -> None:
    buf = io.BytesIO()
    torch.save([torch.ones(3)], buf)
    assert torch.equal(wire.loads(buf.getvalue())[0], torch.ones(3))


def hostile(table: list[dict[str, object]], raw: bytes) -> bytes:
    skel = io.BytesIO()
    torch.save([{"__wire_tensor__": 0}], skel)
    t = json.dumps(table).encode()
    body = wire.PACKED + struct.pack(">QQ", len(t), len(skel.getvalue())) + t + skel.getvalue() + raw
    head = b"{}"
    return wire.MAGIC + struct.pack(">QQ", len(head), len(body)) + head + body


@pytest.mark.parametrize(
    ("table", "raw", "message"),
    [
        ([{"dtype": "float32", "shape": [4], "nbytes": 1 << 40}], b"\0" * 16, "does not match the frame"),
        ([{"dtype": "float32", "shape": [5], "nbytes": 16}], b"\0" * 16, "does not match its shape"),
        ([{"dtype": "os.system", "shape": [4], "nbytes": 16}], b"\0" * 16, "unknown dtype"),
        ([{"dtype": "float32", "shape": [-4], "nbytes": 16}], b"\0" * 16, "bad shape"),
        ([{"dtype": "float32", "shape": [4], "nbytes": -16}], b"\0" * 16, "bad size"),
        ([{"dtype": "float64", "shape": [2], "nbytes": 12}], b"\0" * 12, "cannot be read"),
    ],
)
def test_a_hostile_table_is_a_wire_error(table: list[dict[str, object]], raw: bytes, message: str) -> None:
    with pytest.raises(wire.WireError, match=message):
        list(wire.read_frames(io.BytesIO(hostile(table, raw)), 1 << 30))


def test_a_placeholder_without_its_tensor_is_a_wire_error() -> None:
    payload = wire.Packed(wire.dumps([{"__wire_tensor__": 3}]).skeleton, [], [])
    with pytest.raises(wire.WireError, match="missing tensor"):
        wire.loads(payload)
