"""The banner, the live progress and the report count the same rounds (issue 18: "the banner said 2
rounds and printed three"): one job through the real Workflow with scripted services."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from stitchcuda.api.v1 import code_pb2, jobs_pb2, plan_pb2, verify_pb2
from stitchcuda.progress import EventPrinter
from stitchcuda.shared import pipeline, report, transport
from stitchcuda.shared.artifacts import MemoryArtifactStore
from stitchcuda.shared.envelope import decode
from stitchcuda.shared.jobstore import MemoryJobStore
from stitchcuda.shared.workflow import Workflow
from tests.conftest import problem_source


def program(tag: str) -> code_pb2.Candidate:
    return code_pb2.Candidate(
        files=[
            code_pb2.SourceFile(path="model_new.py", content="import ext_demo as ext\n"),
            code_pb2.SourceFile(path="k.cpp", content=f"// {tag}"),
        ],
        build=code_pb2.BuildManifest(extension_name="ext_demo", sources=["k.cpp"], backend="cpu"),
        entry="model_new.py",
    )


def run(
    max_rounds: int, speedups: list[float], stagnation: int = 5
) -> tuple[str, dict[str, object], jobs_pb2.Job]:
    jobs, artifacts, inproc = MemoryJobStore(), MemoryArtifactStore(), transport.InProcessTransport()
    workflow = Workflow(jobs, artifacts, inproc)
    inproc.register(
        transport.PLANNER, lambda d: workflow.record_plan(decode(d), plan_pb2.Plan(problem_name="p"))
    )
    inproc.register(
        transport.CODER, lambda d: workflow.record_candidates(decode(d), [program(str(decode(d).round))])
    )

    def verify(data: bytes) -> None:
        env = decode(data)
        s = speedups.pop(0)
        verdict = verify_pb2.Verdict(
            candidate_id=f"r{env.round}c0", accepted=True, compiled=True, correct=True, speedup_vs_eager=s
        )
        workflow.record_verdict(env, env.candidate_index, verdict)

    inproc.register(transport.VERIFIER_CPU, verify)
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    console.print(f"optimizing p ({pipeline.rounds_text(max_rounds)})")  # the banner's words
    printer = EventPrinter(console, max_rounds=max_rounds)
    jobs.subscribe(printer)
    spec = jobs_pb2.JobSpec(
        problem_name="p",
        reference_source=problem_source("01"),
        device=jobs_pb2.DEVICE_CPU,
        options=jobs_pb2.JobOptions(max_rounds=max_rounds, stagnation_rounds=stagnation, min_improvement=0.0),
    )
    job = workflow.submit(spec, "acme")
    inproc.drain()
    printer.stop()
    console.print(printer.rounds_line())
    job = jobs.get(job.job_id)
    import json

    data = json.loads(artifacts.get(job.artifacts["report.json"]))
    return out.getvalue(), data, job


@pytest.mark.parametrize(("max_rounds", "expected"), [(2, 3), (0, 1)])
def test_banner_progress_and_report_count_the_same_rounds(max_rounds: int, expected: int):
    text, data, job = run(max_rounds, [1.0 + i for i in range(expected)])
    banner = text.splitlines()[0]
    assert f"up to {expected} round" in banner
    printed = {
        int(line.split("round ", 1)[1].split(" ")[0]) for line in text.splitlines() if "candidate 0:" in line
    }
    assert printed == set(range(expected))
    assert text.rstrip().endswith(f"{expected} of {pipeline.rounds_text(max_rounds)} run")
    assert data["rounds_total"] == data["rounds_run"] == expected == len(data["rounds"])
    assert data["rounds_text"] in banner
    assert f"{expected} of {data['rounds_text']} run" in report.to_html(data)
    assert job.status.state == jobs_pb2.JOB_STATE_SUCCEEDED


def test_a_job_that_stops_early_says_how_many_rounds_of_how_many_ran():
    # Speedups that do not improve: the stagnation limit (2) ends the job before its 5 rounds.
    jobs_text, data, _ = run(4, [2.0, 1.0, 1.0, 1.0, 1.0], stagnation=2)
    ran = data["rounds_run"]
    assert data["rounds_total"] == 5 and ran < 5
    assert jobs_text.rstrip().endswith(
        f"{ran} of up to 5 rounds (round 0 generates, rounds 1-4 optimize) run"
    )
