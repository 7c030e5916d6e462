"""The candidate runner's host stage: every output it sends is copied into one reused buffer, never a
fresh page-locked block per output (those piled up to the host's OOM killer on a level-1 problem)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import stitchcuda.verifier.harness as harness_package

# The harness runs as loose scripts in the sandbox (`import wire`): import common the way they do.
sys.path.insert(0, str(Path(harness_package.__file__).parent))
import common
import wire


def outputs(scale: float) -> list[object]:
    x = torch.arange(30_000, dtype=torch.float32).reshape(300, 100) * scale
    return [x.t(), x.double()[:70], (x > 50).reshape(-1), torch.arange(5), 2.5, None, x[0, :3]]


def test_staged_copies_equal_the_outputs_and_survive_the_wire() -> None:
    stage = common.HostStage(pinned=False, min_bytes=0)
    outs = outputs(1.0)
    host = stage.copies(outs)
    assert len(host) == len(outs)
    for a, b in zip(host, outs, strict=True):
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        else:
            assert a == b
    # large ones are views of the stage; those that travel inside the frame's skeleton are plain copies
    base = stage.buffer.data_ptr()
    assert host[0].untyped_storage().data_ptr() == base
    assert host[6].untyped_storage().data_ptr() != base
    back = wire.loads(wire.dumps(host))
    assert torch.equal(back[0], outs[0]) and torch.equal(back[2], outs[2])


def test_the_buffer_is_reused_for_outputs_that_fit_and_grown_for_larger_ones() -> None:
    stage = common.HostStage(pinned=False, min_bytes=0)
    stage.copies(outputs(1.0))
    first = stage.buffer
    again = stage.copies(outputs(2.0))
    assert stage.buffer is first
    assert torch.equal(again[0], outputs(2.0)[0])  # type: ignore[arg-type]
    bigger = stage.copies([torch.ones(1_000_000)])
    assert stage.buffer is not first and stage.buffer.numel() >= 4_000_000
    assert float(bigger[0].sum()) == 1_000_000


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the device path is taken")
def test_cpu_outputs_are_not_staged_when_the_stage_is_for_device_outputs() -> None:
    stage = common.HostStage()
    host = stage.copies([torch.ones(10_000_000)])
    assert stage.buffer is None and float(host[0].sum()) == 10_000_000
