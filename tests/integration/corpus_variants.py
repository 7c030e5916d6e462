"""Honest variants of corpus candidates made for a test: same build, different work."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import REPO

FAST = REPO / "tests" / "corpus" / "honest_elementwise_fast"


def slowed(tmp_path: Path, folder_name: str = "honest_elementwise_slow") -> Path:
    """honest_elementwise_fast doing its (correct) pass 8 times per call: honest, same build, 8x the work."""
    folder = tmp_path / folder_name
    shutil.copytree(FAST, folder)
    source = (folder / "model_new.py").read_text()
    call = "return ext.elementwise_chain(x.contiguous(), self.scale, self.shift)"
    assert call in source
    repeated = (
        "out = x\n        for _ in range(8):\n"
        "            out = ext.elementwise_chain(x.contiguous(), self.scale, self.shift)\n        return out"
    )
    (folder / "model_new.py").write_text(source.replace(call, repeated))
    return folder
