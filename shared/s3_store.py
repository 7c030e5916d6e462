"""The S3 adapter of the ArtifactStore port (any S3-compatible server, through the `minio` client).

One bucket; keys are used as given (`tenants/<tenant>/jobs/<job>/...`, `cache/builds/<hash>.tar.gz`).
Connection failures and 5xx answers are retried with exponential backoff for a bounded time, then
raised as Unavailable so the queue task retries later instead of failing the job.
"""

from __future__ import annotations

import datetime as dt
import io
import logging
import time
from collections.abc import Callable
from typing import TypeVar

import urllib3
from minio import Minio
from minio.error import InvalidResponseError, S3Error, ServerError

from stitchcuda.shared.artifacts import check_key
from stitchcuda.shared.errors import NotFound, Unavailable
from stitchcuda.shared.settings import CommonSettings

log = logging.getLogger("stitchcuda.s3")

T = TypeVar("T")

_MISSING = frozenset({"NoSuchKey", "NoSuchObject", "NotFound", "ResourceNotFound", "NoSuchBucket"})
_TRANSIENT = frozenset(
    {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "RequestTimeTooSkewed"}
)
MAX_PRESIGN_S = 7 * 24 * 3600


def _split_endpoint(endpoint: str, secure: bool) -> tuple[str, bool]:
    """Accepts "host:port" or a URL ("http://host:port"); the scheme, when given, decides TLS."""
    if endpoint.startswith("https://"):
        return endpoint.removeprefix("https://").rstrip("/"), True
    if endpoint.startswith("http://"):
        return endpoint.removeprefix("http://").rstrip("/"), False
    return endpoint.rstrip("/"), secure


class S3ArtifactStore:
    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        bucket: str,
        *,
        secure: bool = False,
        region: str = "us-east-1",
        public_endpoint: str = "",
        attempts: int = 5,
        backoff_s: float = 0.2,
        max_backoff_s: float = 2.0,
        timeout_s: float = 15.0,
        pool_size: int = 32,
    ) -> None:
        if not endpoint:
            raise ValueError("an S3 endpoint is required (STITCH_S3_ENDPOINT)")
        host, tls = _split_endpoint(endpoint, secure)
        # No retries inside urllib3: this class owns the retry policy and its bound.
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=3.0, read=timeout_s),
            maxsize=pool_size,
            retries=urllib3.Retry(total=0, connect=0, read=0, redirect=0, status=0, raise_on_status=False),
        )
        self.bucket = bucket
        self.endpoint = host
        self.client = Minio(host, access_key, secret_key, secure=tls, region=region, http_client=http)
        # Presigned URLs are signed for the address clients use, which may differ inside a cluster.
        if public_endpoint:
            pub_host, pub_tls = _split_endpoint(public_endpoint, tls)
            self.signer = Minio(pub_host, access_key, secret_key, secure=pub_tls, region=region)
        else:
            self.signer = self.client
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._bucket_ready = False

    @classmethod
    def from_settings(cls, settings: CommonSettings, *, public_endpoint: str = "") -> S3ArtifactStore:
        return cls(
            settings.s3_endpoint,
            settings.s3_access_key,
            settings.s3_secret_key.get_secret_value(),
            settings.s3_bucket,
            secure=settings.s3_secure,
            region=settings.s3_region,
            public_endpoint=public_endpoint,
        )

    # -- retries ---------------------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        delay = self.backoff_s
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except S3Error as exc:
                if exc.code in _MISSING:
                    raise NotFound(f"artifact not found: {what}") from None
                if exc.code not in _TRANSIENT:
                    raise
                error: Exception = exc
            except (ServerError, InvalidResponseError, urllib3.exceptions.HTTPError, OSError) as exc:
                error = exc
            if attempt == self.attempts:
                break
            log.warning(
                "S3 %s failed (%s); retry %d/%d in %.1f s", what, error, attempt, self.attempts, delay
            )
            time.sleep(delay)
            delay = min(self.max_backoff_s, delay * 2)
        raise Unavailable(f"S3 at {self.endpoint} is unavailable ({what}): {error}")

    def ensure_bucket(self) -> None:
        if self._bucket_ready:
            return

        def make() -> None:
            if not self.client.bucket_exists(self.bucket):
                try:
                    self.client.make_bucket(self.bucket)
                except S3Error as exc:
                    # Several processes create it at start-up; whoever loses the race is fine too.
                    if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise

        self._call(f"bucket {self.bucket}", make)
        self._bucket_ready = True

    # -- the port ----------------------------------------------------------------------------------------

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        check_key(key)
        self.ensure_bucket()
        blob = bytes(data)
        self._call(
            f"put {key}",
            lambda: self.client.put_object(
                self.bucket, key, io.BytesIO(blob), len(blob), content_type=content_type
            ),
        )

    def get(self, key: str) -> bytes:
        check_key(key)

        def read() -> bytes:
            response = self.client.get_object(self.bucket, key)
            try:
                return bytes(response.read())
            finally:
                response.close()
                response.release_conn()

        return self._call(f"get {key}", read)

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except NotFound:
            return False
        return True

    def size(self, key: str) -> int:
        check_key(key)
        stat = self._call(f"stat {key}", lambda: self.client.stat_object(self.bucket, key))
        return int(stat.size or 0)

    def list(self, prefix: str) -> list[str]:
        def names() -> list[str]:
            objects = self.client.list_objects(self.bucket, prefix=prefix, recursive=True)
            return sorted(str(o.object_name) for o in objects if o.object_name and not o.is_dir)

        try:
            return self._call(f"list {prefix}", names)
        except NotFound:  # no bucket yet: nothing was ever stored
            return []

    def delete(self, key: str) -> None:
        check_key(key)
        self._call(f"delete {key}", lambda: self.client.remove_object(self.bucket, key))

    def presigned_url(self, key: str, expires_s: int = 3600) -> str:
        """A GET URL anyone holding it can use until it expires (no network call: region is known)."""
        check_key(key)
        expires = dt.timedelta(seconds=max(1, min(int(expires_s), MAX_PRESIGN_S)))
        return str(self.signer.presigned_get_object(self.bucket, key, expires=expires))

    def ping(self) -> bool:
        self._bucket_ready = False
        self.ensure_bucket()
        return True
