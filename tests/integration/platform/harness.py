"""Test harness of the platform tiers: a SeaweedFS S3 per session, a flushed Redis DB per test, and the
platform's processes (gateway + workers, real or fake services) started as separate OS processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from stitchcuda.gateway.local import SeaweedS3, free_port

REPO = Path(__file__).resolve().parents[3]
REDIS_DB = int(os.environ.get("STITCH_TEST_REDIS_DB", "13"))
REDIS_URL = f"redis://127.0.0.1:6379/{REDIS_DB}"
SECRET = "test-secret-key-for-the-platform-tests"


def start_seaweed(root: Path) -> SeaweedS3:
    weed = SeaweedS3(root, access_key="stitchtest", secret_key="stitchtest-secret", bucket="stitch-test")
    weed.start(timeout_s=120)
    return weed


def flush_redis(*, full: bool = True) -> redis.Redis:
    """Empties the test DB. Not full: only the platform's keys and queues, keeping the broker's
    exchange bindings (`_kombu.*`) that running workers declared once at start-up."""
    client = redis.Redis.from_url(REDIS_URL)
    if full:
        client.flushdb()
        return client
    from stitchcuda.shared.transport import QUEUES

    keys = list(client.scan_iter("stitch:*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])
    client.delete(*QUEUES)
    return client


def platform_env(weed: SeaweedS3, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        **weed.env(),
        "STITCH_ENVIRONMENT": "test",
        "STITCH_JOB_STORE": "redis",
        "STITCH_REDIS_URL": REDIS_URL,
        "STITCH_SECRET_KEY": SECRET,
        "STITCH_METRICS_PORT": "0",
        "STITCH_LOG_LEVEL": "INFO",
        "STITCH_RETRY_BACKOFF_S": "0.5",
        "STITCH_RETRY_BACKOFF_MAX_S": "4",
        "STITCH_KEY_CACHE_S": "0",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    env.update(extra)
    return env


@dataclass
class Proc:
    name: str
    command: list[str]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as handle:
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal_group(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process is None:
            return
        self.signal_group(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.process.wait(5)
        self.process = None

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def children(self) -> list[int]:
        """Pids of the direct children (a Celery worker's pool processes)."""
        if self.process is None:
            return []
        out = subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]


@dataclass
class Platform:
    """Gateway and workers as processes on the test's Redis DB and the session's S3."""

    env: dict[str, str]
    workdir: Path
    fake: bool = True
    procs: dict[str, Proc] = field(default_factory=dict)
    grpc_port: int = 0
    http_port: int = 0

    def _command(self, service: str, args: list[str]) -> list[str]:
        if self.fake and service != "gateway":
            return [sys.executable, "-m", "tests.integration.platform.fakes", service, *args]
        return [sys.executable, "-m", f"stitchcuda.{service}", *args]

    def start_worker(
        self, service: str, *args: str, name: str = "", env: dict[str, str] | None = None
    ) -> Proc:
        name = name or service
        proc = Proc(name, self._command(service, list(args)), {**self.env, **(env or {})},
                    self.workdir / f"{name}.log")  # fmt: skip
        proc.start()
        self.procs[name] = proc
        self._wait_log(proc, "ready.", 90)
        return proc

    def start_gateway(
        self, *, env: dict[str, str] | None = None, ports: tuple[int, int] | None = None
    ) -> Proc:
        self.grpc_port, self.http_port = ports or (
            self.grpc_port or free_port(),
            self.http_port or free_port(),
        )
        args = ["--host", "127.0.0.1", "--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port)]
        proc = Proc("gateway", self._command("gateway", args), {**self.env, **(env or {})},
                    self.workdir / "gateway.log")  # fmt: skip
        proc.start()
        self.procs["gateway"] = proc
        deadline = time.monotonic() + 60
        while True:
            if not proc.alive():
                raise RuntimeError(f"the gateway exited:\n{proc.tail()}")
            try:
                if httpx.get(f"{self.http_url}/readyz", timeout=2).status_code == 200:
                    return proc
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not become ready:\n{proc.tail()}")
            time.sleep(0.2)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def _wait_log(self, proc: Proc, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in proc.tail(200):
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{proc.name} did not start:\n{proc.tail()}")
            time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(f"===== {name} =====\n{proc.tail(40)}" for name, proc in self.procs.items())

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.stop()


def make_tenant(tenant_id: str = "acme", **quota: float) -> str:
    """Creates a tenant (with optional quota overrides) on the test Redis DB and returns a new API key."""
    from stitchcuda.gateway.tenancy import Quota, RedisTenantStore, Tenancy
    from stitchcuda.shared.redis_store import RedisUsageMeter, connect

    client = connect(REDIS_URL)
    tenancy = Tenancy(RedisTenantStore(client), RedisUsageMeter(client), SECRET, key_cache_s=0)
    tenancy.create_tenant(tenant_id, quota=Quota(**{"submits_per_minute": 0, "requests_per_minute": 0,
                                                     "max_concurrent_jobs": 50, **quota}))  # type: ignore[arg-type]  # fmt: skip
    _, key = tenancy.issue_key(tenant_id)
    client.close()
    return key


def wait_for(predicate: object, timeout_s: float, what: str, interval_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)
