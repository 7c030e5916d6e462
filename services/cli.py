"""The `stitchcuda` command: embedded optimize/verify/plan/bench, and the platform's up/submit/admin."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

app = typer.Typer(
    name="stitchcuda",
    help="Turn a PyTorch reference program into a verified, faster GPU (or CPU) program.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)
EXIT_OK, EXIT_REJECTED, EXIT_USAGE = 0, 1, 2


class DeviceChoice(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class PolicyChoice(StrEnum):
    strict = "strict"
    library = "library"


POLICY_HELP = (
    "Kernel policy: strict (GEMM/convolution must be the program's own kernels) or library "
    "(declared cuBLAS/cuDNN calls accepted, the custom-share rule applied to the time outside them)."
)


class Backend(StrEnum):
    builtin = "builtin"
    llm = "llm"


def _fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def _load_problem(path: Path) -> Any:
    from stitchcuda.shared import problem
    from stitchcuda.shared.errors import ProblemError

    try:
        return problem.load(path)
    except ProblemError as exc:
        raise _fail(str(exc)) from None


def _resolve_device(device: DeviceChoice) -> str:
    from stitchcuda.shared import devices
    from stitchcuda.shared.errors import StitchError

    try:
        return devices.resolve(device.value)
    except StitchError as exc:
        raise _fail(str(exc)) from None


@app.command()
def optimize(
    problem_path: Annotated[Path, typer.Argument(metavar="PROBLEM.py", help="KernelBench-format reference.")],
    device: Annotated[DeviceChoice, typer.Option(help="Where candidates run.")] = DeviceChoice.auto,
    rounds: Annotated[int, typer.Option(min=0, max=50, help="Optimize rounds after the first.")] = 2,
    out: Annotated[Path | None, typer.Option(help="Result folder (default: ./out/<problem>).")] = None,
    backend: Annotated[Backend, typer.Option(help="Coder backend.")] = Backend.builtin,
    samples: Annotated[int, typer.Option(min=1, max=16, help="Candidates per round.")] = 1,
    target_speedup: Annotated[float, typer.Option(min=0, help="Stop once reached (0 = never early).")] = 0.0,
    policy: Annotated[PolicyChoice, typer.Option(help=POLICY_HELP)] = PolicyChoice.strict,
) -> None:
    """Plan, code and verify PROBLEM.py in this process; write model_new.py and a report."""
    from stitchcuda.api.v1 import jobs_pb2
    from stitchcuda.embedded import EmbeddedPlatform
    from stitchcuda.shared import devices
    from stitchcuda.shared.errors import ProblemError
    from stitchcuda.shared.pipeline import rounds_text
    from stitchcuda.shared.settings import CommonSettings

    prob = _load_problem(problem_path)
    resolved = _resolve_device(device)
    out = out or Path("out") / prob.name
    spec = jobs_pb2.JobSpec(
        problem_name=prob.name,
        reference_source=prob.source,
        device=devices.to_proto(resolved),
        options=jobs_pb2.JobOptions(
            max_rounds=rounds,
            target_speedup=target_speedup,
            stagnation_rounds=2,
            min_improvement=0.02,
            coder_backend=backend.value,
            samples=samples,
            max_replans=1,
            kernel_policy=policy.value,
        ),
    )
    console.print(
        f"[bold]StitchCUDA[/] optimizing [cyan]{prob.name}[/] on [cyan]{resolved}[/] "
        f"({rounds_text(rounds)}, {policy.value} kernel policy)"
    )
    staging = Path(tempfile.mkdtemp(prefix="stitchcuda-run-"))
    platform = EmbeddedPlatform(CommonSettings(), artifact_root=staging / "artifacts")
    from stitchcuda.progress import EventPrinter
    from stitchcuda.shared.report import vs_compile

    printer = EventPrinter(console, max_rounds=rounds)
    try:
        job = platform.run(spec, on_event=printer)
    except ProblemError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise _fail(str(exc)) from None
    finally:
        printer.stop()
    first_line = job.status.message.splitlines()[0] if job.status.message else ""
    if job.status.state == jobs_pb2.JOB_STATE_FAILED and _is_reference_error(job):
        shutil.rmtree(staging, ignore_errors=True)
        raise _fail(f"{first_line} (error code {job.status.error_code})")
    _write_out(platform, job, out)
    shutil.rmtree(staging, ignore_errors=True)
    if job.status.state != jobs_pb2.JOB_STATE_SUCCEEDED:
        console.print(f"[bold red]no verified program:[/] {first_line} ({printer.rounds_line()})")
        console.print(f"report: {out / 'report.html'}")
        raise typer.Exit(EXIT_REJECTED)
    status = job.status
    console.print(
        f"[bold green]verified[/] {prob.name}: [bold]{status.best_speedup_vs_eager:.2f}x[/] vs eager, "
        f"{vs_compile(status.best_speedup_vs_compile)} ({status.best_candidate_id}; {printer.rounds_line()})"
    )
    console.print(f"wrote {out / 'model_new.py'}, {out / 'report.html'}")


def _is_reference_error(job: Any) -> bool:
    """A job that failed because the reference itself is broken (the planner said so), not the candidates."""
    return job.status.error_code in REFERENCE_ERRORS


# Error codes of a job whose reference is at fault (malformed, loops or hangs, runs out of memory, crashes).
REFERENCE_ERRORS = frozenset(
    {"invalid_problem", "reference_timeout", "reference_out_of_memory", "reference_crashed"}
)


def _write_out(platform: Any, job: Any, out: Path) -> None:
    """Writes the result folder atomically: a half-written --out is never left behind."""
    from stitchcuda.api.v1 import code_pb2
    from stitchcuda.shared.candidate import write_dir

    tmp = Path(tempfile.mkdtemp(prefix=".stitchcuda-", dir=out.parent if out.parent.exists() else None))
    for name in ("model_new.py", "report.json", "report.html", "trajectory.json"):
        key = job.artifacts.get(name)
        if key:
            (tmp / name).write_bytes(platform.artifacts.get(key))
    if "candidate.pb" in job.artifacts:
        candidate = code_pb2.Candidate.FromString(platform.artifacts.get(job.artifacts["candidate.pb"]))
        write_dir(candidate, tmp / "candidate")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        shutil.rmtree(out)
    shutil.move(str(tmp), str(out))


def _load_candidate(candidate: Path, device: str) -> Any:
    """A candidate folder or one .py file that builds its extensions, as `verify` and `reward` take it."""
    from stitchcuda.shared import candidate as cand_format
    from stitchcuda.shared.errors import InvalidRequest

    try:
        if candidate.is_dir():
            cand = cand_format.read_dir(candidate)
        elif candidate.is_file():
            cand = cand_format.from_kernelbench_source(candidate.read_text(), backend=device)
        else:
            raise _fail(f"{candidate}: no such file or folder")
    except InvalidRequest as exc:
        raise _fail(f"{candidate}: {exc}") from None
    cand.candidate_id = cand.candidate_id or candidate.stem
    return cand


@app.command()
def verify(
    reference: Annotated[Path | None, typer.Argument(metavar="REFERENCE.py")] = None,
    candidate: Annotated[
        Path | None,
        typer.Argument(
            metavar="CANDIDATE",
            help="A .py file building its extensions with cpp_extension.load_inline/load, or a folder.",
        ),
    ] = None,
    device: Annotated[DeviceChoice, typer.Option()] = DeviceChoice.auto,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    policy: Annotated[PolicyChoice, typer.Option(help=POLICY_HELP)] = PolicyChoice.strict,
    batch: Annotated[
        Path | None,
        typer.Option(
            help="Verify every case of DIR (cases.tsv, or folders with reference.py and candidates): "
            "JSON lines, resumable.",
            metavar="DIR",
        ),
    ] = None,
    jobs: Annotated[int, typer.Option(help="Parallel builds with --batch (0: half the cores).")] = 0,
) -> None:
    """Verify CANDIDATE against REFERENCE: exit 0 if accepted, 1 if rejected, 2 for a usage error."""
    from stitchcuda.api.v1 import verify_pb2
    from stitchcuda.shared.errors import ProblemError
    from stitchcuda.verifier.service import VerifierService

    request = verify_pb2.VerifyPolicy(kernel_policy=policy.value)
    if batch is not None:
        _verify_batch(batch, _resolve_device(device), request, jobs)
    if reference is None or candidate is None:
        raise _fail("verify needs REFERENCE.py and CANDIDATE, or --batch DIR")
    prob = _load_problem(reference)
    resolved = _resolve_device(device)
    cand = _load_candidate(candidate, resolved)
    if policy is PolicyChoice.library and not cand.build.libraries:
        # A hand-written program declares nothing: choosing the library policy here is the declaration.
        from stitchcuda.shared.policy import KernelPolicy

        cand.build.libraries.extend(sorted(KernelPolicy("library").families()))
    if not as_json:
        Console(stderr=True).print(f"candidate format: {cand.format}", highlight=False)
    try:
        verdict = VerifierService().verify(prob.source, cand, device=resolved, policy=request)
    except ProblemError as exc:
        raise _fail(str(exc)) from None
    if as_json:
        from stitchcuda.verifier.cli import verdict_json

        sys.stdout.write(json.dumps(verdict_json(verdict, resolved, fmt=cand.format), indent=2) + "\n")
    else:
        from stitchcuda.progress import print_verdict

        print_verdict(Console(), verdict)
    raise typer.Exit(EXIT_OK if verdict.accepted else EXIT_REJECTED)


def _verify_batch(root: Path, device: str, policy: Any, jobs: int) -> None:
    """`verify --batch DIR`: one JSON line per case on stdout, then the summary; exit 0 when all accepted."""
    from stitchcuda.shared.errors import InvalidRequest
    from stitchcuda.verifier import batch

    def emit(record: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()

    try:
        summary = batch.run(root, device, policy, emit, jobs=jobs)
    except InvalidRequest as exc:
        raise _fail(str(exc)) from None
    raise typer.Exit(EXIT_OK if summary["accepted"] == summary["cases"] else EXIT_REJECTED)


class SkillChoice(StrEnum):
    generate = "generate"
    optimize = "optimize"


@app.command()
def reward(
    reference: Annotated[Path, typer.Argument(metavar="REFERENCE.py")],
    candidate: Annotated[
        Path, typer.Argument(metavar="CANDIDATE", help="A load_inline .py file or a folder.")
    ],
    skill: Annotated[
        SkillChoice, typer.Option(help="The Coder skill the rollout used.")
    ] = SkillChoice.generate,
    device: Annotated[DeviceChoice, typer.Option()] = DeviceChoice.auto,
    feedback: Annotated[
        Path | None, typer.Option(help="A file with the feedback an optimize rollout was given.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """The RL reward of CANDIDATE with every component (judge from STITCH_JUDGE_*, else judge-free):
    exit 0 for a positive reward, 1 for zero, 2 for a usage error."""
    from stitchcuda.shared.errors import StitchError
    from stitchcuda.training.judge import RubricJudge
    from stitchcuda.training.report import reward_table
    from stitchcuda.training.reward import RewardService, RewardSettings

    prob = _load_problem(reference)
    resolved = _resolve_device(device)
    cand = _load_candidate(candidate, resolved)
    settings = RewardSettings()
    service = RewardService(settings, judge=RubricJudge.from_settings(settings))
    try:
        text = feedback.read_text() if feedback is not None else ""
        result = service.score(prob.source, cand, skill.value, device=resolved, feedback=text)
    except (StitchError, OSError) as exc:
        raise _fail(str(exc)) from None
    finally:
        service.close()
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    else:
        Console().print(reward_table(result))
    raise typer.Exit(EXIT_OK if result.reward > 0 else EXIT_REJECTED)


@app.command()
def plan(
    problem_path: Annotated[Path, typer.Argument(metavar="PROBLEM.py")],
    device: Annotated[DeviceChoice, typer.Option()] = DeviceChoice.auto,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Analyse PROBLEM.py: graph, FLOPs/bytes, profile and the fusion plan."""
    from stitchcuda.planner.render import plan_to_json, render_plan
    from stitchcuda.planner.service import PlannerService
    from stitchcuda.shared.errors import ProblemError

    prob = _load_problem(problem_path)
    resolved = _resolve_device(device)
    try:
        result = PlannerService().plan(prob.source, problem_name=prob.name, device=resolved)
    except ProblemError as exc:
        raise _fail(str(exc)) from None
    if as_json:
        sys.stdout.write(json.dumps(plan_to_json(result), indent=2) + "\n")
    else:
        Console().print(render_plan(result))


@app.command()
def bench(
    suite: Annotated[
        Path, typer.Argument(metavar="DIR", help="A folder of problems (KernelBench: levelN/*.py).")
    ],
    device: Annotated[DeviceChoice, typer.Option(help="Where candidates run.")] = DeviceChoice.auto,
    rounds: Annotated[int, typer.Option(min=0, max=50, help="Optimize rounds after the first.")] = 1,
    policy: Annotated[PolicyChoice, typer.Option(help=POLICY_HELP)] = PolicyChoice.strict,
    out: Annotated[Path | None, typer.Option(help="Result folder (default: bench-out/<DIR name>).")] = None,
    pattern: Annotated[str, typer.Option(help="Glob of problem files under DIR.")] = "**/*.py",
    limit: Annotated[int, typer.Option(min=0, help="Only the first N problems (0 = all).")] = 0,
    jobs: Annotated[
        int,
        typer.Option(
            min=1, max=64, help="Problems in flight (builds in parallel; GPU timing one at a time)."
        ),
    ] = 1,
    fresh: Annotated[bool, typer.Option(help="Ignore the results of previous runs.")] = False,
) -> None:
    """Run the optimize loop on every problem of DIR (resumable); write results.json and report.html."""
    from stitchcuda.bench import BenchSettings, discover, run_bench
    from stitchcuda.shared.errors import InvalidRequest

    try:
        tasks = discover(suite, pattern, limit)
    except InvalidRequest as exc:
        raise _fail(str(exc)) from None
    resolved = _resolve_device(device)
    name = suite.resolve().name if suite.is_dir() else suite.stem
    settings = BenchSettings(device=resolved, rounds=rounds, policy=policy.value)
    code = run_bench(
        tasks, settings, out or Path("bench-out") / name, suite=name, jobs=jobs, fresh=fresh, console=console
    )
    raise typer.Exit(code)


@app.command()
def up(
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    grpc_port: Annotated[int, typer.Option()] = 50051,
    http_port: Annotated[int, typer.Option()] = 8080,
) -> None:
    """Start the whole platform on this machine (Redis from STITCH_REDIS_URL; S3 or a local SeaweedFS)."""
    try:
        from stitchcuda.gateway.local import run_up
    except ImportError as exc:
        raise _fail(
            f"the platform needs the platform extra: pip install 'stitchcuda[platform]' ({exc})"
        ) from None
    raise typer.Exit(run_up(host=host, grpc_port=grpc_port, http_port=http_port))


@app.command()
def submit(
    problem_path: Annotated[Path, typer.Argument(metavar="PROBLEM.py")],
    gateway: Annotated[
        str, typer.Option(help="HOST:PORT of the gateway's gRPC endpoint.")
    ] = "127.0.0.1:50051",
    watch: Annotated[bool, typer.Option(help="Follow progress until the job ends.")] = False,
    out: Annotated[Path | None, typer.Option(help="Download the result here when it ends.")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="STITCH_API_KEY", help="Tenant API key.")] = None,
    device: Annotated[DeviceChoice, typer.Option()] = DeviceChoice.auto,
    rounds: Annotated[int, typer.Option(min=0)] = 2,
) -> None:
    """Submit PROBLEM.py to a running platform over gRPC."""
    try:
        from stitchcuda.gateway.client import submit_main
    except ImportError as exc:
        raise _fail(f"submit needs the platform extra: pip install 'stitchcuda[platform]' ({exc})") from None
    _load_problem(problem_path)
    raise typer.Exit(submit_main(problem_path, gateway, watch, out, api_key, device.value, rounds))


def _mount_admin() -> None:
    try:
        from stitchcuda.gateway.admin import app as admin_app
    except ImportError:

        @app.command(name="admin")
        def admin_unavailable() -> None:
            """Manage tenants, API keys and quotas (needs the platform extra)."""
            raise _fail("admin needs the platform extra: pip install 'stitchcuda[platform]'")

        return
    app.add_typer(admin_app, name="admin", help="Manage tenants, API keys and quotas.")


_mount_admin()


def _mount_train() -> None:
    # The train commands import TRL only when they run: the sub-app itself needs nothing extra.
    from stitchcuda.training.cli import app as train_app

    app.add_typer(train_app, name="train", help="Train the Coder with RL (GRPO on TRL with LoRA).")


_mount_train()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
