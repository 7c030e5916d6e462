"""The per-node CUDA context bound holds across processes and frees the slot of a dead worker."""

import multiprocessing as mp
import os
import signal
import time

import pytest

from stitchcuda.shared.errors import Unavailable
from stitchcuda.shared.gpu_slots import gpu_slot, pin_environment, visible_gpus


def _hold(folder, gpu, per_gpu, seconds, started):
    with gpu_slot(folder, gpu, per_gpu):
        started.set()
        time.sleep(seconds)


def test_bound_holds_across_processes(tmp_path):
    ctx = mp.get_context("spawn")
    started = ctx.Event()
    holder = ctx.Process(target=_hold, args=(tmp_path, "0", 1, 30, started))
    holder.start()
    assert started.wait(20)
    with pytest.raises(Unavailable, match="no free CUDA context slot on GPU 0"):
        with gpu_slot(tmp_path, "0", 1, timeout_s=0.3):
            pass
    # Another GPU's slots are independent.
    with gpu_slot(tmp_path, "1", 1, timeout_s=0.3) as slot:
        assert slot == 0
    # A worker killed while holding its slot gives it back (the kernel drops its lock).
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    with gpu_slot(tmp_path, "0", 1, timeout_s=5) as slot:
        assert slot == 0


def test_second_slot_is_used_when_two_are_allowed(tmp_path):
    with gpu_slot(tmp_path, "0", 2) as first, gpu_slot(tmp_path, "0", 2, timeout_s=0.2) as second:
        assert {first, second} == {0, 1}


def test_pinning_and_visibility(monkeypatch):
    assert pin_environment("3")["CUDA_VISIBLE_DEVICES"] == "3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert visible_gpus() == ["2", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert visible_gpus() == []
