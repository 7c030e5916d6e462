"""Turns an LLM answer into a candidate program, or says precisely why it cannot.

Accepted forms, tried in order: a JSON object (the structured-output schema, bare or in a ```json
block); fenced code blocks with file names (```cuda forward.cu, or a `// file: x.cu` first line, or a
heading naming the file just above the block); a single KernelBench-style Python file that calls
load_inline. The result must have a model_new.py with exactly one `import <ext> as ext` line, at least
one C++/CUDA source, and a PYBIND11_MODULE binding.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

from stitchcuda.api.v1 import code_pb2
from stitchcuda.shared.candidate import ENTRY, SOURCE_SUFFIXES, from_kernelbench_source, validate
from stitchcuda.shared.errors import InvalidRequest

CPU_FLAGS = {"cflags": ["-O3", "-fopenmp", "-std=c++17"], "cuda_cflags": [], "ldflags": ["-fopenmp"]}
CUDA_FLAGS = {
    "cflags": ["-O3", "-std=c++17"],
    "cuda_cflags": ["-O3", "-std=c++17", "--expt-relaxed-constexpr"],
    "ldflags": [],
}

CANDIDATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "rationale": {"type": "string"},
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
        "cflags": {"type": "array", "items": {"type": "string"}},
        "cuda_cflags": {"type": "array", "items": {"type": "string"}},
        "ldflags": {"type": "array", "items": {"type": "string"}},
        "libraries": {"type": "array", "items": {"type": "string", "enum": ["cublas", "cudnn"]}},
    },
    "required": ["files"],
}

_FENCE = re.compile(r"^```[ \t]*([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
_FILE_HINT = re.compile(r"(?:^|\s|`|\*\*)([A-Za-z0-9_./-]+\.(?:py|cpp|cc|cu|cuh|h|hpp))\b")
_FIRST_LINE_FILE = re.compile(
    r"^\s*(?://|#)\s*(?:file(?:name)?\s*[:=]\s*)?([A-Za-z0-9_./-]+\.(?:py|cpp|cc|cu|cuh|h|hpp))\s*$", re.I
)
_IMPORT = re.compile(r"^import\s+([A-Za-z_][A-Za-z0-9_]*)\s+as\s+ext\s*$", re.M)
_LANG_SUFFIX = {"python": ".py", "py": ".py", "cpp": ".cpp", "c++": ".cpp", "cxx": ".cpp", "cc": ".cpp",
                "cuda": ".cu", "cu": ".cu", "c": ".cpp", "h": ".h", "hpp": ".h"}  # fmt: skip


class ParseError(ValueError):
    """The answer holds no usable program; the message is the reason recorded on the candidate."""


@dataclass
class Parsed:
    files: dict[str, str]
    build: code_pb2.BuildManifest
    rationale: str = ""
    form: str = ""
    notes: list[str] = field(default_factory=list)


def _json_payload(text: str) -> dict[str, Any] | None:
    stripped = text.strip()
    candidates = [stripped]
    candidates += [body for lang, body in _FENCE.findall(text) if lang.strip().lower() in ("json", "")]
    for chunk in candidates:
        if not chunk.startswith("{"):
            continue
        try:
            value = json.loads(chunk)
        except ValueError:
            continue
        if isinstance(value, dict) and "files" in value:
            return value
    return None


def _files_from_json(payload: dict[str, Any]) -> dict[str, str]:
    raw = payload.get("files")
    files: dict[str, str] = {}
    if isinstance(raw, dict):
        items = list(raw.items())
    elif isinstance(raw, list):
        items = []
        for entry in raw:
            if not isinstance(entry, dict) or "path" not in entry or "content" not in entry:
                raise ParseError("JSON answer: every entry of 'files' needs 'path' and 'content'")
            items.append((entry["path"], entry["content"]))
    else:
        raise ParseError("JSON answer: 'files' must be a list of {path, content}")
    for path, content in items:
        if not isinstance(path, str) or not isinstance(content, str):
            raise ParseError("JSON answer: file paths and contents must be strings")
        files[path.strip()] = content
    return files


def _files_from_fences(text: str) -> dict[str, str]:
    files: dict[str, str] = {}
    for match in _FENCE.finditer(text):
        info, body = match.group(1).strip(), match.group(2)
        words = info.split()
        lang = words[0].lower() if words else ""
        name = ""
        for w in words[1:] if words else []:
            w = w.split("=", 1)[-1].strip("\"'")
            if _FILE_HINT.fullmatch(" " + w) or re.fullmatch(r"[A-Za-z0-9_./-]+\.\w+", w):
                name = w
        if not name and _FILE_HINT.fullmatch(" " + info):
            name, lang = info, ""
        first = body.splitlines()[0] if body.strip() else ""
        hint = _FIRST_LINE_FILE.match(first)
        if not name and hint:
            name = hint.group(1)
        if not name:
            # A heading or sentence just above the block that names a file.
            before = text[: match.start()].rstrip().splitlines()[-1:] if match.start() else []
            found = _FILE_HINT.findall(before[0]) if before else []
            if found:
                name = found[-1]
        if not name:
            suffix = _LANG_SUFFIX.get(lang)
            if suffix is None:
                continue
            if suffix == ".py":
                name = ENTRY if ENTRY not in files else f"extra_{len(files)}.py"
            else:
                name = f"kernels{'' if not any(p.endswith(suffix) for p in files) else len(files)}{suffix}"
        files[name] = body
    return files


def _extension_name(model_new: str) -> str:
    found = _IMPORT.findall(model_new)
    if len(found) != 1:
        raise ParseError(
            f"model_new.py must contain exactly one top-level line `import <extension_name> as ext` "
            f"(found {len(found)})"
        )
    return str(found[0])


def _check_python(model_new: str) -> None:
    try:
        tree = ast.parse(model_new)
    except SyntaxError as exc:
        raise ParseError(f"model_new.py does not parse: line {exc.lineno}: {exc.msg}") from exc
    if not any(isinstance(s, ast.ClassDef) and s.name == "ModelNew" for s in tree.body):
        raise ParseError("model_new.py defines no class ModelNew")


def _flags(payload: dict[str, Any] | None, key: str, default: list[str]) -> list[str]:
    if payload and isinstance(payload.get(key), list) and all(isinstance(x, str) for x in payload[key]):
        return list(payload[key])
    return list(default)


def parse_answer(text: str, *, backend: str) -> Parsed:
    """Parses one answer for a "cpu" or "cuda" target; raises ParseError with the reason."""
    if not text or not text.strip():
        raise ParseError("the answer is empty")
    payload = _json_payload(text)
    form = "json" if payload is not None else "fenced"
    files = _files_from_json(payload) if payload is not None else _files_from_fences(text)
    if not files:
        # Last form: one KernelBench-style Python file with load_inline.
        raise ParseError("the answer contains no JSON candidate and no fenced code blocks")
    py = {p: c for p, c in files.items() if p.endswith(".py")}
    if ENTRY not in files and len(py) == 1:
        only = next(iter(py))
        files[ENTRY] = files.pop(only)
    if ENTRY not in files:
        raise ParseError(f"the answer has no {ENTRY}")
    if "load_inline" in files[ENTRY] and not any(p.endswith(SOURCE_SUFFIXES) for p in files):
        try:
            cand = from_kernelbench_source(files[ENTRY], backend)
        except InvalidRequest as exc:
            raise ParseError(f"single-file answer: {exc}") from exc
        parsed_files = {f.path: f.content for f in cand.files}
        _check_python(parsed_files[ENTRY])
        return Parsed(
            parsed_files, cand.build, payload.get("rationale", "") if payload else "", "kernelbench"
        )
    _check_python(files[ENTRY])
    ext_name = _extension_name(files[ENTRY])
    sources = sorted(p for p in files if p.endswith((".cpp", ".cc", ".cu")))
    if not sources:
        raise ParseError("the answer has no C++/CUDA source file")
    if not any("PYBIND11_MODULE" in files[p] for p in sources):
        raise ParseError("no source defines the PYBIND11_MODULE binding")
    for path in files:
        if ".." in path.split("/") or path.startswith("/"):
            raise ParseError(f"file path escapes the candidate folder: {path}")
    target = "cuda" if any(p.endswith(".cu") for p in sources) else backend
    if target == "cuda" and backend == "cpu":
        raise ParseError("the target is the CPU but the answer contains CUDA sources")
    defaults = CUDA_FLAGS if target == "cuda" else CPU_FLAGS
    build = code_pb2.BuildManifest(
        extension_name=ext_name,
        sources=sources,
        cflags=_flags(payload, "cflags", defaults["cflags"]),
        cuda_cflags=_flags(payload, "cuda_cflags", defaults["cuda_cflags"]),
        ldflags=_flags(payload, "ldflags", defaults["ldflags"]),
        backend=target,
        libraries=_flags(payload, "libraries", []),
    )
    cand = code_pb2.Candidate(
        files=[code_pb2.SourceFile(path=p, content=c) for p, c in files.items()], build=build, entry=ENTRY
    )
    try:
        validate(cand)
    except InvalidRequest as exc:
        raise ParseError(str(exc)) from exc
    rationale = str(payload.get("rationale", "")) if payload else _prose(text)
    return Parsed(files, build, rationale, form)


def _prose(text: str) -> str:
    """The answer's text outside code blocks, shortened: the model's own rationale."""
    outside = _FENCE.sub("", text).strip()
    return re.sub(r"\s+", " ", outside)[:1000]
