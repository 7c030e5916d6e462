"""The candidate program format: files plus a build manifest, and its conversions to and from files.

A candidate's `model_new.py` defines `class ModelNew(nn.Module)` and reaches its compiled extension either
through one top-level line, `import <extension_name> as ext` (the Verifier builds the extension itself and
puts it on the import path), or through its own torch.utils.cpp_extension build calls (load_inline or load,
anywhere, once or several times: `build_calls`), each of which becomes a build entry the Verifier builds
before the run and serves the call from. A Triton candidate (`@triton.jit` kernels launched from forward,
`triton_kernels`) has no build entry at all: its kernels compile on first launch inside the run.
`export_standalone` turns the first kind into a self-contained KernelBench-style module that JIT-builds the
sources with torch.utils.cpp_extension.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from stitchcuda.api.v1 import code_pb2
from stitchcuda.shared import build_calls, cutlass, triton_kernels
from stitchcuda.shared.artifacts import sha256_hex
from stitchcuda.shared.errors import InvalidRequest

ENTRY = "model_new.py"
MANIFEST = "manifest.json"
SOURCE_SUFFIXES = (".cpp", ".cc", ".cu", ".cuh", ".h", ".hpp")
FOLDER_WITH_MANIFEST = "folder with manifest"
LOOKED_FOR = (
    f"a folder with {MANIFEST}, or a {ENTRY} (or single .py file) whose ModelNew builds its extension with "
    "torch.utils.cpp_extension.load_inline or load (at module level, in __init__ or in a helper) "
    "or defines @triton.jit kernels"
)


def import_line(extension_name: str) -> str:
    return f"import {extension_name} as ext"


def content_hash(candidate: code_pb2.Candidate) -> str:
    parts: list[str] = [candidate.build.SerializeToString(deterministic=True).hex()]
    for f in sorted(candidate.files, key=lambda f: f.path):
        parts += [f.path, f.content]
    return sha256_hex(*parts)


def file_map(candidate: code_pb2.Candidate) -> dict[str, str]:
    return {f.path: f.content for f in candidate.files}


def write_dir(candidate: code_pb2.Candidate, root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for f in candidate.files:
        path = root / f.path
        if ".." in Path(f.path).parts or Path(f.path).is_absolute():
            raise InvalidRequest(f"candidate file path escapes its folder: {f.path}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f.content)
    manifest = {
        "extension_name": candidate.build.extension_name,
        "sources": list(candidate.build.sources),
        "cflags": list(candidate.build.cflags),
        "cuda_cflags": list(candidate.build.cuda_cflags),
        "ldflags": list(candidate.build.ldflags),
        "backend": candidate.build.backend,
    }
    if candidate.build.libraries:
        # The declared cuBLAS/cuDNN calls: the library policy counts them outside D6 when the folder is
        # verified again (without them the same program is judged as all-custom and rejected).
        manifest["libraries"] = list(candidate.build.libraries)
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def read_dir(root: Path) -> code_pb2.Candidate:
    """Reads a candidate folder: model_new.py and sources, with manifest.json or build calls of its own."""
    files: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        if (
            path.is_file()
            and path.name != MANIFEST
            and (path.suffix in SOURCE_SUFFIXES or path.suffix == ".py")
        ):
            files[path.relative_to(root).as_posix()] = path.read_text()
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        if ENTRY not in files:
            raise InvalidRequest(f"{root} is not a candidate: looked for {LOOKED_FOR}")
        calls = build_calls.find(files[ENTRY], files)
        kernels = triton_kernels.find(files[ENTRY])
        if not calls and not kernels:
            raise InvalidRequest(
                f"{root} has no {MANIFEST} and its {ENTRY} makes no build call and defines no @triton.jit "
                f"kernel: looked for {LOOKED_FOR}"
            )
        if not calls:
            return from_triton(files, kernels, fmt="folder: " + triton_kernels.describe(kernels))
        cand = from_build_calls(files, calls, backend="cpu", fmt="folder: " + build_calls.describe(calls))
        return _with_triton(cand, kernels)
    try:
        manifest = json.loads(manifest_path.read_text())
        build = code_pb2.BuildManifest(**manifest)
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"{manifest_path}: {exc}") from exc
    sources = [code_pb2.SourceFile(path=p, content=c) for p, c in files.items()]
    cand = code_pb2.Candidate(
        schema_version=1, files=sources, build=build, entry=ENTRY, format=FOLDER_WITH_MANIFEST
    )
    calls = build_calls.find(files[ENTRY], files) if ENTRY in files else []
    if calls:
        # The manifest's extension is imported by name; the entry's own build calls are served as well.
        served = from_build_calls(files, calls, backend=build.backend)
        cand.extra_builds.extend([served.build, *served.extra_builds])
        known = set(files)
        cand.files.extend(f for f in served.files if f.path not in known)
        cand.format = f"{FOLDER_WITH_MANIFEST} + {build_calls.describe(calls)}"
    validate(cand)
    return cand


def builds(candidate: code_pb2.Candidate) -> list[code_pb2.BuildManifest]:
    """Every extension the candidate needs built: the manifest's, then the further ones (none for Triton)."""
    if not candidate.build.extension_name and not candidate.extra_builds:
        return []
    return [candidate.build, *candidate.extra_builds]


def is_triton(candidate: code_pb2.Candidate) -> bool:
    """Whether the candidate's entry defines Triton kernels (alone or beside extensions)."""
    entry = file_map(candidate).get(candidate.entry or ENTRY, "")
    try:
        return bool(triton_kernels.find(entry))
    except InvalidRequest:
        return False


def from_triton(
    files: dict[str, str], kernels: list[triton_kernels.TritonKernel], fmt: str = ""
) -> code_pb2.Candidate:
    """A Triton candidate: its files as written and no build entry (its kernels compile on first launch)."""
    cand = code_pb2.Candidate(
        schema_version=1,
        files=[code_pb2.SourceFile(path=p, content=c) for p, c in files.items()],
        entry=ENTRY,
        coder="kernelbench-file",
        format=fmt or triton_kernels.describe(kernels),
    )
    validate(cand)
    return cand


def _with_triton(cand: code_pb2.Candidate, kernels: list[triton_kernels.TritonKernel]) -> code_pb2.Candidate:
    """An extension candidate whose entry also defines Triton kernels names both in its format."""
    if kernels:
        cand.format += " + " + triton_kernels.describe(kernels)
    return cand


def from_build_calls(
    files: dict[str, str], calls: list[build_calls.BuildCall], backend: str, fmt: str = ""
) -> code_pb2.Candidate:
    """A candidate that keeps its entry as written: one build entry per extension its build calls ask for,
    each served (by name and argument digest) from the Verifier's build when the call runs."""
    by_name: dict[str, build_calls.BuildCall] = {}
    for call in calls:
        first = by_name.setdefault(call.name, call)
        if first.digest != call.digest:
            raise InvalidRequest(
                f"the build calls at lines {first.line} and {call.line} both name extension {call.name!r} "
                "but ask for different sources or flags"
            )
    out = dict(files)
    manifests: list[code_pb2.BuildManifest] = []
    for call in by_name.values():
        for path, text in call.files:
            out.setdefault(path, text)
        manifests.append(
            code_pb2.BuildManifest(
                extension_name=call.name,
                sources=[p for p, _ in call.files],
                cflags=call.cflags,
                cuda_cflags=call.cuda_cflags,
                ldflags=call.ldflags,
                backend="cuda" if call.with_cuda else backend,
                call_digest=call.digest,
            )
        )
    cand = code_pb2.Candidate(
        schema_version=1,
        files=[code_pb2.SourceFile(path=p, content=c) for p, c in out.items()],
        build=manifests[0],
        extra_builds=manifests[1:],
        entry=ENTRY,
        coder="kernelbench-file",
        format=fmt or build_calls.describe(calls),
    )
    validate(cand)
    return cand


def validate(candidate: code_pb2.Candidate) -> None:
    files = file_map(candidate)
    entry = candidate.entry or ENTRY
    if entry not in files:
        raise InvalidRequest(f"candidate has no {entry}")
    if not builds(candidate) and not is_triton(candidate):
        raise InvalidRequest(f"candidate has no extension to build and {entry} defines no @triton.jit kernel")
    names: set[str] = set()
    for build in builds(candidate):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,100}", build.extension_name):
            raise InvalidRequest(f"invalid extension name: {build.extension_name!r}")
        if build.extension_name in names:
            raise InvalidRequest(f"two builds name the extension {build.extension_name!r}")
        names.add(build.extension_name)
        if build.backend not in ("cpu", "cuda"):
            raise InvalidRequest(f"build backend must be cpu or cuda, not {build.backend!r}")
        for src in build.sources:
            if src not in files:
                raise InvalidRequest(f"build source {src} is not among the candidate's files")


def export_standalone(candidate: code_pb2.Candidate) -> str:
    """model_new.py rewritten to build its own extension from sources embedded in the file."""
    files = file_map(candidate)
    entry = files[candidate.entry or ENTRY]
    if not builds(candidate):
        return entry  # a Triton candidate is self-contained already: its kernels compile on first launch
    name = candidate.build.extension_name
    embedded = {src: files[src] for src in candidate.build.sources}
    # Headers the sources include travel with them.
    embedded.update({p: c for p, c in files.items() if p.endswith((".h", ".cuh", ".hpp"))})
    src_dir = "stitchcuda-" + content_hash(candidate)[:16]
    # CUTLASS templates in the sources: its headers from the nvidia-cutlass package where this file runs.
    uses_cutlass = candidate.build.backend == "cuda" and cutlass.used_by(embedded.values())
    cutlass_lines = (
        [
            "import importlib.util as _ilu",
            "",
            "_CUTLASS = _ilu.find_spec('cutlass_library')",
            "if _CUTLASS is None:",
            "    raise ImportError('this program instantiates CUTLASS templates: '",
            "                      'pip install nvidia-cutlass')",
            "_CUTLASS_FLAGS = ['-I' + _os.path.join(list(_CUTLASS.submodule_search_locations)[0], 'source', "
            "'include')]",
            "",
        ]
        if uses_cutlass
        else []
    )
    loader = "\n".join(
        [
            "import os as _os",
            "import tempfile as _tempfile",
            "",
            "from torch.utils.cpp_extension import load as _load",
            "",
            *cutlass_lines,
            f"_SOURCES = {embedded!r}",
            f"_SRC_DIR = _os.path.join(_tempfile.gettempdir(), {src_dir!r})",
            "_os.makedirs(_SRC_DIR, exist_ok=True)",
            "for _path, _text in _SOURCES.items():",
            "    with open(_os.path.join(_SRC_DIR, _path), 'w') as _fh:",
            "        _fh.write(_text)",
            "ext = _load(",
            f"    name={name!r},",
            f"    sources=[_os.path.join(_SRC_DIR, s) for s in {list(candidate.build.sources)!r}],",
            f"    extra_cflags={list(candidate.build.cflags)!r},",
            f"    extra_cuda_cflags={list(candidate.build.cuda_cflags)!r}"
            f"{' + _CUTLASS_FLAGS' if uses_cutlass else ''},",
            f"    extra_ldflags={list(candidate.build.ldflags)!r},",
            "    verbose=False,",
            ")",
        ]
    )
    line = import_line(name)
    if line not in entry:
        raise InvalidRequest(f"{ENTRY} does not contain {line!r}")
    header = (
        '"""Generated by StitchCUDA: a KernelBench-style ModelNew with its extension sources embedded."""\n\n'
    )
    return header + entry.replace(line, loader, 1)


def _literal(node: ast.expr, names: dict[str, ast.expr]) -> object:
    if isinstance(node, ast.Name) and node.id in names:
        return _literal(names[node.id], names)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left, names), _literal(node.right, names)
        if isinstance(left, str) and isinstance(right, str):
            return left + right
        if isinstance(left, list) and isinstance(right, list):
            return left + right
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e, names) for e in node.elts]
    return ast.literal_eval(node)


def from_kernelbench_source(source: str, backend: str) -> code_pb2.Candidate:
    """Converts a single-file KernelBench candidate that builds its extensions with torch.utils.cpp_extension.

    One module-level `ext = load_inline(...)` becomes files + manifest with the import line in its place (the
    form the Coder writes); any other use of load_inline/load (in __init__, in a cached helper, several
    extensions) keeps the file as written, with one build entry per extension (`from_build_calls`). The
    arguments must be literals or constants: the Verifier builds every extension itself (so a candidate can
    never catch its own build failure), which needs them statically.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise InvalidRequest(f"candidate does not parse: line {exc.lineno}: {exc.msg}") from exc
    found = build_calls.find(source, {})
    kernels = triton_kernels.find(source)
    if not found and kernels:
        return from_triton({ENTRY: source}, kernels)
    if not found:
        raise InvalidRequest(
            "no torch.utils.cpp_extension build call and no @triton.jit kernel found; "
            f"looked for {LOOKED_FOR}"
        )
    fmt = build_calls.describe(found)
    if kernels:
        fmt += " + " + triton_kernels.describe(kernels)
    top = [
        s
        for s in tree.body
        if isinstance(s, ast.Assign)
        and len(s.targets) == 1
        and isinstance(s.targets[0], ast.Name)
        and isinstance(s.value, ast.Call)
        and s.value.lineno == found[0].line
    ]
    if len(found) != 1 or found[0].kind != "load_inline" or not top:
        return from_build_calls({ENTRY: source}, found, backend, fmt)
    names: dict[str, ast.expr] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            names[stmt.targets[0].id] = stmt.value
    call = top[0].value
    assert isinstance(call, ast.Call)
    kwargs: dict[str, object] = {}
    try:
        for kw in call.keywords:
            if kw.arg:
                kwargs[kw.arg] = _literal(kw.value, names)
    except (ValueError, TypeError, SyntaxError) as exc:
        raise InvalidRequest(f"load_inline arguments must be literals or module constants: {exc}") from exc

    def as_text(value: object) -> str:
        if isinstance(value, list):
            return "\n".join(str(v) for v in value)
        return str(value or "")

    cpp = as_text(kwargs.get("cpp_sources"))
    cuda = as_text(kwargs.get("cuda_sources"))
    raw_functions = kwargs.get("functions") or []
    functions = [raw_functions] if isinstance(raw_functions, str) else [str(f) for f in raw_functions]  # type: ignore[attr-defined]
    ext_name = re.sub(r"\W", "_", str(kwargs.get("name") or "kb_ext"))
    if cpp and functions and "PYBIND11_MODULE" not in cpp + cuda:
        binds = "\n".join(f'  m.def("{f}", &{f}, "{f}");' for f in functions)
        cpp += f"\n\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{binds}\n}}\n"
    prelude = "#include <torch/extension.h>\n"
    files: list[code_pb2.SourceFile] = [code_pb2.SourceFile(path="binding.cpp", content=prelude + cpp)]
    sources = ["binding.cpp"]
    if cuda:
        files.append(code_pb2.SourceFile(path="kernels.cu", content=cuda))
        sources.append("kernels.cu")
        backend = "cuda"

    # The load_inline assignment becomes the import line, and the imports of the JIT builder go (the
    # Verifier builds; a candidate that imports the builder itself is flagged); the rest stays as written.
    lines = source.splitlines()
    stmt = next(s for s in tree.body if any(n is call for n in ast.walk(s)))
    target = "ext"
    if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
        target = stmt.targets[0].id
    replacement = [import_line(ext_name)]
    edits = {stmt.lineno - 1: (stmt.end_lineno or stmt.lineno, replacement)}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "torch.utils.cpp_extension":
            edits[node.lineno - 1] = (node.end_lineno or node.lineno, [])
    kept: list[str] = []
    index = 0
    while index < len(lines):
        if index in edits:
            end, new_lines = edits[index]
            kept.extend(new_lines)
            index = end
        else:
            kept.append(lines[index])
            index += 1
    entry = "\n".join(kept) + "\n"
    if target != "ext":
        # The one import line names the module `ext`; uses of the candidate's own name follow it.
        entry = re.sub(rf"\b{re.escape(target)}\b", "ext", entry)
    files.insert(0, code_pb2.SourceFile(path=ENTRY, content=entry))

    def flags(key: str) -> list[str]:
        value = kwargs.get(key) or []
        return [str(v) for v in value] if isinstance(value, list) else [str(value)]

    build = code_pb2.BuildManifest(
        extension_name=ext_name,
        sources=sources,
        cflags=flags("extra_cflags"),
        cuda_cflags=flags("extra_cuda_cflags"),
        ldflags=flags("extra_ldflags"),
        backend=backend,
    )
    cand = code_pb2.Candidate(
        schema_version=1, files=files, build=build, entry=ENTRY, coder="kernelbench-file", format=fmt
    )
    validate(cand)
    return cand
