"""Tenancy: keys stored only as HMAC-SHA256, revocation, disabled tenants, quotas and reservations."""

import hashlib
import hmac

import pytest

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.gateway import tenancy as tenancy_module
from stitchcuda.gateway.tenancy import MemoryTenantStore, Quota, Tenancy
from stitchcuda.shared.errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    Unauthenticated,
)
from stitchcuda.shared.stores import MemoryUsageMeter

SECRET = "tenancy-secret"


def make(
    states: dict[str, int] | None = None, secret: str = SECRET, store: MemoryTenantStore | None = None
) -> Tenancy:
    states = states if states is not None else {}
    store = store or MemoryTenantStore(lambda job_id: states.get(job_id, 0))
    return Tenancy(store, MemoryUsageMeter(), secret, key_cache_s=0)


def test_keys_are_stored_only_as_hmac_sha256_with_the_secret_key():
    tenancy = make()
    tenancy.create_tenant("acme")
    info, key = tenancy.issue_key("acme", "ci")
    assert key.startswith("stk_") and info.key_id in key
    store = tenancy.store
    assert isinstance(store, MemoryTenantStore)
    stored_hashes = list(store._by_hash)
    assert stored_hashes == [hmac.new(SECRET.encode(), key.encode(), hashlib.sha256).hexdigest()]
    assert key not in repr(store.__dict__)
    assert tenancy.authenticate(key).tenant_id == "acme"
    # The same store read with another secret key knows no key at all.
    with pytest.raises(Unauthenticated):
        make(secret="another-secret", store=store).authenticate(key)


def test_wrong_missing_and_revoked_keys_are_unauthenticated():
    tenancy = make()
    tenancy.create_tenant("acme")
    info, key = tenancy.issue_key("acme")
    for bad in ("", None, key + "x", "stk_" + "0" * 40):
        with pytest.raises(Unauthenticated):
            tenancy.authenticate(bad)
    tenancy.revoke_key(info.key_id)
    with pytest.raises(Unauthenticated):
        tenancy.authenticate(key)
    with pytest.raises(NotFound):
        tenancy.revoke_key(info.key_id)


def test_revocation_clears_the_authentication_cache():
    store = MemoryTenantStore(lambda job_id: 0)
    tenancy = Tenancy(store, MemoryUsageMeter(), SECRET, key_cache_s=60)
    tenancy.create_tenant("acme")
    info, key = tenancy.issue_key("acme")
    tenancy.authenticate(key)  # now cached
    tenancy.revoke_key(info.key_id)
    with pytest.raises(Unauthenticated):
        tenancy.authenticate(key)


def test_disabled_tenants_are_refused():
    tenancy = make()
    tenancy.create_tenant("acme")
    _, key = tenancy.issue_key("acme")
    tenancy.set_disabled("acme", True)
    with pytest.raises(PermissionDenied):
        tenancy.authenticate(key)
    tenancy.set_disabled("acme", False)
    assert tenancy.authenticate(key).tenant_id == "acme"


def test_tenant_ids_and_quotas_are_validated():
    tenancy = make()
    for bad in ("", "Acme", "a b", "../x", "x" * 64):
        with pytest.raises(InvalidRequest):
            tenancy.create_tenant(bad)
    tenancy.create_tenant("acme")
    with pytest.raises(Conflict):
        tenancy.create_tenant("acme")
    with pytest.raises(InvalidRequest):
        tenancy.set_quota("acme", max_concurrent_jobs=-1)
    with pytest.raises(InvalidRequest):
        tenancy.set_quota("acme", cpu_cores=3)
    with pytest.raises(NotFound):
        tenancy.set_quota("nobody", max_concurrent_jobs=3)
    updated = tenancy.set_quota("acme", max_concurrent_jobs=7, submits_per_minute=None)
    assert (
        updated.quota.max_concurrent_jobs == 7
        and updated.quota.submits_per_minute == Quota().submits_per_minute
    )
    with pytest.raises(NotFound):
        tenancy.issue_key("nobody")


def test_the_concurrency_slot_frees_when_the_job_ends():
    states: dict[str, int] = {}
    tenancy = make(states)
    tenant = tenancy.create_tenant("acme", quota=Quota(max_concurrent_jobs=1))
    tenancy.admit(tenant, "j1", jobs_pb2.DEVICE_CPU)
    states["j1"] = jobs_pb2.JOB_STATE_VERIFYING
    with pytest.raises(QuotaExceeded):
        tenancy.admit(tenant, "j2", jobs_pb2.DEVICE_CPU)
    states["j1"] = jobs_pb2.JOB_STATE_SUCCEEDED
    tenancy.admit(tenant, "j2", jobs_pb2.DEVICE_CPU)
    assert tenancy.store.active_jobs("acme") == ["j2"]


def test_an_idempotent_replay_is_admitted_without_a_slot_and_gpu_quota_is_checked_after_it():
    states: dict[str, int] = {"j1": jobs_pb2.JOB_STATE_CODING}
    tenancy = make(states)
    tenant = tenancy.create_tenant("acme", quota=Quota(max_concurrent_jobs=1, gpu_seconds_per_month=10))
    assert tenancy.admit(tenant, "j1", jobs_pb2.DEVICE_CPU)
    assert not tenancy.admit(tenant, "j1", jobs_pb2.DEVICE_CUDA, unless_exists=True)  # replay: the first job
    assert tenancy.store.active_jobs("acme") == ["j1"]
    states["j1"] = jobs_pb2.JOB_STATE_SUCCEEDED
    tenancy.usage.add("acme", "gpu_seconds", 10.0)
    with pytest.raises(QuotaExceeded, match="GPU quota"):
        tenancy.admit(tenant, "j2", jobs_pb2.DEVICE_CUDA)
    assert tenancy.store.active_jobs("acme") == []  # the slot taken before the GPU check is given back


def test_a_reservation_whose_job_never_appeared_expires(monkeypatch: pytest.MonkeyPatch):
    tenancy = make()
    tenant = tenancy.create_tenant("acme", quota=Quota(max_concurrent_jobs=1))
    tenancy.admit(tenant, "ghost", jobs_pb2.DEVICE_CPU)  # the gateway died before creating it
    with pytest.raises(QuotaExceeded):
        tenancy.admit(tenant, "j2", jobs_pb2.DEVICE_CPU)
    monkeypatch.setattr(tenancy_module, "RESERVATION_GRACE_S", -1.0)
    tenancy.admit(tenant, "j2", jobs_pb2.DEVICE_CPU)


def test_rate_limits_count_per_tenant_and_kind():
    tenancy = make()
    a = tenancy.create_tenant("a", quota=Quota(submits_per_minute=2, requests_per_minute=3))
    b = tenancy.create_tenant("b", quota=Quota(submits_per_minute=2, requests_per_minute=0))
    for _ in range(2):
        tenancy.check_rate(a, "submits")
    with pytest.raises(QuotaExceeded, match="submits per minute"):
        tenancy.check_rate(a, "submits")
    tenancy.check_rate(b, "submits")  # another tenant has its own window
    for _ in range(3):
        tenancy.check_rate(a, "requests")
    with pytest.raises(QuotaExceeded):
        tenancy.check_rate(a, "requests")
    for _ in range(100):
        tenancy.check_rate(b, "requests")  # 0 = unlimited
