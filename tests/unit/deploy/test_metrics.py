"""shared/metrics.py: the metric registry, its helpers, the queue-depth collector and the no-op mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from stitchcuda.api.v1 import jobs_pb2, verify_pb2
from stitchcuda.shared import metrics
from stitchcuda.shared.transport import QUEUES

ROOT = Path(__file__).resolve().parents[3]


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_specs_are_well_formed_and_unique() -> None:
    names = [spec.name for spec in metrics.SPECS]
    assert len(names) == len(set(names))
    for spec in metrics.SPECS:
        assert spec.name.startswith("stitch_")
        assert (spec.kind == "counter") == spec.name.endswith("_total"), spec.name
        if spec.kind == "histogram":
            assert list(spec.buckets) == sorted(set(spec.buckets)) and spec.buckets, spec.name
        assert all(label.isidentifier() and not label.startswith("__") for label in spec.labels)


def test_the_required_families_exist_with_their_labels() -> None:
    by_name = {spec.name: spec for spec in metrics.SPECS}
    expected = {
        "stitch_jobs_submitted_total": ("tenant",),
        "stitch_jobs_finished_total": ("tenant", "state"),
        "stitch_verdicts_total": ("device", "accepted", "reason_rule"),
        "stitch_speedup_vs_eager": ("device",),
        "stitch_stage_seconds": ("stage",),
        "stitch_build_cache_total": ("result",),
        "stitch_queue_depth": ("queue",),
        "stitch_llm_tokens_total": ("kind",),
        "stitch_gpu_seconds_total": ("tenant",),
    }
    for name, labels in expected.items():
        assert by_name[name].labels == labels


def test_every_defined_family_is_exported_by_the_client() -> None:
    exposed = {m.name for m in REGISTRY.collect()}
    for spec in metrics.SPECS:
        if spec.kind == "gauge":
            continue  # stitch_queue_depth comes from QueueDepthCollector
        assert spec.name.removesuffix("_total") in exposed, spec.name


def test_counter_counts_per_label_set() -> None:
    before = sample("stitch_jobs_submitted_total", tenant="t-metrics")
    other = sample("stitch_jobs_submitted_total", tenant="t-other")
    metrics.JOBS_SUBMITTED.inc(tenant="t-metrics")
    metrics.JOBS_SUBMITTED.inc(2, tenant="t-metrics")
    assert sample("stitch_jobs_submitted_total", tenant="t-metrics") == before + 3
    assert sample("stitch_jobs_submitted_total", tenant="t-other") == other


def test_wrong_or_missing_labels_are_refused() -> None:
    with pytest.raises(ValueError, match="tenant"):
        metrics.JOBS_SUBMITTED.inc(teant="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        metrics.JOBS_FINISHED.inc(tenant="x")
    with pytest.raises(ValueError):
        metrics.GPU_SECONDS.inc(-1.0, tenant="x")


def test_observe_stage_times_the_block_even_when_it_raises() -> None:
    count = sample("stitch_stage_seconds_count", stage="judge")
    total = sample("stitch_stage_seconds_sum", stage="judge")
    with metrics.observe_stage("judge"):
        sum(range(10_000))
    with pytest.raises(RuntimeError), metrics.observe_stage("judge"):
        raise RuntimeError("boom")
    assert sample("stitch_stage_seconds_count", stage="judge") == count + 2
    assert sample("stitch_stage_seconds_sum", stage="judge") > total


def test_observe_stage_refuses_an_unknown_stage() -> None:
    with pytest.raises(ValueError, match="unknown stage"), metrics.observe_stage("plannnig"):
        pass


def _verdict(**fields: object) -> verify_pb2.Verdict:
    v = verify_pb2.Verdict(device=jobs_pb2.DEVICE_CUDA, compiled=True, correct=True)
    for key, value in fields.items():
        setattr(v, key, value)
    return v


def test_verdict_reason_rule_picks_the_deciding_rule() -> None:
    assert metrics.verdict_reason_rule(_verdict(accepted=True)) == "accepted"
    assert metrics.verdict_reason_rule(_verdict(compiled=False)) == "build"
    hack = _verdict()
    hack.findings.add(rule="D11.torch-op", severity=verify_pb2.SEVERITY_WARNING)
    hack.findings.add(rule="D7.event-vs-wall", severity=verify_pb2.SEVERITY_REJECT)
    assert metrics.verdict_reason_rule(hack) == "D7.event-vs-wall"
    assert metrics.verdict_reason_rule(_verdict(correct=False)) == "correctness"


def test_record_verdict_counts_and_observes_speedups_of_accepted_only() -> None:
    acc = {"device": "cuda", "accepted": "true", "reason_rule": "accepted"}
    rej = {"device": "cuda", "accepted": "false", "reason_rule": "correctness"}
    n_acc, n_rej = sample("stitch_verdicts_total", **acc), sample("stitch_verdicts_total", **rej)
    hist = sample("stitch_speedup_vs_eager_count", device="cuda")
    le2 = sample("stitch_speedup_vs_eager_bucket", device="cuda", le="2.0")
    metrics.record_verdict(_verdict(accepted=True, speedup_vs_eager=1.7, speedup_vs_compile=1.2))
    metrics.record_verdict(_verdict(correct=False, speedup_vs_eager=50.0))
    assert sample("stitch_verdicts_total", **acc) == n_acc + 1
    assert sample("stitch_verdicts_total", **rej) == n_rej + 1
    assert sample("stitch_speedup_vs_eager_count", device="cuda") == hist + 1
    assert sample("stitch_speedup_vs_eager_bucket", device="cuda", le="2.0") == le2 + 1


def test_small_recorders() -> None:
    hits = sample("stitch_build_cache_total", result="hit")
    misses = sample("stitch_build_cache_total", result="miss")
    metrics.record_build(cached=True)
    metrics.record_build(cached=False)
    metrics.record_build(cached=True)
    assert sample("stitch_build_cache_total", result="hit") == hits + 2
    assert sample("stitch_build_cache_total", result="miss") == misses + 1
    prompt = sample("stitch_llm_tokens_total", kind="prompt")
    metrics.record_llm_usage(prompt_tokens=120, completion_tokens=30)
    assert sample("stitch_llm_tokens_total", kind="prompt") == prompt + 120
    done = sample("stitch_jobs_finished_total", tenant="t-fin", state="succeeded")
    fast = sample("stitch_job_speedup_vs_eager_count", device="cuda")
    job = jobs_pb2.Job(job_id="j", tenant_id="t-fin", spec=jobs_pb2.JobSpec(device=jobs_pb2.DEVICE_CUDA))
    job.status.state = jobs_pb2.JOB_STATE_SUCCEEDED
    job.status.best_speedup_vs_eager = 2.5
    metrics.record_job_finished(job)
    assert sample("stitch_jobs_finished_total", tenant="t-fin", state="succeeded") == done + 1
    assert sample("stitch_job_speedup_vs_eager_count", device="cuda") == fast + 1
    job.status.state = jobs_pb2.JOB_STATE_CODING
    with pytest.raises(ValueError, match="not in a final state"):
        metrics.record_job_finished(job)


def test_a_label_outside_its_closed_set_is_refused() -> None:
    with pytest.raises(ValueError, match="stitch_jobs_finished_total"):
        metrics.JOBS_FINISHED.inc(tenant="t", state="exploded")


class FakeRedis:
    def __init__(self, lengths: dict[str, int], fail: bool = False) -> None:
        self.lengths = lengths
        self.fail = fail
        self.calls = 0

    def llen(self, name: str) -> int:
        self.calls += 1
        if self.fail:
            raise ConnectionError("redis down")
        return self.lengths.get(name, 0)


def test_queue_depth_collector_reads_llen_per_queue_at_scrape_time() -> None:
    redis = FakeRedis({"verifier.gpu": 7, "coder": 2})
    registry = CollectorRegistry()
    registry.register(metrics.QueueDepthCollector(redis, QUEUES))
    assert redis.calls == 0  # registering must not reach Redis
    assert registry.get_sample_value("stitch_queue_depth", {"queue": "verifier.gpu"}) == 7
    assert registry.get_sample_value("stitch_queue_depth", {"queue": "planner"}) == 0
    redis.lengths["verifier.gpu"] = 1
    text = generate_latest(registry).decode()
    assert 'stitch_queue_depth{queue="verifier.gpu"} 1.0' in text
    assert 'stitch_queue_depth{queue="coder"} 2.0' in text


def test_queue_depth_collector_survives_redis_outage() -> None:
    registry = CollectorRegistry()
    registry.register(metrics.QueueDepthCollector(FakeRedis({}, fail=True), QUEUES))
    assert "stitch_queue_depth{" not in generate_latest(registry).decode()


def test_metrics_server_serves_the_registry_and_extra_collectors() -> None:
    collector = metrics.QueueDepthCollector(FakeRedis({"judge": 4}), ["judge"])
    server = metrics.start_metrics_server(0, addr="127.0.0.1", collectors=[collector])
    assert server is not None
    try:
        metrics.TASKS.inc(queue="judge", outcome="ok")
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
        body2, content_type = metrics.render_latest()
    finally:
        server.close()
        metrics.unregister_collector(collector)
    assert 'stitch_queue_depth{queue="judge"} 4.0' in body
    assert 'stitch_tasks_total{outcome="ok",queue="judge"}' in body
    assert content_type.startswith("text/plain")
    assert b'stitch_queue_depth{queue="judge"} 4.0' in body2
    assert b"stitch_queue_depth{" not in metrics.render_latest()[0]


def _run(code: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_without_prometheus_client_everything_is_a_no_op_but_labels_are_still_checked() -> None:
    out = _run(
        """
        import json, sys
        sys.modules["prometheus_client"] = None  # what `import` sees when the extra is missing
        from stitchcuda.shared import metrics
        from stitchcuda.api.v1 import verify_pb2
        metrics.JOBS_SUBMITTED.inc(tenant="a")
        with metrics.observe_stage("build"):
            pass
        metrics.record_verdict(verify_pb2.Verdict(accepted=True, speedup_vs_eager=2.0), "cpu")
        collector = metrics.QueueDepthCollector(object(), ["planner"])
        result = {
            "enabled": metrics.ENABLED,
            "server": metrics.start_metrics_server(0, collectors=[collector]) is None,
            "render": metrics.render_latest()[0].decode(),
            "collect": list(collector.collect()),
            "series": "stitch_verdicts_total" in metrics.exposed_series(),
        }
        try:
            metrics.JOBS_SUBMITTED.inc(tenent="a")
            result["label_check"] = False
        except ValueError:
            result["label_check"] = True
        print(json.dumps(result))
        """
    )
    assert json.loads(out) == {
        "enabled": False,
        "server": True,
        "render": "",
        "collect": [],
        "series": True,
        "label_check": True,
    }


def test_multiprocess_mode_sums_samples_written_by_forked_workers(tmp_path: Path) -> None:
    # A prefork Celery pool counts in child processes; the parent's /metrics must see those counts.
    out = _run(
        """
        import multiprocessing
        from stitchcuda.shared import metrics

        def work():
            metrics.TASKS.inc(queue="verifier.gpu", outcome="ok")

        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=work) for _ in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        print(metrics.render_latest()[0].decode())
        """,
        env={metrics.MULTIPROC_ENV: str(tmp_path / "prom")},
    )
    assert 'stitch_tasks_total{outcome="ok",queue="verifier.gpu"} 3.0' in out
