"""Terminal rendering for people: live job progress and a verdict summary (rich)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.status import Status
from rich.table import Table

from stitchcuda.api.v1 import jobs_pb2, verify_pb2
from stitchcuda.shared import pipeline
from stitchcuda.shared.report import interval_text

_STYLE = {
    jobs_pb2.EVENT_KIND_STATE: "bold",
    jobs_pb2.EVENT_KIND_VERDICT: "cyan",
    jobs_pb2.EVENT_KIND_WARNING: "yellow",
    jobs_pb2.EVENT_KIND_LOG: "",
}


class EventPrinter:
    """Prints lasting events as lines and keeps the latest progress message on a spinner."""

    def __init__(self, console: Console, max_rounds: int | None = None) -> None:
        self.console = console
        self.started = time.monotonic()
        self._status: Status | None = None
        self.max_rounds = max_rounds
        # Rounds whose coder or verifier reported (numbered from 0, as in the messages and candidate ids).
        self.rounds_seen: set[int] = set()

    def __call__(self, event: jobs_pb2.JobEvent) -> None:
        if event.stage in ("code", "verify") and event.kind != jobs_pb2.EVENT_KIND_PROGRESS:
            self.rounds_seen.add(int(event.round))
        stamp = f"[dim]{time.monotonic() - self.started:6.1f}s[/]"
        stage = f"[magenta]{event.stage or '-':>8}[/]"
        if event.kind == jobs_pb2.EVENT_KIND_PROGRESS:
            text = f"{stage} {event.message}"
            if self._status is None:
                self._status = self.console.status(text)
                self._status.start()
            else:
                self._status.update(text)
            return
        style = _STYLE.get(event.kind, "")
        message = f"[{style}]{event.message}[/]" if style else event.message
        self.console.print(f"{stamp} {stage} {message}", highlight=False)

    def rounds_line(self) -> str:
        """'3 of up to 3 rounds (round 0 generates, rounds 1-2 optimize) run', the banner's words."""
        asked = pipeline.rounds_text(self.max_rounds) if self.max_rounds is not None else "the rounds"
        return f"{len(self.rounds_seen)} of {asked} run"

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


def print_verdict(console: Console, verdict: verify_pb2.Verdict) -> None:
    head = "[bold green]ACCEPTED[/]" if verdict.accepted else "[bold red]REJECTED[/]"
    console.print(f"{head} {verdict.candidate_id}: {verdict.reason}")
    timing = verdict.timing
    if verdict.correct and timing.median_ms:
        console.print(
            f"  candidate {timing.median_ms:.4f} ms · eager {timing.eager_ms:.4f} ms "
            f"({verdict.speedup_vs_eager:.2f}x) · torch.compile "
            + (
                f"{timing.compile_ms:.4f} ms ({verdict.speedup_vs_compile:.2f}x)"
                if timing.compile_available
                else "n/a"
            )
            + f" · custom-kernel share {100 * verdict.custom_kernel_share:.0f}%"
        )
        if timing.rounds:
            console.print(
                f"  {100 * timing.confidence:.0f}% interval vs eager "
                f"{interval_text(timing.speedup_vs_eager_low, timing.speedup_vs_eager_high) or 'n/a'}"
                + (
                    f", vs torch.compile "
                    f"{interval_text(timing.speedup_vs_compile_low, timing.speedup_vs_compile_high) or 'n/a'}"
                    if timing.compile_available
                    else ""
                )
                + f" · {timing.rounds} interleaved rounds · eager baseline {timing.eager_source}"
                + (f", torch.compile {timing.compile_source}" if timing.compile_source else "")
                + (" · [yellow]noisy[/]" if timing.noisy else "")
            )
    if verdict.findings:
        table = Table(show_header=True, header_style="bold")
        for col in ("rule", "severity", "detail", "where"):
            table.add_column(col)
        names = {1: "info", 2: "warning", 3: "[red]reject[/]"}
        for f in verdict.findings:
            table.add_row(f.rule, names.get(f.severity, ""), f.detail, f.where)
        console.print(table)


def describe_job(job: Any) -> str:
    state = jobs_pb2.JobState.Name(job.status.state).removeprefix("JOB_STATE_").lower()
    return f"{job.job_id} {state}: {job.status.message}"
