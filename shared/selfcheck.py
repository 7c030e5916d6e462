"""Checks that an installed StitchCUDA is whole: every module imports, every template renders.

Run by the image build (`python -m stitchcuda.shared.selfcheck`) and by the wheel test, so a package
that lost a folder or a data file fails where it is built, not on the first job it serves.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from importlib import resources

import stitchcuda
from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.shared import report
from stitchcuda.shared.artifacts import MemoryArtifactStore
from stitchcuda.verifier.sandbox import HARNESS_DIR

# What each service's container starts; they must import in the image.
ENTRY_MODULES = (
    "stitchcuda.cli",
    "stitchcuda.gateway.server",
    "stitchcuda.planner.worker",
    "stitchcuda.coder.worker",
    "stitchcuda.verifier.worker",
)
# Templates read at run time through importlib.resources.
TEMPLATES = ("templates/report.html.j2", "templates/bench.html.j2")
# Scripts the sandbox runs by path from its harness folder.
HARNESS_SCRIPTS = ("reference_runner.py", "candidate_runner.py")
# Optional extras: a module that needs one of these is skipped when it is not installed.
OPTIONAL = ("trl", "peft", "datasets", "vllm", "sentence_transformers", "verl")


def check() -> list[str]:
    """Problems found (empty when the installation is whole)."""
    problems: list[str] = []
    for name in ENTRY_MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:
            problems.append(f"{name} does not import: {exc!r}")
    for info in pkgutil.walk_packages(stitchcuda.__path__, "stitchcuda."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in OPTIONAL:
                problems.append(f"{info.name} does not import: {exc!r}")
        except Exception as exc:
            problems.append(f"{info.name} does not import: {exc!r}")
    for path in TEMPLATES:
        if not resources.files("stitchcuda.shared").joinpath(path).is_file():
            problems.append(f"stitchcuda.shared: {path} is missing")
    for script in HARNESS_SCRIPTS:
        if not (HARNESS_DIR / script).is_file():
            problems.append(f"the verifier's harness script {HARNESS_DIR / script} is missing")
    try:
        job = jobs_pb2.Job(job_id="selfcheck", tenant_id="selfcheck")
        html = report.to_html(report.build(job, MemoryArtifactStore(), None, "self-check"))
        if "<html" not in html.lower():
            problems.append("the job report renders without an <html> element")
    except Exception as exc:
        problems.append(f"the job report does not render: {exc!r}")
    return problems


def main() -> int:
    problems = check()
    for line in problems:
        print(f"selfcheck: {line}", file=sys.stderr)
    if not problems:
        print(f"selfcheck: stitchcuda {stitchcuda.__file__} is whole")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
