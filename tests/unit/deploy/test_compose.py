"""docker-compose.yml, checked offline: images, commands, env, ports, healthchecks, ordering, GPU profile."""

from __future__ import annotations

import importlib.util
import re
from typing import Any

import pytest
import yaml

from stitchcuda.shared.transport import JUDGE, QUEUES

from .support import ROOT, accepted_env, load_yaml, queues_of_command, service_of_command

COMPOSE = load_yaml(ROOT / "docker-compose.yml")
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
RAW = (ROOT / "docker-compose.yml").read_text()
OURS = {name: svc for name, svc in SERVICES.items() if "build" in svc}
WORKER_NAMES = {"planner", "coder", "verifier-build", "verifier-cpu", "verifier-gpu"}

# Service-level keys of the Compose Specification (a typo such as `depend_on` is silently ignored
# by nothing: compose refuses it, and so does this list).
SERVICE_KEYS = {
    "build", "cap_add", "cap_drop", "command", "container_name", "cpus", "depends_on", "deploy",
    "devices", "entrypoint", "env_file", "environment", "expose", "extra_hosts", "healthcheck",
    "image", "init", "ipc", "labels", "logging", "mem_limit", "network_mode", "networks", "pid",
    "platform", "ports", "privileged", "profiles", "pull_policy", "read_only", "restart", "runtime",
    "security_opt", "shm_size", "stop_grace_period", "stop_signal", "sysctls", "tmpfs", "ulimits",
    "user", "volumes", "working_dir", "gpus",
}  # fmt: skip
INTERPOLATION = re.compile(
    r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[-?])?(?P<arg>[^}]*)\}|\$(?P<bare>\w+)"
)


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable interpolation (${V}, ${V:-d}, ${V-d}, ${V:?e}, ${V?e}, $$)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        if m.group("bare"):
            raise ValueError(f"unbraced ${m.group('bare')}: write ${{{m.group('bare')}}}")
        name, op, arg = m.group("name"), m.group("op") or "", m.group("arg")
        value = env.get(name)
        missing = value is None or (op.startswith(":") and value == "")
        if op.endswith("?") and missing:
            raise KeyError(f"{name}: {arg}")
        if op.endswith("-") and missing:
            return arg
        return value or ""

    return INTERPOLATION.sub(sub, text)


def test_services_use_only_compose_spec_keys() -> None:
    for name, svc in SERVICES.items():
        assert set(svc) <= SERVICE_KEYS, (name, set(svc) - SERVICE_KEYS)


def test_every_variable_has_a_default_or_is_required_with_a_message() -> None:
    names = set()
    for m in INTERPOLATION.finditer(RAW):
        if m.group(0) == "$$":
            continue
        assert not m.group("bare"), f"unbraced variable ${m.group('bare')}"
        op, arg = m.group("op"), m.group("arg")
        assert op in (":-", "-", ":?", "?"), f"${{{m.group('name')}}} has neither a default nor a :? message"
        if "?" in op:
            assert len(arg) > 10, f"${{{m.group('name')}}} needs a message that tells what to set"
        names.add(m.group("name"))
    # The secrets are required: a compose file that starts with empty secrets is a security bug.
    for secret in ("STITCH_SECRET_KEY", "MINIO_ROOT_PASSWORD", "GRAFANA_ADMIN_PASSWORD"):
        assert re.search(r"\$\{" + secret + r":\?", RAW), secret
    assert names


def test_interpolation_refuses_to_start_without_secrets_and_resolves_with_them() -> None:
    with pytest.raises(KeyError, match=r"STITCH_SECRET_KEY|MINIO_ROOT_PASSWORD|GRAFANA"):
        interpolate(RAW, {})
    env = {
        "STITCH_SECRET_KEY": "s3cr3t-" * 4,
        "MINIO_ROOT_PASSWORD": "m" * 24,
        "GRAFANA_ADMIN_PASSWORD": "g" * 16,
    }
    rendered = yaml.safe_load(interpolate(RAW, env))
    gateway_env = rendered["services"]["gateway"]["environment"]
    assert gateway_env["STITCH_SECRET_KEY"] == env["STITCH_SECRET_KEY"]
    assert gateway_env["STITCH_S3_SECRET_KEY"] == env["MINIO_ROOT_PASSWORD"]
    assert rendered["services"]["minio"]["environment"]["MINIO_ROOT_PASSWORD"] == env["MINIO_ROOT_PASSWORD"]
    # MinIO's root user is the services' S3 access key, so the defaults agree too.
    assert (
        gateway_env["STITCH_S3_ACCESS_KEY"] == rendered["services"]["minio"]["environment"]["MINIO_ROOT_USER"]
    )
    coder_env = rendered["services"]["coder"]["environment"]
    assert coder_env["STITCH_LLM_BASE_URL"] == "http://vllm:8000/v1"
    assert rendered["services"]["vllm"]["command"][0] == coder_env["STITCH_LLM_MODEL"]


def test_our_services_build_from_the_dockerfile_targets() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    targets = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", dockerfile, re.M | re.I))
    assert {"cpu", "cuda"} <= targets
    for name, svc in OURS.items():
        assert svc["build"]["context"] == "."
        assert svc["build"]["target"] in targets, name
        # The image name says which target it is, so `docker compose build` never mixes them up.
        assert svc["image"].startswith(f"stitchcuda-{svc['build']['target']}:"), name
    cuda = {n for n, s in OURS.items() if s["build"]["target"] == "cuda"}
    assert cuda == {"verifier-build", "verifier-gpu"}  # nvcc is only in the CUDA image


def test_third_party_images_are_pinned() -> None:
    for name, svc in SERVICES.items():
        if name in OURS:
            continue
        image = svc["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and re.search(r"\d", tag), f"{name}: {image} is not pinned"


def test_commands_run_existing_entry_points_on_known_queues() -> None:
    consumed: set[str] = set()
    for name, svc in OURS.items():
        command = svc["command"]
        service = service_of_command(command)
        assert (ROOT / "services" / service / "__init__.py").is_file(), f"{name}: no package for {service}"
        if service != "gateway":
            queues = queues_of_command(command)
            assert set(queues) <= set(QUEUES), (name, queues)
            consumed |= set(queues)
    # Every queue has a consumer, except the RL judge (run by the training kit, not the platform).
    assert consumed == set(QUEUES) - {JUDGE}


@pytest.mark.parametrize("service", ["gateway", "planner", "coder", "verifier"])
def test_entry_point_module_exists(service: str) -> None:
    main = ROOT / "services" / service / "__main__.py"
    if not main.exists():
        pytest.skip(f"services/{service}/__main__.py is not written yet")
    assert 'if __name__ == "__main__":' in main.read_text()
    assert importlib.util.find_spec(f"stitchcuda.{service}.__main__") is not None


def test_stitch_env_vars_are_settings_fields() -> None:
    for name, svc in OURS.items():
        service = service_of_command(svc["command"])
        accepted = accepted_env(service)
        for var in svc["environment"]:
            if var.startswith("STITCH_"):
                assert var in accepted, f"{name}: {var} is not read by stitchcuda.{service}'s settings"


def test_platform_env_selects_the_real_adapters() -> None:
    for name, svc in OURS.items():
        env = svc["environment"]
        assert env["STITCH_JOB_STORE"] == "redis", name
        assert env["STITCH_ARTIFACT_STORE"] == "s3", name
        assert env["STITCH_REDIS_URL"].startswith("redis://redis:6379"), name
        assert env["STITCH_S3_ENDPOINT"] == "minio:9000", name


def test_only_the_gateway_is_published_on_all_interfaces() -> None:
    published: dict[str, list[str]] = {n: [str(p) for p in s.get("ports", [])] for n, s in SERVICES.items()}
    assert set(published["gateway"]) == {"8080:8080", "50051:50051"}
    for name, ports in published.items():
        if name == "gateway":
            continue
        for port in ports:
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond localhost"
    for name in WORKER_NAMES | {"redis", "vllm"}:
        assert not published.get(name), f"{name} must stay on the compose network"


def _healthcheck_url(svc: dict[str, Any]) -> str:
    test = " ".join(svc["healthcheck"]["test"])
    m = re.search(r"http://127\.0\.0\.1:(\d+)(/\S*?)['\"]", test)
    assert m, test
    return f":{m.group(1)}{m.group(2)}"


def test_long_running_services_have_healthchecks_on_the_right_ports() -> None:
    for name, svc in SERVICES.items():
        if name == "minio-init":
            assert svc.get("restart") == "no"
            continue
        assert "healthcheck" in svc, name
        assert svc["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
    assert _healthcheck_url(SERVICES["gateway"]) in (":8080/healthz", ":8080/readyz")
    for name in WORKER_NAMES:
        env = SERVICES[name]["environment"]
        assert _healthcheck_url(SERVICES[name]) == f":{env['STITCH_METRICS_PORT']}/metrics", name
    assert _healthcheck_url(SERVICES["vllm"]) == ":8000/health"


def _depends(svc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    deps = svc.get("depends_on", {})
    return {d: {"condition": "service_started"} for d in deps} if isinstance(deps, list) else deps


def test_depends_on_orders_startup_without_cycles() -> None:
    conditions = {"service_started", "service_healthy", "service_completed_successfully"}
    for name, svc in SERVICES.items():
        for dep, spec in _depends(svc).items():
            assert dep in SERVICES, f"{name} depends on unknown {dep}"
            assert spec["condition"] in conditions
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in SERVICES[dep], (
                    f"{name} waits for {dep} to be healthy, which has no healthcheck"
                )
            # A service outside a profile may not hard-depend on one inside it.
            if SERVICES[dep].get("profiles") and not svc.get("profiles"):
                assert spec.get("required") is False, f"{name} requires {dep}, which only runs with a profile"
    # Topological order exists (no cycle).
    order: list[str] = []
    pending = dict.fromkeys(SERVICES)
    while pending:
        ready = [n for n in pending if all(d in order for d in _depends(SERVICES[n]))]
        assert ready, f"dependency cycle among {sorted(pending)}"
        order.extend(ready)
        for n in ready:
            del pending[n]
    for name in OURS:
        deps = _depends(SERVICES[name])
        assert deps["redis"]["condition"] == "service_healthy", name
        assert deps["minio-init"]["condition"] == "service_completed_successfully", name
    assert _depends(SERVICES["minio-init"])["minio"]["condition"] == "service_healthy"


def _gpu_devices(svc: dict[str, Any]) -> list[dict[str, Any]]:
    return svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])


def test_gpu_services_sit_behind_the_gpu_profile() -> None:
    for name, svc in SERVICES.items():
        gpus = _gpu_devices(svc)
        if name in ("vllm", "verifier-gpu"):
            assert svc.get("profiles") == ["gpu"], name
            assert len(gpus) == 1 and gpus[0]["driver"] == "nvidia" and "gpu" in gpus[0]["capabilities"]
            assert len(gpus[0]["device_ids"]) == 1, f"{name}: one GPU per container"
        else:
            assert not gpus and not svc.get("profiles"), f"{name} must run without a GPU"
    gpu_env = SERVICES["verifier-gpu"]["environment"]
    assert gpu_env["CUDA_VISIBLE_DEVICES"] == "0"
    assert gpu_env["STITCH_WORKER_CONCURRENCY"] == "1"  # one CUDA context per GPU
    assert SERVICES["verifier-cpu"]["environment"]["STITCH_WORKER_CONCURRENCY"] == "1"
    assert "--queues" in SERVICES["verifier-gpu"]["command"]


def test_containers_are_locked_down_and_the_verifier_can_sandbox() -> None:
    for name, svc in OURS.items():
        assert svc["cap_drop"] == ["ALL"], name
        assert svc["read_only"] is True, name
        assert "no-new-privileges:true" in svc["security_opt"], name
        assert "privileged" not in svc and "cap_add" not in svc, name
    for name in ("planner", "verifier-build", "verifier-cpu", "verifier-gpu"):
        # They run tenant code under bubblewrap: user namespaces (seccomp, AppArmor), a fresh /proc.
        opts = set(OURS[name]["security_opt"])
        assert {"seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"} <= opts, name
    for name in ("gateway", "coder"):
        assert not any("unconfined" in o for o in OURS[name]["security_opt"]), name


def _seconds(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smh])", duration))


def test_workers_may_finish_their_task_when_stopped() -> None:
    from stitchcuda.shared.celery_app import QueueSettings

    limits = QueueSettings().time_limits()
    for name in WORKER_NAMES:
        svc = SERVICES[name]
        longest = max(limits[q] for q in queues_of_command(svc["command"]))
        assert _seconds(svc["stop_grace_period"]) > longest, f"{name}: stop_grace_period below the task limit"


def test_redis_keeps_jobs_durable() -> None:
    command = SERVICES["redis"]["command"]
    args = dict(zip(command[1::2], command[2::2], strict=False))
    assert args["--appendonly"] == "yes"
    assert args["--maxmemory-policy"] == "noeviction"
    assert any(v.startswith("redis-data:") for v in SERVICES["redis"]["volumes"])


def test_volumes_are_declared_and_bind_mounts_exist() -> None:
    declared = set(COMPOSE.get("volumes", {}))
    used = set()
    for name, svc in SERVICES.items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in declared, f"{name} uses undeclared volume {source}"
                used.add(source)
    assert used == declared, f"unused volumes: {declared - used}"


def test_monitoring_is_wired_to_the_k8s_monitoring_files() -> None:
    prom_mounts = SERVICES["prometheus"]["volumes"]
    assert "./k8s/monitoring/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prom_mounts
    assert "./k8s/monitoring/alerts.yml:/etc/prometheus/alerts.yml:ro" in prom_mounts
    graf = SERVICES["grafana"]["volumes"]
    assert "./k8s/monitoring/grafana/provisioning:/etc/grafana/provisioning:ro" in graf
    assert "./k8s/monitoring/grafana/dashboards:/var/lib/grafana/dashboards:ro" in graf
