"""The ArtifactStore port, its local-directory and in-memory adapters, and the artifact key scheme."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Protocol

from stitchcuda.shared.errors import InvalidRequest, NotFound

_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/]*$")


def check_key(key: str) -> str:
    """Keys are relative, '/'-separated, without '..': a tenant can never name another tenant's prefix."""
    if not _KEY.match(key) or ".." in key.split("/") or "//" in key or len(key) > 900:
        raise InvalidRequest(f"invalid artifact key: {key!r}")
    return key


class ArtifactStore(Protocol):
    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> None: ...

    def get(self, key: str) -> bytes: ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str) -> list[str]: ...

    def delete(self, key: str) -> None: ...


class MemoryArtifactStore:
    """For unit tests: a dict behind a lock."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        with self._lock:
            self._data[check_key(key)] = bytes(data)

    def get(self, key: str) -> bytes:
        with self._lock:
            try:
                return self._data[check_key(key)]
            except KeyError:
                raise NotFound(f"artifact not found: {key}") from None

    def exists(self, key: str) -> bool:
        with self._lock:
            return check_key(key) in self._data

    def list(self, prefix: str) -> list[str]:
        with self._lock:
            return sorted(k for k in self._data if k.startswith(prefix))

    def delete(self, key: str) -> None:
        with self._lock:
            self._data.pop(check_key(key), None)


class LocalArtifactStore:
    """A directory on disk; writes are atomic (temp file + rename) so readers never see half a file."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise NotFound(f"artifact not found: {key}") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        out = []
        for path in self.root.rglob("*"):
            if path.is_file() and not path.name.startswith(".tmp-"):
                rel = path.relative_to(self.root).as_posix()
                if rel.startswith(prefix):
                    out.append(rel)
        return sorted(out)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


def sha256_hex(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()


class Keys:
    """Deterministic artifact keys: the same job, round and candidate always map to the same key."""

    @staticmethod
    def job(tenant: str, job_id: str) -> str:
        return f"tenants/{tenant}/jobs/{job_id}"

    @staticmethod
    def reference(tenant: str, job_id: str) -> str:
        return f"{Keys.job(tenant, job_id)}/reference.py"

    @staticmethod
    def plan(tenant: str, job_id: str, replan: int = 0) -> str:
        return f"{Keys.job(tenant, job_id)}/plan-{replan}.pb"

    @staticmethod
    def candidate(tenant: str, job_id: str, round_: int, index: int) -> str:
        return f"{Keys.job(tenant, job_id)}/rounds/{round_:03d}/candidate-{index}.pb"

    @staticmethod
    def verdict(tenant: str, job_id: str, round_: int, index: int) -> str:
        return f"{Keys.job(tenant, job_id)}/rounds/{round_:03d}/verdict-{index}.pb"

    @staticmethod
    def trajectory(tenant: str, job_id: str) -> str:
        return f"{Keys.job(tenant, job_id)}/trajectory.json"

    @staticmethod
    def result(tenant: str, job_id: str, name: str) -> str:
        return f"{Keys.job(tenant, job_id)}/result/{name}"

    @staticmethod
    def tuned(tenant: str, device: str, problem: str) -> str:
        # The best variant a tenant's jobs verified for one problem (reference and policy hash) and device.
        return f"tenants/{tenant}/tuned/{device}/{problem}.json"

    @staticmethod
    def build_cache(content_hash: str) -> str:
        # Shared by all tenants: the key is a hash of the sources, flags and toolchain, so a hit
        # reveals nothing a tenant did not already hold.
        return f"cache/builds/{content_hash}.tar.gz"

    @staticmethod
    def object_cache(content_hash: str) -> str:
        # One compiled unit shared by builds (services/verifier/build.py): keyed, like a build, by content.
        return f"cache/objects/{content_hash}.o"
