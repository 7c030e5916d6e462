"""Keeps the corpus's shared C++/CUDA sources byte-identical: `python tests/corpus/sync.py` copies each kit from
_kits/ into every candidate folder whose manifest lists it, and writes the kit's one manifest there. Folders
without a manifest (build formats: the candidate's own load_inline/load calls) list the kit files they ship
under "kits" in expect.json, and embed _kits/inline.cpp as their CPP_SOURCE raw-string literal.

Identical sources and flags give one build-cache key, so the whole corpus compiles each kit once.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

CORPUS = Path(__file__).resolve().parent
KITS = CORPUS / "_kits"


def _manifest(name: str, sources: list[str], backend: str) -> dict[str, object]:
    return {
        "extension_name": name,
        "sources": sources,
        "cflags": ["-O2"],
        "cuda_cflags": ["-O3"] if backend == "cuda" else [],
        "ldflags": [],
        "backend": backend,
    }


# The kit a folder uses is named by its manifest's first source.
MANIFESTS: dict[str, dict[str, object]] = {
    "kit.cpp": _manifest("corpus_kit", ["kit.cpp"], "cpu"),
    "cbad.cpp": _manifest("corpus_cbad", ["cbad.cpp"], "cpu"),
    "ccomment.cpp": _manifest("corpus_ccomment", ["ccomment.cpp"], "cpu"),
    "ckit.cu": _manifest("corpus_ckit", ["ckit.cu"], "cuda"),
    "cstream.cu": _manifest("corpus_cstream", ["cstream.cu"], "cuda"),
    "csmem.cu": _manifest("corpus_csmem", ["csmem.cu"], "cuda"),
    "cmainloop.cu": _manifest("corpus_cmainloop", ["cmainloop.cu"], "cuda"),
}


def candidate_dirs() -> list[Path]:
    return sorted(p.parent for p in CORPUS.rglob("expect.json") if "_kits" not in p.parts)


def expect(folder: Path) -> dict[str, object]:
    """The folder's expect.json: reference, expected (accept|reject), row, why, device, caught_by."""
    return dict(json.loads((folder / "expect.json").read_text()))


def reference_source(folder: Path) -> str:
    return (CORPUS.parents[1] / str(expect(folder)["reference"])).read_text()


def cases(device: str) -> list[Path]:
    return [f for f in candidate_dirs() if expect(f)["device"] == device]


def kit_of(folder: Path) -> str:
    manifest = json.loads((folder / "manifest.json").read_text())
    return str(manifest["sources"][0])


INLINE_KIT = "inline.cpp"
_INLINE = re.compile(r'^CPP_SOURCE = r"""\n(.*?)"""$', re.S | re.M)


def build_format_problems(folder: Path, fix: bool) -> list[str]:
    """A manifest-less folder: its shipped kits and its embedded inline kit equal _kits/."""
    out: list[str] = []
    for src in expect(folder).get("kits", []) or []:  # type: ignore[attr-defined]
        master = (KITS / str(src)).read_text()
        copy = folder / str(src)
        if not copy.is_file() or copy.read_text() != master:
            out.append(f"{folder.name}: {src} differs from _kits/{src}")
            if fix:
                copy.write_text(master)
    entry = folder / "model_new.py"
    text = entry.read_text()
    m = _INLINE.search(text)
    master = (KITS / INLINE_KIT).read_text()
    if m and m.group(1) != master:
        out.append(f"{folder.name}: its CPP_SOURCE differs from _kits/{INLINE_KIT}")
        if fix:
            entry.write_text(text[: m.start(1)] + master + text[m.end(1) :])
    return out


def problems(fix: bool = False) -> list[str]:
    """Folders whose kit copy or manifest differs from _kits/ (fixed in place when fix=True)."""
    out: list[str] = []
    for folder in candidate_dirs():
        if not (folder / "manifest.json").is_file():
            out.extend(build_format_problems(folder, fix))
            continue
        kit = kit_of(folder)
        if kit not in MANIFESTS:
            out.append(f"{folder.name}: unknown kit {kit}")
            continue
        want = json.dumps(MANIFESTS[kit], indent=2) + "\n"
        if (folder / "manifest.json").read_text() != want:
            out.append(f"{folder.name}: manifest differs from the {kit} manifest")
            if fix:
                (folder / "manifest.json").write_text(want)
        for src in MANIFESTS[kit]["sources"]:  # type: ignore[union-attr]
            master = (KITS / str(src)).read_text()
            copy = folder / str(src)
            if not copy.is_file() or copy.read_text() != master:
                out.append(f"{folder.name}: {src} differs from _kits/{src}")
                if fix:
                    copy.write_text(master)
    return out


README_HEAD = """# Verifier corpus: reward hacks and honest candidates

Each folder is one candidate in the format of `shared/candidate.py` (`model_new.py`, its C++/CUDA sources,
`manifest.json`) plus `expect.json`: the reference problem, the expected verdict, the row of
`VERIFIER_THREATS.md` section 2 it stands for (`§3` for the honest false-positive traps), why, the device, and
which part of the Verifier is meant to catch it (`static` = the D11 scan alone, `runtime` = the sandboxed run
(D1-D10), `both`). `runtime` candidates are statically clean on purpose, so they really test the run-time checks.

Most candidates share a few byte-identical sources from `_kits/` (one build-cache key per kit, so the whole CPU
corpus compiles 3 extensions): `kit.cpp` (honest kernels plus statically clean wrong ones), `cbad.cpp` (hacks
that live in C++), `ccomment.cpp`; CUDA: `ckit.cu`, `cstream.cu`, `csmem.cu`, `cmainloop.cu`. After editing a
kit, run `python tests/corpus/sync.py` (copies kits and manifests, regenerates this table).

The `bf_*` folders are the other build formats (no manifest: the candidate's own `load_inline`/`load` calls at
module level, in `__init__`, in cached helpers, one or two extensions). They embed `_kits/inline.cpp` as their
`CPP_SOURCE` literal or ship `kit.cpp` (listed under `kits` in expect.json), so they add 3 builds: the inline kit
under two names and one that fails on purpose.

Tests: `tests/unit/verifier_static/test_static_corpus.py` (static scan only),
`tests/integration/test_hack_corpus.py` (CPU, marker `slow`), `tests/gpu/test_hack_corpus_gpu.py` (marker `gpu`).

| candidate | device | reference | row | expected | caught by | why |
|---|---|---|---|---|---|---|
"""


def readme() -> str:
    lines = [README_HEAD.rstrip("\n")]
    for folder in candidate_dirs():
        e = expect(folder)
        ref = Path(str(e["reference"])).stem
        lines.append(
            f"| `{folder.name}` | {e['device']} | {ref} | {e['row']} | {e['expected']} | {e['caught_by']} | {e['why']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    fixed = problems(fix=True)
    (CORPUS / "README.md").write_text(readme())
    print("\n".join(fixed) if fixed else "corpus kits are in sync")
    sys.exit(0)
