"""The workflow over in-memory stores and the in-process transport, with scripted services."""

import json

import pytest

from stitchcuda.api.v1 import code_pb2, jobs_pb2, plan_pb2, verify_pb2
from stitchcuda.shared import report, transport
from stitchcuda.shared.artifacts import MemoryArtifactStore
from stitchcuda.shared.envelope import decode
from stitchcuda.shared.errors import ProblemError
from stitchcuda.shared.jobstore import MemoryJobStore
from stitchcuda.shared.workflow import Workflow
from tests.conftest import problem_source

MODEL_NEW = "import torch\nimport ext_demo as ext\n\nclass ModelNew(torch.nn.Module):\n    pass\n"


def candidate(tag: str) -> code_pb2.Candidate:
    return code_pb2.Candidate(
        files=[
            code_pb2.SourceFile(path="model_new.py", content=MODEL_NEW),
            code_pb2.SourceFile(path="k.cpp", content=f"// {tag}"),
        ],
        build=code_pb2.BuildManifest(extension_name="ext_demo", sources=["k.cpp"], backend="cpu"),
        entry="model_new.py",
        coder="scripted",
    )


class Harness:
    """Wires scripted planner/coder/verifier handlers to a Workflow the way the embedded mode does."""

    def __init__(self, speedups, *, plan_error=None, samples=1, reference_prefetch="cuda"):
        self.jobs = MemoryJobStore()
        self.artifacts = MemoryArtifactStore()
        self.transport = transport.InProcessTransport()
        self.workflow = Workflow(
            self.jobs, self.artifacts, self.transport, reference_prefetch=reference_prefetch
        )
        self.reference_requests = []
        self.speedups = list(speedups)
        self.plan_error = plan_error
        self.samples = samples
        self.coder_requests = []
        self.transport.register(transport.PLANNER, self.plan)
        self.transport.register(transport.CODER, self.code)
        self.transport.register(transport.VERIFIER_CPU, self.verify)

    def plan(self, data):
        env = decode(data)
        if self.plan_error:
            self.workflow.record_plan(env, None, error=self.plan_error, error_code="invalid_problem")
        else:
            self.workflow.record_plan(env, plan_pb2.Plan(problem_name="p", floor_ms=0.01))

    def code(self, data):
        env = decode(data)
        self.coder_requests.append(env.coder_request)
        self.workflow.record_candidates(env, [candidate(f"{env.round}-{i}") for i in range(self.samples)])

    def verify(self, data):
        env = decode(data)
        if env.WhichOneof("body") == "reference_request":
            self.reference_requests.append(env.reference_request)
            return
        speedup = self.speedups.pop(0)
        accepted = speedup > 0
        verdict = verify_pb2.Verdict(
            candidate_id=f"r{env.round}c{env.candidate_index}",
            accepted=accepted,
            compiled=True,
            correct=accepted,
            speedup_vs_eager=max(speedup, 0.0),
            speedup_vs_compile=max(speedup, 0.0) / 2,
            reason="accepted" if accepted else "wrong answer",
        )
        self.workflow.record_verdict(env, env.candidate_index, verdict)

    def run(self, rounds=2, **options):
        spec = jobs_pb2.JobSpec(
            problem_name="elementwise",
            reference_source=problem_source("01"),
            device=jobs_pb2.DEVICE_CPU,
            options=jobs_pb2.JobOptions(
                max_rounds=rounds, stagnation_rounds=3, samples=self.samples, **options
            ),
        )
        job = self.workflow.submit(spec, "acme")
        self.transport.drain()
        return self.jobs.get(job.job_id)


def test_job_runs_all_rounds_and_keeps_the_best():
    h = Harness([1.2, 1.8, 1.5])
    job = h.run(rounds=2)
    assert job.status.state == jobs_pb2.JOB_STATE_SUCCEEDED
    assert job.status.best_candidate_id == "r1c0"
    assert job.status.best_speedup_vs_eager == pytest.approx(1.8)
    assert [r.speedup_vs_eager for r in job.rounds] == pytest.approx([1.2, 1.8, 1.5])
    skills = [r.skill for r in h.coder_requests]
    assert skills == [code_pb2.SKILL_GENERATE, code_pb2.SKILL_OPTIMIZE, code_pb2.SKILL_OPTIMIZE]
    assert h.coder_requests[2].previous_candidate_key.endswith("rounds/001/candidate-0.pb")
    for name in ("model_new.py", "report.json", "report.html", "plan"):
        assert h.artifacts.exists(job.artifacts[name]), name
    assert "ext_demo" in h.artifacts.get(job.artifacts["model_new.py"]).decode()
    report = json.loads(h.artifacts.get(job.artifacts["report.json"]))
    assert report["state"] == "succeeded" and report["best_row"]["speedup_vs_eager"] == pytest.approx(1.8)
    assert "0.90x" in h.artifacts.get(job.artifacts["report.html"]).decode()  # vs torch.compile


def test_a_harness_failure_ends_the_job_with_its_reason_and_no_further_round():
    class Failing(Harness):
        def verify(self, data):
            env = decode(data)
            self.workflow.record_harness_failure(
                env, "the reference ran out of memory (memory limit 8.0 GiB)", "reference_out_of_memory"
            )

    h = Failing([], samples=2)
    job = h.run(rounds=3)
    assert job.status.state == jobs_pb2.JOB_STATE_FAILED
    assert job.status.error_code == "reference_out_of_memory"
    assert "ran out of memory" in job.status.message
    assert len(h.coder_requests) == 1 and not job.rounds  # no rejection recorded, no second round


def test_the_reference_is_prepared_while_the_first_program_is_written():
    h = Harness([1.2, 1.5, 1.1], reference_prefetch="all")
    job = h.run(rounds=2, kernel_policy="library")
    assert job.status.state == jobs_pb2.JOB_STATE_SUCCEEDED
    bodies = [body for _, body in h.transport.delivered]
    # sent before the coder's request, so the embedded mode starts it first; once: the rounds share it
    assert bodies.index("reference_request") < bodies.index("coder_request")
    assert bodies.count("reference_request") == 1
    (req,) = h.reference_requests
    assert req.device == jobs_pb2.DEVICE_CPU and req.plan_key.endswith("plan-0.pb")
    assert req.reference_key == h.coder_requests[0].reference_key
    assert req.policy.kernel_policy == "library", "the schedule and policy the verifications will use"


def test_only_gpu_jobs_prepare_their_reference_by_default():
    h = Harness([1.2])
    assert h.run(rounds=0).status.state == jobs_pb2.JOB_STATE_SUCCEEDED
    assert "reference_request" not in [body for _, body in h.transport.delivered]
    with pytest.raises(ValueError, match="reference_prefetch"):
        Workflow(h.jobs, h.artifacts, h.transport, reference_prefetch="sometimes")


def test_a_job_emits_its_metrics_where_its_state_changes():
    from prometheus_client import REGISTRY

    def sample(name, **labels):
        return REGISTRY.get_sample_value(name, labels) or 0.0

    finished = sample("stitch_jobs_finished_total", tenant="acme", state="succeeded")
    accepted = sample("stitch_verdicts_total", device="cpu", accepted="true", reason_rule="accepted")
    jobs_timed = sample("stitch_stage_seconds_count", stage="job")
    best = sample("stitch_job_speedup_vs_eager_count", device="cpu")
    job = Harness([1.2, 1.8]).run(rounds=1)
    assert job.status.state == jobs_pb2.JOB_STATE_SUCCEEDED
    assert sample("stitch_jobs_finished_total", tenant="acme", state="succeeded") == finished + 1
    assert (
        sample("stitch_verdicts_total", device="cpu", accepted="true", reason_rule="accepted") == accepted + 2
    )
    assert sample("stitch_stage_seconds_count", stage="job") == jobs_timed + 1
    assert sample("stitch_job_speedup_vs_eager_count", device="cpu") == best + 1


def test_speedups_that_were_not_measured_read_as_such():
    assert report.vs_compile(0.0) == "torch.compile not timed" and report.speedup_text(0.0) == "n/a"
    assert report.vs_compile(1.234) == "1.23x vs torch.compile"


def test_events_tell_the_story_in_order():
    h = Harness([1.3])
    job = h.run(rounds=0)
    events = h.jobs.read_events(job.job_id)
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    verdicts = [e for e in events if e.kind == jobs_pb2.EVENT_KIND_VERDICT]
    assert len(verdicts) == 1 and verdicts[0].data["accepted"] == "true"
    states = [e.stage for e in events if e.kind == jobs_pb2.EVENT_KIND_STATE]
    assert states == ["queued", "planning", "coding", "verifying", "succeeded"]


def test_several_samples_per_round_are_all_verified():
    h = Harness([1.1, 2.2], samples=2)
    job = h.run(rounds=0)
    assert job.status.best_candidate_id == "r0c1" and len(job.rounds) == 2


def test_no_verified_candidate_fails_with_a_report():
    h = Harness([0, 0, 0, 0])
    job = h.run(rounds=1, max_replans=0)
    assert job.status.state == jobs_pb2.JOB_STATE_FAILED
    assert "no verified candidate" in job.status.message
    assert h.artifacts.exists(job.artifacts["report.html"])
    assert json.loads(h.artifacts.get(job.artifacts["report.json"]))["state"] == "failed"
    assert "model_new.py" not in job.artifacts


def test_broken_reference_fails_with_its_error_code():
    h = Harness([], plan_error="reference fails on its own inputs: line 3")
    job = h.run()
    assert job.status.state == jobs_pb2.JOB_STATE_FAILED
    assert job.status.error_code == "invalid_problem"
    assert "line 3" in job.status.message


def test_submit_rejects_malformed_reference_before_anything_is_stored():
    h = Harness([])
    with pytest.raises(ProblemError, match="does not define get_inputs"):
        h.workflow.submit(
            jobs_pb2.JobSpec(reference_source="class Model: pass\ndef get_init_inputs(): ..."), "t"
        )
    assert h.artifacts.list("") == []


def test_idempotency_key_returns_the_same_job():
    h = Harness([1.0])
    spec = jobs_pb2.JobSpec(reference_source=problem_source("01"), idempotency_key="k1")
    first = h.workflow.submit(spec, "acme")
    second = h.workflow.submit(spec, "acme")
    assert first.job_id == second.job_id


def test_redelivered_verdict_changes_nothing():
    h = Harness([1.4])
    original_verify = h.verify
    seen = []

    def verify_twice(data):
        seen.append(data)
        original_verify(data)
        h.speedups.append(9.9)  # a second delivery would report a different result
        original_verify(data)

    h.transport.register(transport.VERIFIER_CPU, verify_twice)
    job = h.run(rounds=0)
    assert len(job.rounds) == 1 and job.status.best_speedup_vs_eager == pytest.approx(1.4)


def test_cancel_drops_queued_work():
    h = Harness([1.0, 1.0])
    spec = jobs_pb2.JobSpec(reference_source=problem_source("01"), options=jobs_pb2.JobOptions(max_rounds=3))
    job = h.workflow.submit(spec, "acme")
    assert h.transport.pending() == 1  # the plan request
    h.workflow.cancel(job.job_id)
    h.transport.drain()
    final = h.jobs.get(job.job_id)
    assert final.status.state == jobs_pb2.JOB_STATE_CANCELLED
    assert h.coder_requests == []


def test_replan_stores_a_new_plan_and_codes_from_it():
    h = Harness([0, 0, 1.5])
    job = h.run(rounds=2, max_replans=1)
    keys = [r.plan_key.rsplit("/", 1)[-1] for r in h.coder_requests]
    assert keys == ["plan-0.pb", "plan-0.pb", "plan-1.pb"]
    assert all(h.artifacts.exists(r.plan_key) for r in h.coder_requests)
    assert job.status.replans == 1 and job.status.state == jobs_pb2.JOB_STATE_SUCCEEDED


def test_a_store_failure_mid_transition_is_redone_on_redelivery():
    h = Harness([1.5, 1.5])
    put = h.artifacts.put
    failures = []

    def flaky_put(key, data, content_type="application/octet-stream"):
        if "/result/" in key and not failures:
            failures.append(key)
            raise ConnectionError("S3 went away")
        put(key, data, content_type)

    h.artifacts.put = flaky_put
    delivered = []
    verify = h.verify

    def verify_and_remember(data):
        delivered.append(data)
        verify(data)

    h.transport.register(transport.VERIFIER_CPU, verify_and_remember)
    with pytest.raises(ConnectionError):
        h.run(rounds=0)
    (job,) = h.jobs.list_jobs("acme")[0]
    assert job.status.state != jobs_pb2.JOB_STATE_SUCCEEDED
    verify_and_remember(delivered[0])  # the transport redelivers the unacknowledged message
    final = h.jobs.get(job.job_id)
    assert final.status.state == jobs_pb2.JOB_STATE_SUCCEEDED
    assert h.artifacts.exists(final.artifacts["model_new.py"])
