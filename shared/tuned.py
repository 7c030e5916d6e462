"""The best variant the built-in Coder's programs reached per problem, device and policy, kept in the artifact
store so the next job of that problem starts from it (its first round writes that variant, not the default).

A job that ends with an accepted built-in program records the program's variant (block sizes, vector width,
GEMM kernel, epilogue placement, ...) with its speedups and the device it was measured on, unless an earlier
record of the same problem is faster. The problem is the reference's text (its shapes included) with the job's
kernel policy; records are per tenant. What the Coder reads is only knobs, never code.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field

from stitchcuda.api.v1 import code_pb2, jobs_pb2, verify_pb2
from stitchcuda.shared.artifacts import ArtifactStore, Keys, sha256_hex
from stitchcuda.shared.errors import NotFound

log = logging.getLogger(__name__)

# Candidate.variant keys that describe the search, not the program.
_BOOKKEEPING = frozenset({"tried", "features"})


@dataclass
class Tuned:
    variant: dict[str, str]
    speedup_vs_eager: float
    speedup_vs_compile: float = 0.0
    device_name: str = ""
    job_id: str = ""
    candidate_id: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def reason(self) -> str:
        knobs = ", ".join(f"{k}={v}" for k, v in sorted(self.variant.items())) or "default"
        where = f" on {self.device_name}" if self.device_name else ""
        return f"tuned variant of job {self.job_id} ({self.speedup_vs_eager:.2f}x vs eager{where}): {knobs}"


def problem_key(reference_source: str, policy: str) -> str:
    """The problem as the tuned record knows it: the reference's text (shapes included) and the policy."""
    return sha256_hex(f"{policy or 'strict'}\0{reference_source}")[:32]


def _key(tenant: str, device: jobs_pb2.Device.ValueType, reference_source: str, policy: str) -> str:
    kind = jobs_pb2.Device.Name(device).removeprefix("DEVICE_").lower()
    return Keys.tuned(tenant, kind, problem_key(reference_source, policy))


def lookup(
    artifacts: ArtifactStore,
    tenant: str,
    device: jobs_pb2.Device.ValueType,
    reference_source: str,
    policy: str,
) -> Tuned | None:
    """The recorded best variant for this problem, or None (none yet, or an unreadable record)."""
    try:
        data = json.loads(artifacts.get(_key(tenant, device, reference_source, policy)))
        return Tuned(**data)
    except NotFound:
        return None
    except (ValueError, TypeError) as exc:
        log.warning("ignoring an unreadable tuned-variant record: %s", exc)
        return None


def record(
    artifacts: ArtifactStore,
    job: jobs_pb2.Job,
    reference_source: str,
    candidate: code_pb2.Candidate,
    verdict: verify_pb2.Verdict,
) -> Tuned | None:
    """Keeps the job's best program's variant when it is a built-in program the Verifier accepted and no
    earlier record of the problem is faster; returns what was recorded (None: nothing)."""
    if candidate.coder != "builtin" or not verdict.accepted or verdict.speedup_vs_eager <= 0:
        return None
    variant = {k: v for k, v in candidate.variant.items() if k not in _BOOKKEEPING}
    policy = job.spec.options.kernel_policy
    known = lookup(artifacts, job.tenant_id, job.spec.device, reference_source, policy)
    if known is not None and known.speedup_vs_eager >= verdict.speedup_vs_eager:
        return None
    tuned = Tuned(
        variant=variant,
        speedup_vs_eager=verdict.speedup_vs_eager,
        speedup_vs_compile=verdict.speedup_vs_compile,
        device_name=verdict.environment.device_name,
        job_id=job.job_id,
        candidate_id=candidate.candidate_id,
    )
    key = _key(job.tenant_id, job.spec.device, reference_source, policy)
    artifacts.put(key, json.dumps(asdict(tuned), sort_keys=True).encode(), "application/json")
    return tuned


__all__ = ["Tuned", "lookup", "problem_key", "record"]
