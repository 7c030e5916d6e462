"""The best variant per problem, device and policy (shared/tuned.py): kept when faster, per tenant, device and
policy, only for built-in programs the Verifier accepted; an unreadable record is no record."""

from __future__ import annotations

from pathlib import Path

from stitchcuda.api.v1 import code_pb2, jobs_pb2, verify_pb2
from stitchcuda.shared import tuned
from stitchcuda.shared.artifacts import Keys, LocalArtifactStore

REFERENCE = "import torch\n# a reference\n"


def job(tenant: str = "t1", device: int = jobs_pb2.DEVICE_CUDA, policy: str = "") -> jobs_pb2.Job:
    spec = jobs_pb2.JobSpec(reference_source=REFERENCE, device=device)  # type: ignore[arg-type]
    spec.options.kernel_policy = policy
    return jobs_pb2.Job(job_id=f"job-{tenant}-{device}-{policy}", tenant_id=tenant, spec=spec)


def program(coder: str = "builtin", **variant: str) -> code_pb2.Candidate:
    cand = code_pb2.Candidate(candidate_id="c0", coder=coder)
    cand.variant.update({**variant, "tried": "default", "features": "gemm"})
    return cand


def verdict(speedup: float, accepted: bool = True) -> verify_pb2.Verdict:
    v = verify_pb2.Verdict(accepted=accepted, speedup_vs_eager=speedup, speedup_vs_compile=speedup / 2)
    v.environment.device_name = "NVIDIA H200"
    return v


def test_the_faster_variant_is_kept_and_found(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    first = tuned.record(store, job(), REFERENCE, program(vec="1"), verdict(1.2))
    assert first is not None and first.variant == {"vec": "1"}, "the search's bookkeeping is not kept"
    # Slower afterwards: the record stands; faster: it is replaced.
    assert tuned.record(store, job(), REFERENCE, program(vec="4"), verdict(1.1)) is None
    assert tuned.record(store, job(), REFERENCE, program(gemm_kernel="cutlass"), verdict(1.5)) is not None
    found = tuned.lookup(store, "t1", jobs_pb2.DEVICE_CUDA, REFERENCE, "")
    assert found is not None and found.variant == {"gemm_kernel": "cutlass"}
    assert "1.50x vs eager on NVIDIA H200" in found.reason() and "gemm_kernel=cutlass" in found.reason()
    # "" and "strict" are the same policy.
    assert tuned.lookup(store, "t1", jobs_pb2.DEVICE_CUDA, REFERENCE, "strict") is not None


def test_records_are_per_tenant_device_policy_and_reference(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    tuned.record(store, job(), REFERENCE, program(vec="1"), verdict(1.2))
    assert tuned.lookup(store, "t2", jobs_pb2.DEVICE_CUDA, REFERENCE, "") is None
    assert tuned.lookup(store, "t1", jobs_pb2.DEVICE_CPU, REFERENCE, "") is None
    assert tuned.lookup(store, "t1", jobs_pb2.DEVICE_CUDA, REFERENCE, "library") is None
    assert tuned.lookup(store, "t1", jobs_pb2.DEVICE_CUDA, REFERENCE + "# other shapes\n", "") is None


def test_only_accepted_builtin_programs_are_recorded_and_bad_records_are_ignored(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    assert tuned.record(store, job(), REFERENCE, program("llm:qwen", vec="1"), verdict(2.0)) is None
    assert tuned.record(store, job(), REFERENCE, program(vec="1"), verdict(2.0, accepted=False)) is None
    assert tuned.lookup(store, "t1", jobs_pb2.DEVICE_CUDA, REFERENCE, "") is None
    key = Keys.tuned("t1", "cuda", tuned.problem_key(REFERENCE, ""))
    store.put(key, b"{not json")
    assert tuned.lookup(store, "t1", jobs_pb2.DEVICE_CUDA, REFERENCE, "") is None
    store.put(key, b'{"unknown_field": 1}')
    assert tuned.lookup(store, "t1", jobs_pb2.DEVICE_CUDA, REFERENCE, "") is None
