"""Candidate bookkeeping shared by both backends: deterministic ids and failure records."""

from __future__ import annotations

from stitchcuda.api.v1 import code_pb2
from stitchcuda.shared.artifacts import sha256_hex
from stitchcuda.shared.candidate import content_hash


def candidate_id(candidate: code_pb2.Candidate, job_id: str, round_: int, index: int) -> str:
    """Same job, round, slot and program -> same id (redelivered tasks write the same artifacts)."""
    digest = content_hash(candidate) if candidate.files else sha256_hex(candidate.failure)
    return f"{job_id or 'local'}-r{round_}-{index}-{digest[:12]}"


def failed(reason: str, *, coder: str, job_id: str, round_: int, index: int) -> code_pb2.Candidate:
    """A candidate that could not be produced; `failure` says why."""
    cand = code_pb2.Candidate(schema_version=1, job_id=job_id, round=round_, coder=coder, failure=reason)
    cand.candidate_id = candidate_id(cand, job_id, round_, index)
    return cand
