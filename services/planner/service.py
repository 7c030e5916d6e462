"""PlannerService: reference source in, structured Plan out (capture, cost model, profile, fusion groups)."""

from __future__ import annotations

import logging

from stitchcuda.api.v1 import plan_pb2
from stitchcuda.planner import refine
from stitchcuda.planner.analysis import Analysis, FailureInfo, RunResult
from stitchcuda.planner.assemble import Assembler, Context, last_resort, problem_dtype
from stitchcuda.planner.cost import annotate, ceilings_for
from stitchcuda.planner.fusion import fuse
from stitchcuda.planner.graph import Graph
from stitchcuda.planner.llm import OpenAICompatibleLLM, PlannerLLM
from stitchcuda.planner.nsys import NsysProfiler
from stitchcuda.planner.runner import Outcome, ReferenceRunner
from stitchcuda.planner.settings import PlannerSettings
from stitchcuda.shared import devices
from stitchcuda.shared.artifacts import sha256_hex
from stitchcuda.shared.errors import ProblemError
from stitchcuda.shared.problem import validate_source

log = logging.getLogger("stitchcuda.planner")

STAGES = {
    "import": "reference does not import",
    "init_inputs": "get_init_inputs() fails",
    "model": "Model(*get_init_inputs()) fails",
    "inputs": "get_inputs() fails",
    "forward": "reference fails on its own inputs",
    "run.forward": "reference fails on its own inputs",
    "capture.fx": "tracing the forward (its Python runs)",
}
# Stages in which only the reference's own code runs: a timeout or crash there is the reference's.
# An fx trace runs the forward's Python too: a forward that loops forever hangs it.
REFERENCE_STAGES = frozenset(
    {"import", "init_inputs", "model", "inputs", "forward", "run.forward", "capture.fx"}
)


def problem_error(name: str, failure: FailureInfo, device: str = "") -> ProblemError:
    if failure.stage == "definitions":
        return ProblemError(f"{name}: {failure.message}")
    what = STAGES.get(failure.stage, f"reference fails in {failure.stage}")
    if failure.stage == "run.forward" and device:
        what += f" on {device}"
    where = f"line {failure.line}: " if failure.line else ""
    memory = failure.type in ("MemoryError", "OutOfMemoryError") or "out of memory" in failure.message
    return ProblemError(
        f"{name}: {what}: {where}{failure.type}: {failure.message}",
        error_code="reference_out_of_memory" if memory else "reference_crashed",
    )


class PlannerService:
    """Analyses a KernelBench-format reference in a subprocess and writes the plan the Coder follows."""

    def __init__(self, settings: PlannerSettings | None = None, *, llm: PlannerLLM | None = None) -> None:
        self.settings = settings or PlannerSettings()
        self.runner = ReferenceRunner(self.settings)
        self.nsys = NsysProfiler(self.settings, self.runner)
        self._llm = llm

    @property
    def llm(self) -> PlannerLLM | None:
        if self._llm is None and self.settings.llm_enabled:
            self._llm = OpenAICompatibleLLM.from_settings(self.settings)
        return self._llm

    def plan(
        self,
        reference_source: str,
        *,
        problem_name: str = "problem",
        device: str = "cpu",
        profile: bool = True,
    ) -> plan_pb2.Plan:
        device = devices.resolve(device)
        validate_source(reference_source, max_bytes=self.settings.max_reference_bytes, name=problem_name)
        outcome = self.runner.plan(reference_source, device=device, run=True, profile=profile)
        warnings: list[str] = []
        analysis = self._analysis(outcome, problem_name, warnings)
        run = self._run(outcome, analysis, problem_name, device, warnings)
        ctx = Context(
            problem_name=problem_name,
            reference_sha256=sha256_hex(reference_source),
            device=device,
            analysis=analysis,
            ceilings=ceilings_for(
                self.settings, device, problem_dtype(analysis), run.device_name if run else ""
            ),
            run=run,
            warnings=[*analysis.warnings, *warnings],
        )
        if run is not None:
            ctx.warnings.extend(run.warnings)
            ctx.eager_ms = run.eager_ms.median if run.eager_ms else 0.0
            ctx.kernels, ctx.profiler = list(run.kernels), run.profiler
        if profile and analysis.fits and run is not None:
            self._profile_extras(reference_source, device, ctx)
        plan = self._assemble(ctx, analysis, run)
        log.info(
            "planned %s: %d subtasks, %.3g FLOP, floor %.4f ms%s",
            problem_name, len(plan.subtasks), plan.total_flops, plan.floor_ms,
            " (last resort)" if plan.last_resort else "",
        )  # fmt: skip
        return plan

    # ------------------------------------------------------------------ subprocess results
    def _analysis(self, outcome: Outcome, name: str, warnings: list[str]) -> Analysis:
        analysis = outcome.analysis
        if analysis is not None and analysis.error is not None:
            raise problem_error(name, analysis.error)
        if analysis is not None and analysis.ok:
            return analysis
        stage = outcome.timed_out or outcome.stage
        if outcome.timed_out and stage in REFERENCE_STAGES:
            raise ProblemError(
                f"{name}: the reference did not finish in {stage} ({STAGES.get(stage, stage)}) within "
                f"{self.settings.analysis_timeout_s:g} s: it loops or hangs",
                error_code="reference_timeout",
            )
        if analysis is None and outcome.returncode not in (0, None) and stage in REFERENCE_STAGES:
            raise ProblemError(
                f"{name}: the reference crashed during {stage} (exit status {outcome.returncode})",
                detail=outcome.stderr[-2000:],
                error_code="reference_crashed",
            )
        why = (
            f"analysis timed out in {stage}"
            if outcome.timed_out
            else (
                analysis.internal_error.strip().splitlines()[-1]
                if analysis and analysis.internal_error
                else ""
            )
            or outcome.unreadable
            or f"the analysis process ended without a report (exit status {outcome.returncode}): "
            + outcome.stderr.strip()[-300:]
        )
        warnings.append(f"planner analysis failed: {why}")
        return Analysis(ok=False, capture="none", capture_error=why)

    def _run(
        self, outcome: Outcome, analysis: Analysis, name: str, device: str, warnings: list[str]
    ) -> RunResult | None:
        run = outcome.run
        if run is not None and run.error is not None:
            raise problem_error(name, run.error, device)
        if run is not None and run.ok:
            return run
        if not analysis.ok:
            return None
        if not analysis.fits:
            size = (analysis.input_bytes + analysis.parameter_bytes) / (1 << 30)
            warnings.append(
                f"inputs and parameters ({size:.2f} GiB) exceed max_real_bytes "
                f"({self.settings.max_real_bytes / (1 << 30):.2f} GiB): planned on the meta device only, "
                "not run"
            )
        elif outcome.timed_out in REFERENCE_STAGES:
            # The analysis traced it; its own forward then did not return: nothing downstream can run it.
            raise ProblemError(
                f"{name}: the reference's forward did not finish on real inputs within "
                f"{self.runner.last_run_budget:g} s ({outcome.timed_out}): it loops or hangs",
                error_code="reference_timeout",
            )
        elif outcome.timed_out:
            warnings.append(
                f"the real run timed out in {outcome.timed_out} after {self.settings.profile_timeout_s:g} s: "
                "not profiled"
            )
        elif run is not None and run.internal_error:
            warnings.append(
                f"the real run failed inside the planner: {run.internal_error.strip().splitlines()[-1]}"
            )
        else:
            warnings.append(f"the real run gave no report (exit status {outcome.returncode})")
        return None

    def _profile_extras(self, source: str, device: str, ctx: Context) -> None:
        """torch.compile timing and, on CUDA, an nsys kernel summary; either may be unavailable."""
        if self.settings.profile_compile:
            compiled = self.runner.compile(source, device=device)
            result = compiled.compiled
            if result is not None and result.ok and result.compile_ms is not None:
                ctx.compile_ms = result.compile_ms.median
                ctx.notes.append(
                    f"torch.compile: {result.compile_s:.1f} s to compile, {ctx.compile_ms:.4f} ms per call"
                )
            elif compiled.timed_out:
                ctx.warnings.append(
                    f"torch.compile did not finish within {self.settings.compile_timeout_s:g} s: "
                    "compile_ms not measured"
                )
            else:
                why = (result.error if result is not None else "") or compiled.stderr.strip()[-300:]
                ctx.warnings.append(f"torch.compile unavailable: {str(why)[:400]}")
        summary = self.nsys.summarise(source, device)
        if summary.kernels:
            ctx.kernels = summary.kernels
            ctx.profiler = f"nsys + {ctx.profiler}" if ctx.profiler else "nsys"
        if summary.warning:
            ctx.warnings.append(summary.warning)
        if summary.note:
            ctx.notes.append(summary.note)

    # ------------------------------------------------------------------ plans
    def _assemble(self, ctx: Context, analysis: Analysis, run: RunResult | None) -> plan_pb2.Plan:
        if analysis.capture == "none" or not analysis.nodes:
            reason = analysis.capture_error or "the forward could not be captured as a graph"
            flops = analysis.eager_flops or (run.eager_flops if run and run.eager_flops else 0.0)
            return last_resort(ctx, reason, flops)
        if analysis.capture == "export":
            ctx.warnings.append(
                f"torch.fx could not trace the forward ({analysis.capture_error}); captured with "
                "torch.export "
                "instead: op names are ATen-level and differ from an fx trace"
            )
        try:
            graph = Graph.from_analysis(analysis)
            annotate(graph)
            groups, fuser = fuse(graph, library_gemm=self.settings.library_gemm)
            plan = Assembler(graph, fuser, groups, ctx).plan()
            problems = coverage_errors(graph, plan)
            if problems:
                raise AssertionError("; ".join(problems))
        except Exception as exc:  # a planner defect must not cost the job: fall back, say why
            log.exception("deterministic planning failed")
            return last_resort(ctx, f"planner error: {type(exc).__name__}: {exc}", analysis.eager_flops)
        if self.llm is not None:
            plan = self._refine(plan, graph, ctx)
        return plan

    def _refine(self, plan: plan_pb2.Plan, graph: Graph, ctx: Context) -> plan_pb2.Plan:
        llm = self.llm
        assert llm is not None
        try:
            answer = llm.complete(refine.messages(plan, graph), refine.SCHEMA)
        except Exception as exc:
            plan.warnings.append(
                f"LLM refinement failed ({type(exc).__name__}: {exc}); kept the deterministic plan"
            )
            return plan
        try:
            refinement = refine.parse(answer, graph, library_gemm=self.settings.library_gemm)
            refined = Assembler(graph, refinement.fuser, refinement.groups, ctx).plan()
            problems = coverage_errors(graph, refined)
            if problems:
                raise refine.InvalidAnswer("; ".join(problems))
        except refine.InvalidAnswer as exc:
            plan.warnings.append(f"LLM refinement rejected: {exc}; kept the deterministic plan")
            return plan
        refined.planner = f"deterministic+llm ({llm.name})"
        orch = refined.orchestration
        if refinement.cuda_graphs is False:
            orch.cuda_graphs = False  # the LLM may veto CUDA graphs, never enable them where capture forbids
        orch.init_time_transforms.extend(f"llm: {t}" for t in refinement.init_time_transforms)
        orch.notes.extend(f"llm: {n}" for n in refinement.notes)
        return refined


def coverage_errors(graph: Graph, plan: plan_pb2.Plan) -> list[str]:
    """Every compute node in exactly one subtask, and no subtask naming a node the graph lacks."""
    count: dict[str, int] = {}
    errors = []
    for st in plan.subtasks:
        for op in st.ops:
            count[op.name] = count.get(op.name, 0) + 1
            if op.name not in graph.by_name:
                errors.append(f"{st.id} names unknown op {op.name}")
    for node in graph.compute_nodes():
        if count.get(node.name, 0) != 1:
            errors.append(f"{node.name} is in {count.get(node.name, 0)} subtasks")
    return errors
