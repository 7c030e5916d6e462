"""The hack corpus against the static scan alone: static catches what it claims, honest candidates stay clean."""

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.shared.candidate import read_dir
from stitchcuda.verifier.build import cache_key, split
from stitchcuda.verifier.static import scan

CORPUS = Path(__file__).resolve().parents[2] / "corpus"
_spec = importlib.util.spec_from_file_location("corpus_sync", CORPUS / "sync.py")
assert _spec is not None and _spec.loader is not None
sync = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sync)

FOLDERS = sync.candidate_dirs()


def _rejects(folder: Path) -> list[verify_pb2.Finding]:
    findings = scan(read_dir(folder), sync.reference_source(folder))
    return [f for f in findings if f.severity == verify_pb2.SEVERITY_REJECT]


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.relative_to(CORPUS).as_posix())
def test_static_verdict_matches_expect(folder):
    e = sync.expect(folder)
    rejects = _rejects(folder)
    shown = "; ".join(f"{f.rule} at {f.where}: {f.detail}" for f in rejects)
    if e["expected"] == "accept":
        assert not rejects, f"honest candidate rejected by the static scan: {shown}"
    elif e["caught_by"] in ("static", "both"):
        assert rejects, f"{folder.name} (row {e['row']}) claims a static catch, but scan found no REJECT"
    else:
        # Runtime-only candidates must be statically clean, so that they really test the runtime checks.
        assert not rejects, f"{folder.name} is meant for the runtime checks but static rejects it: {shown}"


def test_expect_files_are_well_formed():
    for folder in FOLDERS:
        e = sync.expect(folder)
        assert set(e) >= {"reference", "expected", "row", "why", "device", "caught_by"}, folder
        assert e["expected"] in ("accept", "reject"), folder
        assert e["device"] in ("cpu", "cuda"), folder
        assert e["caught_by"] in (
            ("none",) if e["expected"] == "accept" else ("static", "runtime", "both")
        ), folder
        assert (CORPUS.parents[1] / e["reference"]).is_file(), folder
        assert (e["device"] == "cuda") == ("cuda" in folder.relative_to(CORPUS).parts), folder


def test_every_catalogue_row_has_a_hack_and_every_trap_an_honest_candidate():
    rows = {sync.expect(f)["row"] for f in FOLDERS if sync.expect(f)["expected"] == "reject"}
    assert set(range(1, 38)) <= rows, sorted(set(range(1, 38)) - rows)
    honest = [f for f in FOLDERS if sync.expect(f)["expected"] == "accept"]
    assert len(honest) >= 8


def test_kits_are_byte_identical_and_cpu_builds_are_few():
    assert sync.problems() == []
    # Distinct build-cache keys over every extension of every CPU candidate (build formats included).
    keys = Counter(
        cache_key(one, "") for f in FOLDERS if sync.expect(f)["device"] == "cpu" for one in split(read_dir(f))
    )
    assert len(keys) <= 8, keys


def test_readme_lists_every_candidate():
    readme = (CORPUS / "README.md").read_text()
    missing = [f.name for f in FOLDERS if f"`{f.name}`" not in readme]
    assert not missing, missing
