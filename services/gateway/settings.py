"""Gateway settings: listen addresses, tenancy defaults, limits and thread pools (env STITCH_*)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from stitchcuda.shared.celery_app import QueueSettings


class GatewaySettings(QueueSettings):
    """What the gateway process needs; the queue settings come along because it sends the first task."""

    host: str = "0.0.0.0"
    grpc_port: int = 50051
    http_port: int = 8080

    # Tenants and keys live with the jobs: Redis on the platform, memory for tests and embedded use.
    tenancy_store: Literal["", "memory", "redis"] = ""
    # Default quotas of a new tenant; 0 means unlimited.
    default_max_concurrent_jobs: int = 4
    default_gpu_seconds_per_month: float = 36_000.0
    default_submits_per_minute: int = 120
    default_requests_per_minute: int = 6_000
    # An authenticated key is trusted for this long before it is looked up again; any change to tenants
    # or keys (disable, revoke, quota) empties every gateway's cache within tenancy_refresh_s.
    key_cache_s: float = 5.0
    tenancy_refresh_s: float = Field(default=0.2, ge=0.0, le=1.0)
    # Jobs running on the platform at once (0: unbounded); the others wait, and a freed slot goes to the
    # next tenant in turn. About the verifier slots of the platform, or a small multiple of them.
    max_running_jobs: int = Field(default=16, ge=0)
    # How often a gateway repairs the admission (places held by jobs a crash left behind) and fills free
    # running slots; it also does both at start.
    admission_sweep_s: float = Field(default=30.0, gt=0)
    admission_dispatch_s: float = Field(default=1.0, gt=0)

    # "auto" devices resolve to this: the gateway cannot see the workers' GPUs.
    auto_device: Literal["cpu", "cuda"] = "cpu"
    max_rounds_limit: int = 20
    max_samples_limit: int = 16

    # Address S3 presigned URLs are signed for ("" = the endpoint the services use).
    s3_public_endpoint: str = ""
    presign_expires_s: int = 3600
    download_chunk_bytes: int = 1 << 20

    # Gateway processes serving the same ports (SO_REUSEPORT; the kernel spreads connections): one
    # Python process is bound to one core by its GIL. Only with the Redis job store (shared state).
    gateway_processes: int = Field(default=1, ge=1, le=64)
    # Set by the first process for the ones it starts: bind the shared ports, start no others.
    share_port: bool = False

    # Blocking calls (Redis, S3) run in thread pools: one for requests, a larger one for Watch polls.
    request_threads: int = 16
    watch_threads: int = 64
    # Longest single wait of a Watch poll; SSE sends a heartbeat after each empty one.
    watch_wait_s: float = 15.0

    def shares_port(self) -> bool:
        return self.share_port or self.gateway_processes > 1

    def resolved_tenancy_store(self) -> str:
        return self.tenancy_store or ("redis" if self.job_store == "redis" else "memory")

    def max_request_bytes(self) -> int:
        # Room for the JSON escaping of the largest allowed reference; anything above is refused early.
        return 8 * self.max_reference_bytes + 64 * 1024
