"""After one real job through `stitchcuda up`, every series that a Grafana panel or an alert rule of the
repository watches has a sample on some service's /metrics: a dashboard that watches nothing fails here.

The platform runs as `stitchcuda up` deploys it: gateway, planner, coder and verifier as separate
processes (prefork Celery pools writing to the multiprocess files their worker serves), Redis and the
session's SeaweedFS S3. The job uses the Coder's LLM backend against a scripted OpenAI-compatible server
started here, so the LLM series come from real requests; its answer is an honest fused kernel.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.gateway.client import GatewayClient
from stitchcuda.gateway.local import SeaweedS3, free_port
from tests.conftest import problem_source
from tests.integration.platform.harness import REDIS_URL, REPO, SECRET, wait_for
from tests.unit.deploy.support import grafana_query_metrics, promql_metric_names

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Top-level folders that hold dashboards (Grafana JSON) and rule files (Prometheus or PrometheusRule).
MONITORING_ROOTS = ("k8s", "docs", "monitoring", "deploy")

# Watched series that one CPU job cannot produce, each with its reason. Keep it short: a series missing
# for any other reason is a defect of the code that should record it.
NOT_FROM_A_CPU_JOB = {
    "stitch_gpu_seconds_total": "charged per tenant for the time a verification holds a GPU worker "
    "(queue verifier.gpu, CUDA jobs only); it has no device label that a CPU job's sample could carry",
}
# Series that Prometheus writes itself; what stands for them here is said.
FROM_PROMETHEUS = {
    "up": "written by Prometheus for each scrape target: here, every service's /metrics must answer 200",
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


# -- what the dashboards and alert rules watch ----------------------------------------------------------


@dataclass(frozen=True)
class Watched:
    """The series that the monitoring selects, each with the panels and rules that select it."""

    uses: dict[str, set[str]]
    files: list[Path]


def _monitoring_files() -> list[Path]:
    roots = [REPO / name for name in MONITORING_ROOTS if (REPO / name).is_dir()]
    return sorted({f for root in roots for ext in ("json", "yml", "yaml") for f in root.rglob(f"*.{ext}")})


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a collapsed row keeps its panels inside it


def _dashboard_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, set[str]]]:
    """(where, metric names) of every panel target, annotation and query variable of a dashboard."""
    title = dashboard.get("title", "?")
    for panel in _panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield f"panel {panel.get('title')!r} of {title!r}", promql_metric_names(target["expr"])
    for note in dashboard.get("annotations", {}).get("list", []):
        if note.get("expr"):
            yield f"annotation {note.get('name')!r} of {title!r}", promql_metric_names(note["expr"])
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            yield f"variable ${var['name']} of {title!r}", grafana_query_metrics(query)


def _rule_groups(doc: Any) -> list[dict[str, Any]]:
    """The rule groups of a Prometheus rule file or of a PrometheusRule resource (else none)."""
    if not isinstance(doc, dict):
        return []
    if doc.get("kind") == "PrometheusRule":
        return list(doc.get("spec", {}).get("groups", []))
    groups = doc.get("groups")
    if isinstance(groups, list) and all(isinstance(g, dict) and "rules" in g for g in groups):
        return groups
    return []


def watched_series() -> Watched:
    """Every metric name a dashboard or alert selects; a recording rule's name stands for its inputs."""
    selections: list[tuple[str, set[str]]] = []
    recorded: dict[str, set[str]] = {}
    files: set[Path] = set()
    for path in _monitoring_files():
        if path.suffix == ".json":
            doc = json.loads(path.read_text())
            if isinstance(doc, dict) and "panels" in doc:
                files.add(path)
                selections.extend(_dashboard_queries(doc))
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            for group in _rule_groups(doc):
                files.add(path)
                for rule in group["rules"]:
                    names = promql_metric_names(rule["expr"])
                    if "record" in rule:
                        recorded.setdefault(rule["record"], set()).update(names)
                    else:
                        selections.append((f"alert {rule['alert']}", names))
    uses: dict[str, set[str]] = {}
    for where, names in selections:
        pending, seen = list(names), set()
        while pending:  # rules may build on rules
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in recorded:
                pending.extend(recorded[name])
            else:
                uses.setdefault(name, set()).add(where)
    return Watched(uses, sorted(files))


def family_of(series: str) -> str:
    """A histogram's family name for one of its series (stitch_x_bucket -> stitch_x)."""
    for suffix in HISTOGRAM_SUFFIXES:
        if series.endswith(suffix):
            return series.removesuffix(suffix)
    return series


def missing_series(watched: dict[str, set[str]], scraped: dict[str, set[str]]) -> dict[str, set[str]]:
    """The watched series with no sample on any service, less the excused ones."""
    covered = set().union(*scraped.values()) | NOT_FROM_A_CPU_JOB.keys() | FROM_PROMETHEUS.keys()
    return {name: uses for name, uses in watched.items() if name not in covered}


def scrape(urls: dict[str, str]) -> dict[str, set[str]]:
    """The names of the samples each service exposes; every target must answer (Prometheus' `up`)."""
    found: dict[str, set[str]] = {}
    for service, url in urls.items():
        response = httpx.get(url, timeout=10)
        assert response.status_code == 200, f"{service}: {url} answered {response.status_code}"
        families = text_string_to_metric_families(response.text)
        found[service] = {sample.name for family in families for sample in family.samples}
    return found


def scrape_until_covered(
    urls: dict[str, str], watched: dict[str, set[str]], timeout_s: float
) -> dict[str, set[str]]:
    # A task's last counters land just after its job's final state: a few scrapes, as Prometheus would.
    deadline = time.monotonic() + timeout_s
    while True:
        scraped = scrape(urls)
        if not missing_series(watched, scraped) or time.monotonic() > deadline:
            return scraped
        time.sleep(1)


# -- the LLM the job's Coder talks to -------------------------------------------------------------------

MODEL_NEW = """import torch
import torch.nn as nn

import elementwise_chain_ext as ext


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale = float(scale)
        self.shift = float(shift)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.forward(x.contiguous(), self.scale, self.shift)
"""
# Per-operator headers, not torch/extension.h: the first build takes ~15 s here, later ones are cached.
FORWARD_CPP = r"""#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>

// y = gelu_tanh(x * scale + shift) * x in one pass over x.
at::Tensor forward(const at::Tensor& x, double scale, double shift) {
  TORCH_CHECK(x.is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous float32 CPU tensor");
  at::Tensor out = at::empty_like(x);
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const float s = static_cast<float>(scale), b = static_cast<float>(shift);
  at::parallel_for(0, x.numel(), 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float v = px[i], y = v * s + b;
      po[i] = 0.5f * y * (1.0f + std::tanh(0.7978845608028654f * (y + 0.044715f * y * y * y))) * v;
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward); }
"""
ANSWER = json.dumps(
    {
        "rationale": "The chain is elementwise: one fused pass reads x once and writes y once.",
        "files": [
            {"path": "model_new.py", "content": MODEL_NEW},
            {"path": "forward.cpp", "content": FORWARD_CPP},
        ],
        "cflags": ["-O3", "-std=c++17"],
    }
)


class ScriptedLLM:
    """An OpenAI-compatible chat endpoint answering every request with ANSWER and its token usage."""

    def __init__(self) -> None:
        self.requests = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    outer.requests += 1
                n = int(body.get("n", 1))
                choice = {"message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}
                data = json.dumps(
                    {
                        "id": "cmpl-scripted",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [{"index": i, **choice} for i in range(n)],
                        "usage": {"prompt_tokens": 1500, "completion_tokens": 400 * n, "total_tokens": 0},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    server = ScriptedLLM()
    server.thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


# -- the platform, as `stitchcuda up` runs it -----------------------------------------------------------


@dataclass
class Up:
    process: subprocess.Popen[bytes]
    log: Path
    home: Path
    grpc_port: int
    http_port: int

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics_urls(self) -> dict[str, str]:
        """Each service's /metrics address, as `stitchcuda up` prints them."""
        return dict(re.findall(r"metrics of ([\w-]+): (http://\S+/metrics)", self.output()))


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def up(seaweed: SeaweedS3, redis_db: object, llm: ScriptedLLM, tmp_path: Path) -> Iterator[Up]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STITCH_")}
    env.update(
        seaweed.env(),
        STITCH_REDIS_URL=REDIS_URL,
        STITCH_HOME=str(tmp_path / "home"),
        STITCH_SECRET_KEY=SECRET,
        STITCH_LLM_BASE_URL=llm.url,
        STITCH_LLM_MODEL="scripted-coder",
        STITCH_BUILD_CACHE_DIR=os.environ["STITCH_TEST_BUILD_CACHE"],
        # Short measurements on 2 shared cores, BM25 retrieval (MiniLM costs ~15 s a start and emits no
        # series); the torch.compile baseline stays on, as its speedup is watched.
        STITCH_CODER_RAG_BACKEND="bm25",
        STITCH_PLANNER_PROFILE_COMPILE="false",
        STITCH_PLANNER_NSYS_ENABLED="false",
        STITCH_PLANNER_PROFILE_ITERS="3",
        STITCH_TRIALS="2",
        STITCH_TIMING_ITERATIONS="5",
        STITCH_WARMUP_ITERATIONS="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(REPO),
    )
    grpc_port, http_port = free_port(), free_port()
    command = [sys.executable, "-m", "stitchcuda.cli", "up", "--grpc-port", str(grpc_port),
               "--http-port", str(http_port)]  # fmt: skip
    log = tmp_path / "up.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO)
    platform = Up(process, log, tmp_path / "home", grpc_port, http_port)
    try:
        banner_done = "Ctrl-C stops everything"
        wait_for(lambda: banner_done in platform.output() or process.poll() is not None, 120, "stitchcuda up")
        assert process.poll() is None, platform.output()[-4000:]
        ready = [f"http://127.0.0.1:{http_port}/readyz", *platform.metrics_urls().values()]
        wait_for(lambda: all(_answers(url) for url in ready), 120, "the gateway and every /metrics")
        yield platform
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C: `up` stops every process it started
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


# -- the test -------------------------------------------------------------------------------------------


def test_every_series_a_dashboard_or_alert_watches_has_a_sample_after_one_job(up: Up, llm: ScriptedLLM):
    watched = watched_series()
    assert watched.files and watched.uses, "no Grafana dashboard or Prometheus rule file found"
    stale = (NOT_FROM_A_CPU_JOB.keys() | FROM_PROMETHEUS.keys()) - watched.uses.keys()
    assert not stale, f"excused series that nothing watches any more: {sorted(stale)}"

    key = (up.home / "api_key").read_text().strip()
    spec = jobs_pb2.JobSpec(
        problem_name="01_elementwise_chain",
        reference_source=problem_source("01"),
        device=jobs_pb2.DEVICE_CPU,
        options=jobs_pb2.JobOptions(max_rounds=0, coder_backend="llm"),
    )
    with GatewayClient(f"127.0.0.1:{up.grpc_port}", key) as client:
        job = client.submit(spec)
        for _ in client.watch(job.job_id, deadline=time.monotonic() + 150):
            pass
        final = client.get(job.job_id)
    assert final.status.state == jobs_pb2.JOB_STATE_SUCCEEDED, (final.status.message, up.output()[-6000:])
    assert final.status.best_speedup_vs_eager > 0 and llm.requests >= 1

    urls = up.metrics_urls()
    assert {"gateway", "planner", "coder", "verifier"} <= set(urls), urls
    scraped = scrape_until_covered(urls, watched.uses, timeout_s=20)
    missing = missing_series(watched.uses, scraped)
    assert not missing, (
        "series watched by a dashboard or alert with no sample on any service after a job:\n"
        + "\n".join(
            f"  {name} (family {family_of(name)}), used by {', '.join(sorted(uses))}"
            for name, uses in sorted(missing.items())
        )
        + "\nscraped: "
        + ", ".join(f"{service} ({len(names)} sample names)" for service, names in scraped.items())
    )
