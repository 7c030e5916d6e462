"""Builds candidate extensions in a sandbox, cached by content hash behind the ArtifactStore port.

A candidate that builds several extensions (several load_inline/load calls) gets each built and cached on its
own (from its sources and the candidate's headers only, so candidates sharing an extension share its build),
then one folder holding every .so. The cache key covers the sources and headers, the manifest (name, flags,
backend), the CUDA arch list
and the toolchain (torch, CUDA, compiler, Python ABI), never model_new.py: candidates that differ only in
their Python glue share one build. A build is a tar.gz of the built .so under Keys.build_cache(key).

Inside a build, a unit that instantiates CUTLASS/CuTe templates (most of a build's compile time) is compiled
once per content: its object is kept under Keys.object_cache(key), keyed by the unit's text, the candidate's
headers it includes, the flags and the toolchain, and a later build whose unit is the same links that object
instead of compiling it again (the built-in Coder's GEMM unit is the same in every program it writes). Only
the Verifier's builds write the objects; a candidate's run never sees them.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stitchcuda.api.v1 import code_pb2, verify_pb2
from stitchcuda.shared import cutlass
from stitchcuda.shared.artifacts import ArtifactStore, Keys, sha256_hex
from stitchcuda.shared.candidate import ENTRY, builds
from stitchcuda.shared.errors import NotFound
from stitchcuda.verifier.sandbox import Mount, RunSpec, Sandbox
from stitchcuda.verifier.settings import VerifierSettings

log = logging.getLogger("stitchcuda.verifier.build")

FAILURE = "build-error.json"
# The build of a candidate with no extension (Triton kernels compile on first launch, inside the run).
NO_EXTENSION = "no-extension"
_ERROR_PATTERNS = [
    re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:\d+:)?\s*(?:fatal )?error:\s*(?P<msg>.+)$"),
    re.compile(r"^(?P<file>[^\s(]+)\((?P<line>\d+)\):\s*(?:catastrophic )?error:?\s*(?P<msg>.+)$"),
]
_LINK_PATTERNS = [
    re.compile(r"undefined reference to [`'](?P<msg>[^']+)'"),
    re.compile(r"undefined symbol: (?P<msg>\S+)"),
    re.compile(r"(?P<msg>ld returned \d+ exit status)"),
]


@functools.cache
def _tool_version(*cmd: str) -> str:
    try:
        res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30, check=False)
        lines = (res.stdout or res.stderr).strip().splitlines()
        return lines[-1] if cmd[0].endswith("nvcc") and lines else (lines[0] if lines else "")
    except (OSError, subprocess.TimeoutExpired):
        return ""


def toolchain(backend: str, arch_list: str) -> dict[str, str]:
    import torch

    info = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda or "",
        "python": sysconfig.get_config_var("SOABI") or sys.version,
        "cxx": _tool_version(os.environ.get("CXX", "c++"), "--version"),
        "abi": str(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", "")),
    }
    if backend == "cuda":
        info["nvcc"] = _tool_version(shutil.which("nvcc") or "nvcc", "--version")
        info["arch"] = arch_list
    return info


def _native_sources(candidate: code_pb2.Candidate) -> list[str]:
    """The texts of the candidate's C++/CUDA files (sources and headers), not its Python."""
    return [f.content for f in candidate.files if not f.path.endswith(".py")]


def cutlass_flags(candidate: code_pb2.Candidate) -> list[str]:
    """CUTLASS's include folder for a build whose sources include its headers (shared/cutlass.py): the
    build environment provides CUTLASS as it provides torch, so a candidate names no machine's path."""
    return cutlass.build_flags(_native_sources(candidate))


def cache_key(candidate: code_pb2.Candidate, arch_list: str) -> str:
    build = candidate.build
    entry = candidate.entry or ENTRY
    files = {
        f.path: sha256_hex(f.content)
        for f in candidate.files
        if f.path != entry and not f.path.endswith(".py")
    }
    doc = {
        "name": build.extension_name,
        "backend": build.backend,
        "sources": list(build.sources),
        "cflags": list(build.cflags),
        "cuda_cflags": list(build.cuda_cflags),
        "ldflags": list(build.ldflags),
        "files": files,
        "toolchain": toolchain(build.backend, arch_list),
    }
    if cutlass.used_by(_native_sources(candidate)):
        doc["cutlass"] = cutlass.version()
    return sha256_hex(json.dumps(doc, sort_keys=True))


# What makes a unit's object differ between two builds of the same text and flags: the extension's name (the
# only flag cpp_extension varies per build) and relocatable device code (objects then need a device link).
_NAMED = re.compile(r"\b(?:TORCH_EXTENSION_NAME|PYBIND11_MODULE)\b")
_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
_RELOCATABLE = re.compile(r"^(?:-rdc|--relocatable-device-code|-dc|--device-c)\b")


def _reads(path: str, texts: dict[str, str]) -> list[str]:
    """The candidate's files a source reads: itself and, transitively, the candidate's headers it includes
    (by path beside it or by name)."""
    by_name: dict[str, str] = {}
    for name in texts:
        by_name.setdefault(os.path.basename(name), name)
    seen = [path]
    for current in seen:
        for inc in _QUOTED_INCLUDE.findall(texts.get(current, "")):
            beside = os.path.normpath(os.path.join(os.path.dirname(current), inc))
            found = beside if beside in texts else by_name.get(os.path.basename(inc))
            if found and found not in seen:
                seen.append(found)
    return seen


def shared_units(candidate: code_pb2.Candidate) -> dict[str, list[str]]:
    """The sources whose compiled objects later builds may share (each with the candidate's files it reads):
    units that include CUTLASS and never expand the extension's name. None where the build has no other
    source (the object is then the whole build, cached as such) or compiles relocatable device code."""
    build = candidate.build
    if len(build.sources) < 2 or any(_RELOCATABLE.match(f) for f in [*build.cflags, *build.cuda_cflags]):
        return {}
    texts = {f.path: f.content for f in candidate.files if not f.path.endswith(".py")}
    units = {}
    for source in build.sources:
        if source not in texts or not cutlass.used_by([texts[source]]):
            continue
        reads = _reads(source, texts)
        if not any(_NAMED.search(texts[p]) for p in reads if p in texts):
            units[source] = reads
    if len(units) == len(build.sources):
        units.pop(build.sources[-1])
    return units


def object_key(candidate: code_pb2.Candidate, source: str, reads: list[str], arch_list: str) -> str:
    """The content key of one unit's object: its text, the headers it reads, the flags, the toolchain."""
    build = candidate.build
    texts = {f.path: f.content for f in candidate.files}
    doc = {
        "unit": source,
        "files": {p: sha256_hex(texts[p]) for p in reads if p in texts},
        "backend": build.backend,
        "cflags": list(build.cflags),
        "cuda_cflags": list(build.cuda_cflags),
        "toolchain": toolchain(build.backend, arch_list),
        "cutlass": cutlass.version(),
    }
    return sha256_hex(json.dumps(doc, sort_keys=True))


def object_name(source: str, with_cuda: bool) -> str:
    """The object cpp_extension writes for a source in the build folder (`k.cu` -> `k.cuda.o`)."""
    stem, ext = os.path.splitext(os.path.basename(source))
    return f"{stem}.cuda.o" if with_cuda and ext in (".cu", ".cuh") else f"{stem}.o"


def split(candidate: code_pb2.Candidate) -> list[code_pb2.Candidate]:
    """One single-extension candidate per extension; with several, each keeps only its sources and headers."""
    manifests = builds(candidate)
    if len(manifests) == 1:
        return [candidate]
    headers = (".h", ".cuh", ".hpp")
    out = []
    for manifest in manifests:
        mine = set(manifest.sources)
        files = [f for f in candidate.files if f.path in mine or f.path.endswith(headers)]
        out.append(code_pb2.Candidate(files=files, build=manifest, entry=candidate.entry))
    return out


# A logged warning line (glog's "W1206 16:14:30.006 ...", Python's "UserWarning: ..."), never a build error.
_LOG_WARNING = re.compile(r"^(W\d{4} \d\d:\d\d:\d\d|\S*Warning: )")


def first_error(log_text: str, build_dir: str = "") -> str:
    """The first real compiler error, trimmed to `file:line: error: message`."""
    lines = log_text.replace("\\n", "\n").splitlines()
    for line in lines:
        text = line.strip()
        for pattern in _ERROR_PATTERNS:
            m = pattern.match(text)
            if m:
                name = os.path.basename(m.group("file"))
                return f"{name}:{m.group('line')}: error: {m.group('msg').strip()}"[:400]
    for line in lines:
        for pattern in _LINK_PATTERNS:
            m = pattern.search(line)
            if m:
                return f"link error: {m.group(0).strip()}"[:400]
    for line in lines:
        if "error" in line.lower() and "Error building extension" not in line:
            return line.strip().replace(build_dir, "")[:400]
    # No error line: the last line that is not a logged warning (torch's "No CUDA runtime is found" said
    # nothing about why a GPU machine's build failed), or what ninja said last.
    told = [line.strip() for line in lines if line.strip() and not _LOG_WARNING.match(line.strip())]
    return (told[-1] if told else "build failed: the compiler printed no error")[:400]


class Builder:
    """Turns a candidate into a directory holding `<extension_name>.so`, compiling only on a cache miss."""

    def __init__(self, settings: VerifierSettings, artifacts: ArtifactStore, sandbox: Sandbox) -> None:
        self.settings = settings
        self.artifacts = artifacts
        self.sandbox = sandbox
        self.root = settings.build_root()
        self.root.mkdir(parents=True, exist_ok=True)
        self.compiles = 0  # real compilations by this builder (cache misses), for metrics and tests
        self.objects_reused = 0  # shared units linked from their objects instead of compiled

    def key(self, candidate: code_pb2.Candidate) -> str:
        parts = [cache_key(one, self.settings.cuda_arch_list) for one in split(candidate)]
        if not parts:
            return sha256_hex(NO_EXTENSION)
        return parts[0] if len(parts) == 1 else sha256_hex(*parts)

    def local_dir(self, key: str) -> Path:
        return self.root / key

    def build(self, candidate: code_pb2.Candidate) -> tuple[verify_pb2.BuildResult, Path | None]:
        """Every extension of the candidate built (or fetched from the cache); a folder holding every .so.
        Any extension that fails fails the whole build (D1: the candidate never sees a build error)."""
        parts = split(candidate)
        if not parts:
            empty = self.local_dir(NO_EXTENSION)
            empty.mkdir(exist_ok=True)
            return verify_pb2.BuildResult(cache_key=self.key(candidate), ok=True, cached=True), empty
        if len(parts) == 1:
            return self._build_one(parts[0])
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=min(4, len(parts))) as pool:
            done = list(pool.map(self._build_one, parts))
        key = sha256_hex(*(r.cache_key for r, _ in done))
        result = verify_pb2.BuildResult(cache_key=key, ok=True, cached=all(r.cached for r, _ in done))
        for one, (r, _) in zip(parts, done, strict=True):
            if not r.ok:
                name = one.build.extension_name
                result.ok, result.error, result.log_tail = False, f"{name}: {r.error}", r.log_tail
                break
        result.seconds = time.monotonic() - started
        if not result.ok:
            return result, None
        target = self.local_dir(key)
        with self._lock(key):
            if not all((target / f"{b.extension_name}.so").is_file() for b in builds(candidate)):
                staging = Path(tempfile.mkdtemp(dir=self.root, prefix=".stage-"))
                for _, folder in done:
                    for so in folder.glob("*.so") if folder else []:
                        shutil.copy2(so, staging / so.name)
                staging.chmod(0o755)
                shutil.rmtree(target, ignore_errors=True)
                os.replace(staging, target)
        return result, target

    def _build_one(self, candidate: code_pb2.Candidate) -> tuple[verify_pb2.BuildResult, Path | None]:
        started = time.monotonic()
        key = self.key(candidate)
        name = candidate.build.extension_name
        result = verify_pb2.BuildResult(cache_key=key)
        target = self.local_dir(key)
        with self._lock(key):
            hit = (
                (target / f"{name}.so").is_file()
                or (target / FAILURE).is_file()
                or self._fetch(key, target, name)
            )
            if hit and (target / f"{name}.so").is_file():
                result.ok, result.cached = True, True
            elif hit:
                failure = json.loads((target / FAILURE).read_text())
                result.ok, result.cached = False, True
                result.error, result.log_tail = failure.get("error", ""), failure.get("log_tail", "")
            else:
                ok, error, log_tail, deterministic = self._compile(candidate, target)
                result.ok, result.error, result.log_tail = ok, error, log_tail
                if ok or deterministic:
                    self._store(key, target)
        result.seconds = time.monotonic() - started
        return result, (target if result.ok else None)

    @contextlib.contextmanager
    def _lock(self, key: str) -> Iterator[None]:
        path = self.root / f".{key}.lock"
        with open(path, "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _fetch(self, key: str, target: Path, name: str) -> bool:
        try:
            blob = self.artifacts.get(Keys.build_cache(key))
        except NotFound:
            return False
        staging = Path(tempfile.mkdtemp(dir=self.root, prefix=".fetch-"))
        try:
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
                for member in tar.getmembers():
                    if not member.isfile() or "/" in member.name or member.name.startswith("."):
                        continue  # flat archives of plain files only: no links, no paths
                    src = tar.extractfile(member)
                    if src is not None:
                        (staging / member.name).write_bytes(src.read())
            if not (staging / f"{name}.so").is_file() and not (staging / FAILURE).is_file():
                return False
            for path in staging.iterdir():
                path.chmod(0o644)
            staging.chmod(0o755)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
            return True
        except (tarfile.TarError, OSError) as exc:
            log.warning("build cache entry %s is unreadable (%s); rebuilding", key[:12], exc)
            return False
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _store(self, key: str, target: Path) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for path in sorted([*target.glob("*.so"), *target.glob(FAILURE)]):
                tar.add(path, arcname=path.name)
        try:
            self.artifacts.put(Keys.build_cache(key), buf.getvalue(), "application/gzip")
        except Exception as exc:  # a cache we cannot fill only costs a rebuild elsewhere
            log.warning("could not store build %s in the artifact store: %s", key[:12], exc)

    def _compile(self, candidate: code_pb2.Candidate, target: Path) -> tuple[bool, str, str, bool]:
        """(ok, first error, log tail, whether a failure is deterministic and may be cached). Units other
        builds compiled already are linked from their objects; a build that fails linking one is built
        again from sources (an object cache can only ever cost time, never a verdict)."""
        units = shared_units(candidate)
        keys = {
            s: object_key(candidate, s, reads, self.settings.cuda_arch_list) for s, reads in units.items()
        }
        with self._claims(keys) as objects:
            ok, error, tail, deterministic, made = self._compile_with(candidate, target, objects, set(keys))
            if not ok and objects and (error.startswith("link error") or "stitch-objects" in tail):
                log.warning(
                    "build %s failed linking shared objects (%s); building from sources",
                    target.name[:12],
                    error,
                )
                for key in {keys[s] for s in objects}:
                    self._drop_object(key)
                objects = {}
                ok, error, tail, deterministic, made = self._compile_with(
                    candidate, target, objects, set(keys)
                )
            if ok:
                self.objects_reused += len(objects)
                if objects:
                    log.info("build %s: %s linked from shared objects", target.name[:12], ", ".join(objects))
                for source, blob in made.items():
                    self._keep_object(keys[source], blob)
        return ok, error, tail, deterministic

    @contextlib.contextmanager
    def _claims(self, keys: dict[str, str]) -> Iterator[dict[str, Path]]:
        """The shared units' objects there are (by source), holding a claim on each missing one while the
        build compiles it. Builds on this worker that need a unit another is compiling wait for it first
        (four builds of one GEMM unit at once took 80 s each, one alone 31 s); a build
        takes its claims in key order, so two builds never wait on each other."""
        self.objects_dir.mkdir(exist_ok=True)
        held = []
        try:
            # In key order (so two builds never wait on each other): wait out any build compiling a missing
            # unit, then keep the claim where the unit is still missing (this build compiles it).
            for key in sorted(set(keys.values())):
                if self._object(key) is not None:
                    continue
                fh = open(self.objects_dir / f".{key}.lock", "w")  # noqa: SIM115 (held until the build ends)
                fcntl.flock(fh, fcntl.LOCK_EX)
                if self._object(key) is None:
                    held.append(fh)
                else:
                    fh.close()
            objects = {s: obj for s, key in keys.items() if (obj := self._object(key)) is not None}
            yield objects
        finally:
            for fh in held:
                fcntl.flock(fh, fcntl.LOCK_UN)
                fh.close()

    @property
    def objects_dir(self) -> Path:
        return self.root / "objects"

    def _object(self, key: str) -> Path | None:
        """A shared unit's object: this worker's copy, else the artifact store's (kept here then)."""
        local = self.objects_dir / f"{key}.o"
        if local.is_file():
            return local
        try:
            blob = self.artifacts.get(Keys.object_cache(key))
        except NotFound:
            return None
        self._write_object(key, blob)
        return local

    def _drop_object(self, key: str) -> None:
        (self.objects_dir / f"{key}.o").unlink(missing_ok=True)
        try:
            self.artifacts.delete(Keys.object_cache(key))
        except Exception as exc:
            log.warning("could not drop object %s from the artifact store: %s", key[:12], exc)

    def _write_object(self, key: str, blob: bytes) -> None:
        self.objects_dir.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.objects_dir, prefix=".obj-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.objects_dir / f"{key}.o")

    def _keep_object(self, key: str, blob: bytes) -> None:
        self._write_object(key, blob)
        try:
            self.artifacts.put(Keys.object_cache(key), blob, "application/octet-stream")
        except Exception as exc:  # a cache we cannot fill only costs a compile elsewhere
            log.warning("could not store object %s in the artifact store: %s", key[:12], exc)

    def _compile_with(
        self, candidate: code_pb2.Candidate, target: Path, objects: dict[str, Path], shared: set[str]
    ) -> tuple[bool, str, str, bool, dict[str, bytes]]:
        """One sandboxed build, linking `objects` in place of their sources; also returns the objects it
        compiled of the `shared` sources (read out of the build folder, by source) for the object cache."""
        name = candidate.build.extension_name
        with_cuda = candidate.build.backend == "cuda"
        self.compiles += 1
        run_dir = Path(tempfile.mkdtemp(dir=self.root, prefix=".build-"))
        try:
            src = run_dir / "src"
            work = run_dir / "work"
            src.mkdir()
            work.mkdir()
            entry = candidate.entry or ENTRY
            for f in candidate.files:
                if f.path == entry or f.path.endswith(".py"):
                    continue
                path = src / f.path
                if ".." in Path(f.path).parts or Path(f.path).is_absolute():
                    return False, f"source path escapes the candidate folder: {f.path}", "", False, {}
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(f.content)
            linked = work / "stitch-objects"
            linked.mkdir()
            for i, obj in enumerate(objects.values()):
                shutil.copyfile(obj, linked / f"{i}.o")
            for path in [src, *src.rglob("*"), linked, *linked.iterdir()]:
                path.chmod(0o755 if path.is_dir() else 0o644)
            mounts = {"src": Mount(src), "work": Mount(work, writable=True)}
            inside = self.sandbox.paths(mounts)
            out_dir = f"{inside['work']}/out"
            (work / "out").mkdir()
            nonce = os.urandom(8).hex()
            try:
                provided = cutlass_flags(candidate)
            except FileNotFoundError as exc:
                return False, str(exc), "", False, {}
            compiled = [s for s in candidate.build.sources if s not in objects]
            header = {
                "nonce": nonce,
                "name": name,
                "sources": [f"{inside['src']}/{s}" for s in compiled],
                "cflags": [*candidate.build.cflags, *provided],
                "cuda_cflags": [*candidate.build.cuda_cflags, *provided],
                "ldflags": [
                    *candidate.build.ldflags,
                    *(f"{inside['work']}/stitch-objects/{i}.o" for i in range(len(objects))),
                ],
                "build_dir": out_dir,
                "with_cuda": with_cuda,
                "arch_list": self.settings.cuda_arch_list if with_cuda else "",
            }
            spec = RunSpec(
                script="build_ext.py",
                header=header,
                payload=b"",
                mounts=mounts,
                device="cpu",
                timeout_s=self.settings.build_timeout_s,
                memory_bytes=int(self.settings.build_memory_limit_gb * (1 << 30)),
                label="build",
                extra_env={"MAX_JOBS": str(self.settings.build_jobs)},
            )
            outcome = self.sandbox.run(spec)
            record = outcome.first("build")
            if record and record[0].get("ok") and outcome.completed(nonce):
                so = work / "out" / f"{name}.so"
                staging = Path(tempfile.mkdtemp(dir=self.root, prefix=".stage-"))
                shutil.copy2(so, staging / so.name)
                (staging / so.name).chmod(0o644)
                staging.chmod(0o755)
                shutil.rmtree(target, ignore_errors=True)
                os.replace(staging, target)
                made = {}
                for source in shared.intersection(compiled):
                    obj = work / "out" / object_name(source, with_cuda)
                    if obj.is_file():
                        made[source] = obj.read_bytes()
                return True, "", "", True, made
            text = (record[0].get("error", "") if record else "") or outcome.log_tail
            if not record:
                text = f"{outcome.crash_reason()}\n{text}"
            error = first_error(text, str(run_dir))
            if outcome.timed_out:
                error = f"build timed out after {self.settings.build_timeout_s:.0f} s"
            elif outcome.memory_exceeded:
                error = (
                    f"build exceeded its {self.settings.build_memory_limit_gb:g} GiB memory limit "
                    "(STITCH_BUILD_MEMORY_LIMIT_GB); the compiler was killed"
                )
            # Compiler and linker errors repeat on every worker; crashes, kills and timeouts may not.
            deterministic = record is not None and not outcome.timed_out and not outcome.memory_exceeded
            if deterministic:
                target.mkdir(parents=True, exist_ok=True)
                (target / FAILURE).write_text(json.dumps({"error": error, "log_tail": text[-4000:]}))
            return False, error, text[-4000:], deterministic, {}
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
