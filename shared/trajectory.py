"""A job's loop trajectory as one JSON document: the problem, its plan, and each round's candidates with
their verdicts and feedback. Written when a job ends; the RL kit builds training examples from it."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format

from stitchcuda.api.v1 import code_pb2, jobs_pb2, plan_pb2, verify_pb2
from stitchcuda.shared.artifacts import ArtifactStore, Keys, sha256_hex
from stitchcuda.shared.errors import NotFound

SCHEMA = "stitchcuda.trajectory/1"


def _as_dict(message: Any) -> dict[str, Any]:
    return dict(json_format.MessageToDict(message, preserving_proto_field_name=True))


def _reference(job: jobs_pb2.Job, artifacts: ArtifactStore) -> str:
    if job.spec.reference_source:
        return str(job.spec.reference_source)
    return artifacts.get(Keys.reference(job.tenant_id, job.job_id)).decode()


def _plans(job: jobs_pb2.Job, artifacts: ArtifactStore) -> list[dict[str, Any]]:
    out = []
    for replan in range(job.status.replans + 1):
        try:
            plan = plan_pb2.Plan.FromString(artifacts.get(Keys.plan(job.tenant_id, job.job_id, replan)))
        except NotFound:
            continue
        out.append({"replan": replan, "plan": _as_dict(plan)})
    return out


def build(
    job: jobs_pb2.Job, artifacts: ArtifactStore, *, best_id: str = "", state: str = ""
) -> dict[str, Any]:
    """Collects what the job's artifacts hold; rounds whose verdict never came keep `verdict: null`.

    `state`: the state the job is ending in (its record may still say the phase it leaves).
    """
    reference = _reference(job, artifacts)
    rounds: list[dict[str, Any]] = []
    prefix = Keys.job(job.tenant_id, job.job_id) + "/rounds/"
    for key in artifacts.list(prefix):
        name = key.rsplit("/", 1)[-1]
        if not (name.startswith("candidate-") and name.endswith(".pb")):
            continue
        round_ = int(key.split("/")[-2])
        index = int(name.removeprefix("candidate-").removesuffix(".pb"))
        candidate = code_pb2.Candidate.FromString(artifacts.get(key))
        verdict: verify_pb2.Verdict | None = None
        try:
            verdict = verify_pb2.Verdict.FromString(
                artifacts.get(Keys.verdict(job.tenant_id, job.job_id, round_, index))
            )
        except NotFound:
            pass
        rounds.append(
            {
                "round": round_,
                "index": index,
                "candidate_id": candidate.candidate_id,
                "parent_id": candidate.parent_id,
                "skill": "optimize" if candidate.parent_id else "generate",
                "candidate": _as_dict(candidate),
                "verdict": _as_dict(verdict) if verdict is not None else None,
                "accepted": bool(verdict is not None and verdict.accepted),
                "speedup_vs_eager": verdict.speedup_vs_eager if verdict is not None else 0.0,
                "feedback": verdict.feedback if verdict is not None else "",
            }
        )
    rounds.sort(key=lambda r: (r["round"], r["index"]))
    return {
        "schema": SCHEMA,
        "job_id": job.job_id,
        "tenant_id": job.tenant_id,
        "problem": job.spec.problem_name,
        "reference": reference,
        "reference_sha256": sha256_hex(reference),
        "device": jobs_pb2.Device.Name(job.spec.device).removeprefix("DEVICE_").lower(),
        "kernel_policy": job.spec.options.kernel_policy,
        "coder_backend": job.spec.options.coder_backend,
        "state": state or jobs_pb2.JobState.Name(job.status.state).removeprefix("JOB_STATE_").lower(),
        "best_candidate_id": best_id,
        "plans": _plans(job, artifacts),
        "rounds": rounds,
    }


def write(job: jobs_pb2.Job, artifacts: ArtifactStore, *, best_id: str = "", state: str = "") -> str:
    """Stores the trajectory under the job's deterministic key (a rewrite replaces it) and returns the key."""
    key = Keys.trajectory(job.tenant_id, job.job_id)
    data = json.dumps(build(job, artifacts, best_id=best_id, state=state), sort_keys=True).encode()
    artifacts.put(key, data, "application/json")
    return str(key)
