"""Fast stand-ins for the Planner, Coder and Verifier services (same method signatures), and a launcher
that runs them in real Celery worker processes: `python -m tests.integration.platform.fakes planner`.

Knobs (environment, read in the worker process):
  STITCH_FAKE_VERIFY_SLEEP_S   seconds verify() sleeps (a long task to kill or cancel)
  STITCH_FAKE_MARKERS          folder where each verify() start writes `verify-<pid>-<n>` (the test's probe)
  STITCH_FAKE_SPEEDUP          speedup of every accepted verdict (default 1.5)
  STITCH_FAKE_PLAN_FAIL        when set, plan() raises ProblemError with this text
  STITCH_FAKE_PLAN_FAIL_PREFIX plan() raises ProblemError for problems whose name starts with this
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any

from stitchcuda.api.v1 import code_pb2, jobs_pb2, plan_pb2, verify_pb2
from stitchcuda.shared.errors import ProblemError

MODEL_NEW = """import torch
import torch.nn as nn
import fake_ext as ext


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        return ext.forward(x)
"""
BINDING = """#include <torch/extension.h>
torch::Tensor forward(torch::Tensor x) { return x * 2; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward, "forward"); }
"""
_counter = itertools.count()


def candidate(round_: int, index: int = 0) -> code_pb2.Candidate:
    return code_pb2.Candidate(
        schema_version=1,
        candidate_id=f"r{round_}c{index}",
        files=[
            code_pb2.SourceFile(path="model_new.py", content=MODEL_NEW),
            code_pb2.SourceFile(path="binding.cpp", content=BINDING + f"// round {round_}\n"),
        ],
        build=code_pb2.BuildManifest(extension_name="fake_ext", sources=["binding.cpp"], backend="cpu"),
        entry="model_new.py",
        coder="fake",
    )


class FakePlanner:
    def plan(
        self, source: str, *, problem_name: str = "problem", device: str = "cpu", **_: Any
    ) -> plan_pb2.Plan:
        failure = os.environ.get("STITCH_FAKE_PLAN_FAIL")
        if failure:
            raise ProblemError(failure)
        prefix = os.environ.get("STITCH_FAKE_PLAN_FAIL_PREFIX")
        if prefix and problem_name.startswith(prefix):
            raise ProblemError(f"{problem_name}: planning failed on purpose")
        return plan_pb2.Plan(
            schema_version=1,
            problem_name=problem_name,
            device=jobs_pb2.DEVICE_CPU,
            subtasks=[plan_pb2.Subtask(id="s0", kind=plan_pb2.SUBTASK_KIND_ELEMENTWISE)],
            planner="fake",
        )


class FakeCoder:
    def generate(
        self, source: str, plan: plan_pb2.Plan, *, round_: int = 0, **_: Any
    ) -> list[code_pb2.Candidate]:
        return [candidate(round_)]

    def optimize(
        self, source: str, plan: plan_pb2.Plan, previous: Any, verdict: Any, *, round_: int = 0, **_: Any
    ) -> list[code_pb2.Candidate]:
        return [candidate(round_)]


class FakeVerifier:
    def __init__(self, artifacts: Any = None) -> None:
        self.artifacts = artifacts

    def build(self, candidate: code_pb2.Candidate, *, device: str = "cpu") -> verify_pb2.BuildResult:
        return verify_pb2.BuildResult(ok=True, cached=True)

    def verify(
        self, source: str, candidate: code_pb2.Candidate, *, progress: Any = None, **_: Any
    ) -> verify_pb2.Verdict:
        markers = os.environ.get("STITCH_FAKE_MARKERS")
        if markers:
            Path(markers).mkdir(parents=True, exist_ok=True)
            (Path(markers) / f"verify-{os.getpid()}-{next(_counter)}-{candidate.candidate_id}").write_text(
                str(time.time())
            )
        delay = float(os.environ.get("STITCH_FAKE_VERIFY_SLEEP_S", "0") or 0)
        if delay:
            time.sleep(delay)
        speedup = float(os.environ.get("STITCH_FAKE_SPEEDUP", "1.5"))
        return verify_pb2.Verdict(
            schema_version=1,
            candidate_id=candidate.candidate_id,
            accepted=True,
            compiled=True,
            correct=True,
            speedup_vs_eager=speedup,
            speedup_vs_compile=speedup / 2,
            reason="accepted",
            device=jobs_pb2.DEVICE_CPU,
        )


def _stand_in_for_missing_services() -> None:
    """The worker modules import the real service classes (for annotations); while a service is still
    being written elsewhere its module may not import yet, and the fake does not need it."""
    import importlib
    import types

    for module, name in (("stitchcuda.planner.service", "PlannerService"), ("stitchcuda.coder.service", "CoderService"),
                         ("stitchcuda.verifier.service", "VerifierService")):  # fmt: skip
        try:
            importlib.import_module(module)
        except Exception:
            stand_in = types.ModuleType(module)
            setattr(stand_in, name, object)
            sys.modules[module] = stand_in


def main(argv: list[str]) -> int:
    """`python -m tests.integration.platform.fakes SERVICE [worker options]`: a worker on fake services."""
    from stitchcuda.shared.celery_app import worker_main

    _stand_in_for_missing_services()

    service, rest = argv[0], argv[1:]
    if service == "planner":
        from stitchcuda.planner import tasks as planner_tasks

        return worker_main("planner", ["planner"], rest, runtime=planner_tasks.runtime,
                           build=planner_tasks.build_runtime, service_factory=FakePlanner)  # fmt: skip
    if service == "coder":
        from stitchcuda.coder import tasks as coder_tasks

        return worker_main("coder", ["coder"], rest, runtime=coder_tasks.runtime,
                           build=coder_tasks.build_runtime, service_factory=FakeCoder)  # fmt: skip
    if service == "verifier":
        from stitchcuda.verifier import tasks as verifier_tasks

        return worker_main("verifier", ["verifier.build", "verifier.cpu"], rest, runtime=verifier_tasks.runtime,
                           build=verifier_tasks.build_runtime, service_factory=FakeVerifier)  # fmt: skip
    raise SystemExit(f"unknown service {service!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
