"""Verifier test fixtures: one service per session whose builds live in the shared test build cache."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from verifier_support import fast_settings

from stitchcuda.shared.artifacts import LocalArtifactStore
from stitchcuda.verifier.service import VerifierService


@pytest.fixture(scope="session")
def build_store() -> LocalArtifactStore:
    root = Path(
        os.environ.get("STITCH_TEST_BUILD_CACHE", str(Path.home() / ".stitchcuda" / "test-build-cache"))
    )
    return LocalArtifactStore(root)


@pytest.fixture(scope="session")
def service(
    tmp_path_factory: pytest.TempPathFactory, build_store: LocalArtifactStore
) -> Iterator[VerifierService]:
    svc = VerifierService(fast_settings(tmp_path_factory.mktemp("verifier-home")), artifacts=build_store)
    yield svc
    svc.close()
