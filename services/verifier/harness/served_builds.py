"""Serves a candidate's own cpp_extension build calls from the Verifier's build (stdlib only, in the sandbox).

The parent found every load_inline/load call statically, built each extension with its builder and put the
results on the import path. Here the two build functions are replaced before the candidate is imported: a
call returns the prebuilt module of that name when its arguments have the digest the parent computed from the
source, so nothing builds twice and the candidate never builds (or catches a build failure) itself. A call
for another extension, or with arguments changed at run time, is a REJECT.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import Any


def call_digest(
    kind: str,
    name: str,
    texts: list[list[str]],
    functions: list[str],
    cflags: list[str],
    cuda_cflags: list[str],
    ldflags: list[str],
) -> str:
    """Must equal stitchcuda.shared.build_calls.call_digest (a unit test keeps them equal)."""
    doc = [kind, name, texts, functions, cflags, cuda_cflags, ldflags]
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return "\n".join(str(v) for v in value)


def _strings(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def install(
    cpp_extension: Any,
    modules: dict[str, Any],
    served: dict[str, str],
    cand_dir: str,
    refuse: Callable[[str], None],
) -> None:
    """Replaces cpp_extension.load_inline and load with functions that hand out the prebuilt modules."""

    def serve(kind: str, name: Any, texts: list[list[str]], functions: Any, flags: tuple[Any, ...]) -> Any:
        want = served.get(str(name))
        if want is None:
            msg = f"{kind}(name={name!r}) asks for an extension the Verifier did not find in the source"
            refuse(msg)
            raise RuntimeError(msg)
        if isinstance(functions, dict):
            functions = list(functions)
        got = call_digest(kind, str(name), texts, _strings(functions), *(_strings(f) for f in flags))
        if got != want:
            msg = (
                f"{kind}(name={name!r}) asks at run time for other sources or flags than the Verifier "
                "read from the source and built"
            )
            refuse(msg)
            raise RuntimeError(msg)
        return modules[str(name)]

    def load_inline(
        name: str,
        cpp_sources: Any,
        cuda_sources: Any = None,
        functions: Any = None,
        extra_cflags: Any = None,
        extra_cuda_cflags: Any = None,
        extra_ldflags: Any = None,
        extra_include_paths: Any = None,
        build_directory: Any = None,
        verbose: bool = False,
        with_cuda: Any = None,
        is_python_module: bool = True,
        with_pytorch_error_handling: bool = True,
        keep_intermediates: bool = True,
        use_pch: bool = False,
    ) -> Any:
        texts = [["cpp", _text(cpp_sources)], ["cuda", _text(cuda_sources)]]
        return serve("load_inline", name, texts, functions, (extra_cflags, extra_cuda_cflags, extra_ldflags))

    def load(
        name: str,
        sources: Any,
        extra_cflags: Any = None,
        extra_cuda_cflags: Any = None,
        extra_ldflags: Any = None,
        extra_include_paths: Any = None,
        build_directory: Any = None,
        verbose: bool = False,
        with_cuda: Any = None,
        is_python_module: bool = True,
        is_standalone: bool = False,
        keep_intermediates: bool = True,
    ) -> Any:
        texts = []
        for raw in [sources] if isinstance(sources, str | os.PathLike) else list(sources):
            path = os.fspath(raw)
            if not os.path.isabs(path) and not os.path.exists(path):
                path = os.path.join(cand_dir, path)
            with open(path) as fh:
                texts.append([path.rsplit(".", 1)[-1], fh.read()])
        return serve("load", name, texts, None, (extra_cflags, extra_cuda_cflags, extra_ldflags))

    cpp_extension.load_inline = load_inline
    cpp_extension.load = load
