"""Hostile candidates: each ends as a verdict with a reason, and the parent process carries on."""

from __future__ import annotations

import os

import pytest
from verifier_support import FIXTURES, REF01, rejects, variant

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.shared.candidate import read_dir
from stitchcuda.verifier.service import VerifierService

pytestmark = pytest.mark.slow

HEAD = "import torch\nimport torch.nn as nn\nimport sc_test_elementwise as ext\n"


def body(forward: str, prelude: str = "", init: str = "") -> str:
    return (
        f"{HEAD}{prelude}\n\nclass ModelNew(nn.Module):\n"
        "    def __init__(self, scale, shift):\n"
        "        super().__init__()\n"
        f"        self.scale, self.shift = float(scale), float(shift)\n{init}\n"
        "    def forward(self, x):\n"
        f"{forward}"
        "        return ext.fused_forward(x, self.scale, self.shift)\n"
    )


CASES = {
    "hang": (body("        while True:\n            pass\n"), "D1.timeout", "timed out"),
    "segfault": (body("        import ctypes\n        ctypes.string_at(0)\n"), "D1.crash", "SIGSEGV"),
    "fork_bomb": (
        body(
            "        import ctypes\n        libc = ctypes.CDLL(None)\n        for _ in range(100000):\n            libc.fork()\n"
        ),
        "D9.ctypes",
        "",
    ),
    "alloc_50gb": (
        body("", init="        self.arena = torch.zeros(50 * 2**30, dtype=torch.uint8)\n"),
        "D1.crash",
        "allocate",
    ),
    "socket": (
        body(
            "        try:\n            socket.create_connection(('10.255.255.1', 80), timeout=0.3)\n"
            "        except Exception:\n            pass\n",
            prelude="import socket\n",
        ),
        "D9.network",
        "network",
    ),
    "spoofed_result": (
        'print(\'{"accepted": true, "speedup": 57.3}\')\nimport os\nos._exit(0)\n' + body(""),
        "D1.no-completion-record",
        "completion record",
    ),
    "timer_patch": (
        body("", prelude="import time\ntime.perf_counter = lambda: 0.0\n"),
        "D8.function-replaced",
        "perf_counter",
    ),
    "global_state": (
        body("", prelude="torch.set_float32_matmul_precision('medium')\n"),
        "D8.state-changed",
        "matmul_precision",
    ),
    "reads_secrets": (
        body(
            "        try:\n            open('/root/.ssh/id_rsa').read()\n        except OSError:\n            pass\n"
        ),
        "D9.file-read",
        "/root/.ssh",
    ),
    "frame_walk": (
        body(
            "        frame = sys._getframe(1)\n        while frame is not None:\n            frame = frame.f_back\n",
            prelude="import sys\n",
        ),
        "D9.frame-walk",
        "",
    ),
    "background_thread": (
        body(
            "        if not getattr(self, 't', None):\n"
            "            self.t = threading.Thread(target=time.sleep, args=(600,), daemon=True)\n"
            "            self.t.start()\n",
            prelude="import threading\nimport time\n",
        ),
        "D9.threads",
        "thread",
    ),
    "mutates_input": (
        "import torch.nn as nn\nimport sc_test_elementwise as ext\n\n\nclass ModelNew(nn.Module):\n"
        "    def __init__(self, scale, shift):\n        super().__init__()\n"
        "        self.scale, self.shift = float(scale), float(shift)\n\n"
        "    def forward(self, x):\n        out = ext.fused_forward(x, self.scale, self.shift)\n"
        "        x.zero_()\n        return out\n",
        "D5.input-mutated",
        "modified",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_candidate_gets_a_verdict(service: VerifierService, tmp_path, name):
    source, rule, words = CASES[name]
    # A generous limit: this suite shares small, busy machines; the hang needs none of it.
    timeout = 20.0 if name == "hang" else 120.0
    policy = verify_pb2.VerifyPolicy(timeout_s=timeout, allowed_rules=["D11"])
    verdict = service.verify_dir(REF01, variant(tmp_path, source), policy=policy)
    assert not verdict.accepted, verdict.feedback
    assert rule in rejects(verdict), verdict.feedback
    detail = " ".join(f.detail for f in verdict.findings if f.rule == rule)
    assert words in detail, detail


def test_parent_survives_and_leaves_no_processes_behind(service: VerifierService):
    verdict = service.verify(REF01.read_text(), read_dir(FIXTURES / "honest_cpu"), device="cpu")
    assert verdict.accepted, verdict.feedback
    service.close()  # the prepared standby runner is the only process allowed to outlive a verify
    # Only this service's uids: worker processes of other test modules keep standbys of their own.
    ours = service.sandbox.uids_used
    assert ours or not service.sandbox.drop_uid
    leftovers = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uid = os.stat(f"/proc/{entry}").st_uid
            except OSError:
                continue
            if uid in ours:
                leftovers.append(entry)
    assert not leftovers
