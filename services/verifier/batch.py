"""`stitchcuda verify --batch DIR`: many candidates, each against the reference it targets, as JSON lines.

DIR holds either `cases.tsv` (reference path, TAB, candidate path, relative to DIR; `#` comments) or one
folder per problem with `reference.py` beside its candidates (every other .py file or sub-folder). Builds run
in a process pool bounded by the cores; verifications run one at a time in this process, each holding the
node's GPU slot on CUDA (shared.gpu_slots), so timings never share the device. Every finished case is
appended to DIR/verify-results.jsonl; a rerun skips cases already there with the same reference, candidate,
device and policy.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stitchcuda.api.v1 import code_pb2, verify_pb2
from stitchcuda.shared import candidate as candidate_format
from stitchcuda.shared.artifacts import sha256_hex
from stitchcuda.shared.errors import InvalidRequest, ProblemError
from stitchcuda.shared.gpu_slots import device_gpu, gpu_slot
from stitchcuda.verifier.settings import VerifierSettings

CASES = "cases.tsv"
RESULTS = "verify-results.jsonl"
REFERENCE = "reference.py"


@dataclass
class Case:
    name: str
    reference: Path
    candidate: Path


def discover(root: Path) -> list[Case]:
    """The cases of a batch folder; InvalidRequest says what it looked for when there are none."""
    if not root.is_dir():
        raise InvalidRequest(f"{root}: not a folder")
    table = root / CASES
    cases: list[Case] = []
    if table.is_file():
        for number, raw in enumerate(table.read_text().splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = [p.strip() for p in line.split("\t")]
            if len(parts) != 2:
                raise InvalidRequest(f"{table}:{number}: want 'reference<TAB>candidate', got {raw!r}")
            ref, cand = (root / p for p in parts)
            cases.append(Case(f"{number}:{parts[1]}", ref, cand))
        return cases
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        ref = folder / REFERENCE
        if not ref.is_file():
            continue
        for entry in sorted(folder.iterdir()):
            if entry.name == REFERENCE or entry.name.startswith((".", "_")):
                continue
            if entry.is_dir() or entry.suffix == ".py":
                cases.append(Case(f"{folder.name}/{entry.name}", ref, entry))
    if not cases:
        raise InvalidRequest(
            f"{root} holds no cases: looked for {CASES} (reference<TAB>candidate per line) or folders "
            f"holding {REFERENCE} beside a candidate (.py file or folder)"
        )
    return cases


def load(case: Case, device: str) -> code_pb2.Candidate:
    """The case's candidate in any format `verify` takes (InvalidRequest names what it looked for)."""
    path = case.candidate
    if path.is_dir():
        cand = candidate_format.read_dir(path)
    elif path.is_file():
        cand = candidate_format.from_kernelbench_source(path.read_text(), backend=device)
    else:
        raise InvalidRequest(f"{path}: no such file or folder")
    cand.candidate_id = cand.candidate_id or path.stem
    return cand


def _build(blob: bytes, device: str) -> tuple[bool, str]:
    """In a pool process: the candidate's extensions into the shared build cache."""
    from stitchcuda.verifier.service import VerifierService

    settings = VerifierSettings()
    settings.standby = False
    result = VerifierService(settings).build(code_pb2.Candidate.FromString(blob), device=device)
    return result.ok, result.error


def run(
    root: Path,
    device: str,
    policy: verify_pb2.VerifyPolicy,
    emit: Callable[[dict[str, Any]], None],
    jobs: int = 0,
    settings: VerifierSettings | None = None,
) -> dict[str, Any]:
    """Verifies every case of root, emitting one record per case; returns (and emits) the summary."""
    from stitchcuda.verifier.cli import verdict_json
    from stitchcuda.verifier.service import VerifierService

    cases = discover(root)
    done = _previous(root / RESULTS)
    records: list[dict[str, Any]] = []
    todo: list[tuple[Case, code_pb2.Candidate | None, str, str]] = []
    for case in cases:
        try:
            loaded = load(case, device)
            key = _key(case, loaded, device, policy)
        except (InvalidRequest, OSError) as exc:
            todo.append((case, None, "", str(exc)))
            continue
        if key in done:
            records.append({**done[key], "resumed": True})
            emit(records[-1])
            continue
        todo.append((case, loaded, key, ""))
    workers = jobs or max(1, min(len(todo), (os.cpu_count() or 2) // 2))
    settings = settings or VerifierSettings()
    settings.standby = False
    service = VerifierService(settings)
    try:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            builds: list[Future[tuple[bool, str]] | None] = [
                pool.submit(_build, c.SerializeToString(), device) if c is not None else None
                for _, c, _, _ in todo
            ]
            for (case, cand, key, error), build in zip(todo, builds, strict=True):
                if build is not None:
                    build.result()  # the verification reuses the cached build (or its cached failure)
                record = _record(case, cand, error)
                if cand is not None:
                    try:
                        with _slot(settings, device):
                            verdict = service.verify(
                                case.reference.read_text(), cand, device=device, policy=policy
                            )
                    except (ProblemError, OSError) as exc:
                        record.update(error=f"reference: {exc}")
                    else:
                        view = verdict_json(verdict, device, fmt=cand.format)
                        record.update({k: v for k, v in view.items() if k not in {"findings", "verdict"}})
                        record["rejects"] = [
                            f"{f['rule']}: {f['detail']}"
                            for f in view["findings"]
                            if f["severity"] == "reject"
                        ][:5]
                        _append(root / RESULTS, {**record, "key": key})
                records.append(record)
                emit(record)
    finally:
        service.close()
    summary = summarize(records)
    emit({"summary": summary})
    return summary


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    accepted = [r for r in records if r.get("accepted")]
    errors = [r for r in records if r.get("error")]

    def geomean(key: str) -> float:
        values = [float(r[key]) for r in accepted if r.get(key)]
        return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0

    return {
        "cases": len(records),
        "accepted": len(accepted),
        "rejected": len(records) - len(accepted) - len(errors),
        "errors": len(errors),
        "resumed": sum(1 for r in records if r.get("resumed")),
        "geomean_speedup_vs_eager": geomean("speedup_vs_eager"),
        "geomean_speedup_vs_compile": geomean("speedup_vs_compile"),
    }


def _record(case: Case, cand: code_pb2.Candidate | None, error: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "case": case.name,
        "reference": str(case.reference),
        "candidate": str(case.candidate),
        "format": cand.format if cand is not None else "",
        "accepted": False,
    }
    if error:
        out["error"] = error
    return out


def _key(case: Case, cand: code_pb2.Candidate, device: str, policy: verify_pb2.VerifyPolicy) -> str:
    return sha256_hex(
        case.reference.read_text(),
        candidate_format.content_hash(cand),
        device,
        policy.SerializeToString(deterministic=True).hex(),
    )


def _previous(path: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill: that case runs again
        if isinstance(record, dict) and record.get("key"):
            out[str(record.pop("key"))] = record
    return out


def _append(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")


def _slot(settings: VerifierSettings, device: str) -> Any:
    import contextlib

    gpu = device_gpu(device)
    if gpu is None:
        return contextlib.nullcontext()
    return gpu_slot(settings.gpu_slot_dir, gpu, settings.gpu_slots_per_gpu)


__all__ = ["Case", "discover", "load", "run", "summarize"]
