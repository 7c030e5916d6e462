"""`stitchcuda verify REFERENCE.py CANDIDATE [--device cpu|cuda|auto] [--json]`: one verdict, printed.

CANDIDATE is a candidate folder (model_new.py, sources, manifest.json, or no manifest and model_new.py's own
build calls) or a single KernelBench-style file building its extensions with cpp_extension.load_inline/load.
Exit status: 0 accepted, 1 rejected, 2 usage or reference error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.shared import candidate as candidate_format
from stitchcuda.shared import devices
from stitchcuda.shared.errors import StitchError

_SEVERITY = {
    verify_pb2.SEVERITY_INFO: "info",
    verify_pb2.SEVERITY_WARNING: "warning",
    verify_pb2.SEVERITY_REJECT: "reject",
}


def verdict_json(verdict: verify_pb2.Verdict, device: str, fmt: str = "") -> dict[str, Any]:
    """The stable CLI/JSON view of a verdict: the headline fields first, the full message under `verdict`."""
    return {
        "format": fmt,
        "accepted": verdict.accepted,
        "compiled": verdict.compiled,
        "correct": verdict.correct,
        "speedup_vs_eager": verdict.speedup_vs_eager,
        "speedup_vs_compile": verdict.speedup_vs_compile,
        "custom_kernel_share": verdict.custom_kernel_share,
        "reason": verdict.reason,
        "device": device,
        "findings": [
            {
                "rule": f.rule,
                "severity": _SEVERITY.get(f.severity, "unspecified"),
                "detail": f.detail,
                "where": f.where,
            }
            for f in verdict.findings
        ],
        "verdict": MessageToDict(verdict, preserving_proto_field_name=True),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="stitchcuda verify", description="Verify a candidate against a reference."
    )
    p.add_argument(
        "reference", type=Path, help="KernelBench-format reference program (Model, get_inputs, ...)"
    )
    p.add_argument("candidate", type=Path, help="candidate folder, or a single-file load_inline candidate")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--no-compile-baseline", action="store_true", help="skip timing torch.compile")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        from stitchcuda.verifier.service import VerifierService
        from stitchcuda.verifier.settings import VerifierSettings

        device = devices.resolve(args.device)
        if args.candidate.is_dir():
            cand = candidate_format.read_dir(args.candidate)
        else:
            cand = candidate_format.from_kernelbench_source(args.candidate.read_text(), backend=device)
        cand.candidate_id = cand.candidate_id or args.candidate.stem
        reference = args.reference.read_text()
        settings = VerifierSettings()
        if args.no_compile_baseline:
            settings.compile_baseline = False
        settings.standby = False  # one verification: no runner to prepare for a next one
        service = VerifierService(settings)
        try:
            verdict = service.verify(reference, cand, device=device)
        finally:
            service.close()
    except (StitchError, OSError) as exc:
        if args.json:
            print(json.dumps({"accepted": False, "error": str(exc), "code": getattr(exc, "code", "io")}))
        else:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(verdict_json(verdict, device, fmt=cand.format)))
    else:
        print(f"candidate format: {cand.format}")
        print(verdict.feedback)
    return 0 if verdict.accepted else 1
