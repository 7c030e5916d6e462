"""`stitchcuda admin`: create tenants, issue and revoke API keys, set quotas, list.

Changes reach every running gateway within STITCH_TENANCY_REFRESH_S (0.2 s by default). Help and
tables fit 80 columns: option values are shown as short metavars, and the tenant table keeps to the
columns an operator acts on.
"""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from stitchcuda.gateway.settings import GatewaySettings
from stitchcuda.gateway.tenancy import RedisTenantStore, Tenancy
from stitchcuda.gateway.wiring import default_quota
from stitchcuda.shared.errors import StitchError

app = typer.Typer(no_args_is_help=True, help="Manage tenants, API keys and quotas (STITCH_REDIS_URL).")
tenant_app = typer.Typer(no_args_is_help=True, help="Tenants.")
key_app = typer.Typer(no_args_is_help=True, help="API keys (shown once when issued, stored as HMAC-SHA256).")
quota_app = typer.Typer(no_args_is_help=True, help="Quotas (0 = unlimited).")
app.add_typer(tenant_app, name="tenant")
app.add_typer(key_app, name="key")
app.add_typer(quota_app, name="quota")

err = Console(stderr=True)
out = Console()

MaxJobs = Annotated[
    int | None,
    typer.Option("--max-concurrent-jobs", min=0, metavar="N", help="Queued + running jobs."),
]
GpuSeconds = Annotated[
    float | None, typer.Option("--gpu-seconds-per-month", min=0, metavar="S", help="GPU-seconds a month.")
]
Submits = Annotated[
    int | None, typer.Option("--submits-per-minute", min=0, metavar="N", help="Job submits a minute.")
]
Requests = Annotated[
    int | None, typer.Option("--requests-per-minute", min=0, metavar="N", help="API requests a minute.")
]


def open_tenancy(settings: GatewaySettings | None = None) -> Tenancy:
    from stitchcuda.shared.redis_store import RedisUsageMeter, connect

    settings = settings or GatewaySettings()
    client = connect(settings.redis_url)
    return Tenancy(
        RedisTenantStore(client),
        RedisUsageMeter(client),
        settings.secret_key.get_secret_value(),
        default_quota=default_quota(settings),
        key_cache_s=0,
    )


def _fail(exc: StitchError) -> typer.Exit:
    err.print(f"[bold red]error:[/] {exc}")
    return typer.Exit(2)


@tenant_app.command("create")
def tenant_create(
    tenant_id: str,
    name: Annotated[str, typer.Option(help="Display name.")] = "",
    max_concurrent_jobs: MaxJobs = None,
    gpu_seconds_per_month: GpuSeconds = None,
    submits_per_minute: Submits = None,
    requests_per_minute: Requests = None,
    no_key: Annotated[bool, typer.Option("--no-key", help="Issue no first API key.")] = False,
) -> None:
    """Creates a tenant with the default quotas (or the ones given) and, by default, a first key."""
    try:
        tenancy = open_tenancy()
        tenancy.create_tenant(tenant_id, name)
        tenant = tenancy.set_quota(
            tenant_id,
            max_concurrent_jobs=max_concurrent_jobs,
            gpu_seconds_per_month=gpu_seconds_per_month,
            submits_per_minute=submits_per_minute,
            requests_per_minute=requests_per_minute,
        )
        err.print(f"created tenant [bold]{tenant.tenant_id}[/] {tenant.quota}")
        if not no_key:
            info, key = tenancy.issue_key(tenant_id, "first key")
            err.print(f"API key {info.key_id} (shown once; store it now):")
            out.print(key, highlight=False, soft_wrap=True)
    except StitchError as exc:
        raise _fail(exc) from None


@tenant_app.command("list")
def tenant_list() -> None:
    """Tenants: quotas, running and queued jobs, this month's GPU-seconds."""
    from stitchcuda.shared.admission import RedisAdmission

    try:
        tenancy = open_tenancy()
        assert isinstance(tenancy.store, RedisTenantStore)
        admission = RedisAdmission(tenancy.store.redis)
        # Counts are repaired first: places held by jobs that ended or vanished in a crash are released.
        admission.sweep()
        table = Table("tenant", "state", "jobs max", "running", "queued", "GPU-s used/quota", "submit/min")
        for t in tenancy.store.list_tenants():
            usage = tenancy.usage_of(t.tenant_id)
            queued = admission.waiting(t.tenant_id)
            table.add_row(
                t.tenant_id if t.name == t.tenant_id else f"{t.tenant_id}\n({t.name})",
                "disabled" if t.disabled else "enabled",
                _limit(t.quota.max_concurrent_jobs), str(max(0, int(usage["active_jobs"]) - queued)),
                str(queued), f"{usage['gpu_seconds']:.0f}/{_limit(t.quota.gpu_seconds_per_month)}",
                _limit(t.quota.submits_per_minute),
            )  # fmt: skip
        out.print(table)
    except StitchError as exc:
        raise _fail(exc) from None


def _limit(value: float) -> str:
    return f"{value:.0f}" if value else "-"


@tenant_app.command("disable")
def tenant_disable(tenant_id: str) -> None:
    """Refuses every request of the tenant (its keys stay, for re-enabling)."""
    try:
        open_tenancy().set_disabled(tenant_id, True)
        err.print(f"tenant {tenant_id} disabled")
    except StitchError as exc:
        raise _fail(exc) from None


@tenant_app.command("enable")
def tenant_enable(tenant_id: str) -> None:
    """Accepts the tenant's requests again."""
    try:
        open_tenancy().set_disabled(tenant_id, False)
        err.print(f"tenant {tenant_id} enabled")
    except StitchError as exc:
        raise _fail(exc) from None


@key_app.command("issue")
def key_issue(tenant_id: str, label: Annotated[str, typer.Option()] = "") -> None:
    """Issues a new key for the tenant; it is printed once on stdout and never stored in clear."""
    try:
        info, key = open_tenancy().issue_key(tenant_id, label)
    except StitchError as exc:
        raise _fail(exc) from None
    err.print(f"API key {info.key_id} for {tenant_id} (shown once):")
    out.print(key, highlight=False, soft_wrap=True)


@key_app.command("revoke")
def key_revoke(key_id: str) -> None:
    """Revokes a key by its id; every gateway refuses it within a second."""
    try:
        info = open_tenancy().revoke_key(key_id)
    except StitchError as exc:
        raise _fail(exc) from None
    err.print(f"revoked key {info.key_id} of tenant {info.tenant_id}")


@key_app.command("list")
def key_list(tenant_id: str) -> None:
    """The tenant's keys: id, label, creation time (never the key itself)."""
    try:
        keys = open_tenancy().store.list_keys(tenant_id)
    except StitchError as exc:
        raise _fail(exc) from None
    table = Table("key id", "label", "created")
    for k in keys:
        table.add_row(k.key_id, k.label, time.strftime("%Y-%m-%d %H:%M", time.gmtime(k.created_at)))
    out.print(table)


@quota_app.command("set")
def quota_set(
    tenant_id: str,
    max_concurrent_jobs: MaxJobs = None,
    gpu_seconds_per_month: GpuSeconds = None,
    submits_per_minute: Submits = None,
    requests_per_minute: Requests = None,
) -> None:
    """Changes the given quotas of the tenant; the others stay."""
    try:
        tenant = open_tenancy().set_quota(
            tenant_id,
            max_concurrent_jobs=max_concurrent_jobs,
            gpu_seconds_per_month=gpu_seconds_per_month,
            submits_per_minute=submits_per_minute,
            requests_per_minute=requests_per_minute,
        )
    except StitchError as exc:
        raise _fail(exc) from None
    err.print(f"{tenant.tenant_id}: {tenant.quota}")
