"""Fixtures of the Coder's tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def verifier():  # type: ignore[no-untyped-def]
    """The Verifier, its builds in the tests' shared build cache (a program built once serves every test)."""
    service = pytest.importorskip("stitchcuda.verifier.service")
    settings = pytest.importorskip("stitchcuda.verifier.settings")
    cache = Path(os.environ["STITCH_TEST_BUILD_CACHE"])
    return service.VerifierService(settings.VerifierSettings(build_cache_dir=cache))
