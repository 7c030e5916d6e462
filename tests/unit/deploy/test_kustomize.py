"""k8s/: the kustomizations build offline, every manifest validates, and the wiring between them holds."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from stitchcuda.shared.settings import PLACEHOLDER_SECRETS
from stitchcuda.shared.transport import JUDGE, QUEUES

from . import kustomize
from .support import (
    K8S,
    ROOT,
    accepted_env,
    load_yaml,
    load_yaml_docs,
    queues_of_command,
    service_of_command,
)

TARGETS = {"base": K8S / "base", "dev": K8S / "overlays" / "dev", "prod": K8S / "overlays" / "prod"}
BUILDS = {name: kustomize.build(path) for name, path in TARGETS.items()}
NAMESPACES = {"base": "stitchcuda", "dev": "stitchcuda-dev", "prod": "stitchcuda"}
WORKLOADS = ("Deployment", "StatefulSet", "Job")
OUR_DEPLOYMENTS = {"gateway", "planner", "coder", "verifier-build", "verifier-cpu", "verifier-gpu"}
VERIFIERS = {"verifier-build", "verifier-cpu", "verifier-gpu"}
# Pods that run tenant code (references in the Planner, candidates in the Verifier) in bubblewrap.
SANDBOXED = VERIFIERS | {"planner"}
CRD_KINDS = {"ScaledObject", "TriggerAuthentication", "PodMonitor", "ServiceMonitor", "PrometheusRule"}
SECRET_TEMPLATE = load_yaml(K8S / "base" / "secrets.template.yaml")

params = pytest.mark.parametrize("target", list(TARGETS))


def pod_template(r: dict[str, Any]) -> dict[str, Any]:
    return r["spec"]["template"]


def containers(r: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_template(r)["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector:
        return True
    for k, v in selector.get("matchLabels", {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def pods(build: kustomize.Build) -> list[tuple[str, dict[str, Any]]]:
    """(workload name, pod template) of every workload."""
    return [(r["metadata"]["name"], pod_template(r)) for kind in WORKLOADS for r in build.of_kind(kind)]


def secret_keys(build: kustomize.Build) -> set[str]:
    """Keys of stitchcuda-secrets: generated in dev, created out of band (the template) elsewhere."""
    generated = [r for r in build.of_kind("Secret") if r["metadata"]["name"] == "stitchcuda-secrets"]
    if generated:
        return set(generated[0]["data"])
    return set(SECRET_TEMPLATE["stringData"])


# -- the builds -------------------------------------------------------------------------------------


@params
def test_build_holds_the_whole_platform(target: str) -> None:
    b = BUILDS[target]
    assert {r["metadata"]["name"] for r in b.of_kind("Deployment")} == OUR_DEPLOYMENTS
    assert {r["metadata"]["name"] for r in b.of_kind("StatefulSet")} == {"redis", "minio"}
    assert {r["metadata"]["name"] for r in b.of_kind("ScaledObject")} == OUR_DEPLOYMENTS - {"gateway"}
    (ns,) = b.of_kind("Namespace")
    assert ns["metadata"]["name"] == NAMESPACES[target]
    for r in b.resources:
        if r["kind"] != "Namespace":
            assert r["metadata"]["namespace"] == NAMESPACES[target], kustomize.resource_id(r)
    monitoring = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
    assert bool(monitoring & {r["kind"] for r in b.resources}) == (target == "prod")


def _normalize(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    return {kustomize.resource_id(d): d for d in docs}


@params
def test_python_build_matches_kubectl_kustomize(target: str) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the Python build alone is checked")
    proc = subprocess.run(
        [kubectl, "kustomize", str(TARGETS[target])], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    theirs = _normalize([d for d in yaml.safe_load_all(proc.stdout) if d])
    ours = _normalize(BUILDS[target].resources)
    assert set(ours) == set(theirs)
    for rid, doc in ours.items():
        assert doc == theirs[rid], f"{rid} differs between the Python build and kubectl kustomize"


def test_every_manifest_under_k8s_is_built_or_is_a_known_non_kustomize_file() -> None:
    used = set().union(*(b.files for b in BUILDS.values()))
    not_built = {
        K8S / "base" / "secrets.template.yaml",  # a template, never applied
        K8S / "monitoring" / "prometheus.yml",  # docker-compose's Prometheus
        K8S / "monitoring" / "alerts.yml",  # docker-compose's rule file
    }
    for path in sorted(K8S.rglob("*")):
        if not path.is_file():
            continue
        if path.suffix in (".yaml", ".yml"):
            load_yaml_docs(path)  # parses
        if "provisioning" in path.parts:
            continue
        assert path.resolve() in used or path in not_built, (
            f"{path.relative_to(ROOT)} is referenced by nothing"
        )
    assert (K8S / "base" / "secrets.template.yaml").resolve() not in used


def test_builder_fails_loudly(tmp_path: Path) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "v"}}
    (tmp_path / "cm.yaml").write_text(yaml.safe_dump(cm))

    def kust(**spec: Any) -> Path:
        (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(spec))
        return tmp_path

    assert kustomize.build(kust(resources=["cm.yaml"], namespace="n")).find("ConfigMap", "a")["metadata"] == {
        "name": "a",
        "namespace": "n",
    }
    for spec, match in [
        ({"resources": ["missing.yaml"]}, "does not exist"),
        ({"resources": ["cm.yaml"], "commonLabels": {"a": "b"}}, "unsupported fields"),
        (
            {
                "resources": ["cm.yaml"],
                "patches": [{"patch": "kind: ConfigMap\napiVersion: v1\nmetadata: {name: b}"}],
            },
            "matches nothing",
        ),
        ({"resources": ["cm.yaml"], "configMapGenerator": [{"name": "g", "literals": ["x=1"]}]}, "hash"),
        ({"resources": ["cm.yaml"], "patches": [{"path": "../outside.yaml"}]}, "outside"),
        ({"resources": ["cm.yaml", "cm.yaml"]}, "duplicate"),
    ]:
        with pytest.raises(kustomize.KustomizeError, match=match):
            kustomize.build(kust(**spec))


def test_strategic_merge_semantics() -> None:
    base = {
        "spec": {
            "a": 1,
            "b": 2,
            "containers": [{"name": "x", "image": "i", "env": [{"name": "A", "value": "1"}]}],
        }
    }
    patch = {
        "spec": {
            "b": None,
            "containers": [{"name": "x", "env": [{"name": "B", "value": "2"}]}, {"name": "y"}],
        }
    }
    merged = kustomize.strategic_merge(base, patch)
    assert merged["spec"]["a"] == 1 and "b" not in merged["spec"]
    assert merged["spec"]["containers"][0]["image"] == "i"
    assert [e["name"] for e in merged["spec"]["containers"][0]["env"]] == ["A", "B"]
    assert [c["name"] for c in merged["spec"]["containers"]] == ["x", "y"]


# -- schemas ----------------------------------------------------------------------------------------


@params
def test_native_resources_validate_against_the_kubernetes_schema(target: str) -> None:
    pytest.importorskip("kubernetes_validate")
    from .support import k8s_validator

    checked = 0
    for r in BUILDS[target].resources:
        if r["kind"] in CRD_KINDS:
            continue
        errors = sorted(k8s_validator(r["apiVersion"], r["kind"]).iter_errors(r), key=str)
        assert not errors, (
            f"{kustomize.resource_id(r)}: {errors[0].message} at {list(errors[0].absolute_path)}"
        )
        checked += 1
    assert checked >= 30


@params
def test_custom_resources_are_structurally_valid(target: str) -> None:
    b = BUILDS[target]
    api = {
        "ScaledObject": "keda.sh/v1alpha1",
        "TriggerAuthentication": "keda.sh/v1alpha1",
        "PodMonitor": "monitoring.coreos.com/v1",
        "ServiceMonitor": "monitoring.coreos.com/v1",
        "PrometheusRule": "monitoring.coreos.com/v1",
    }
    for r in b.resources:
        if r["kind"] in api:
            assert r["apiVersion"] == api[r["kind"]], kustomize.resource_id(r)
    auths = {r["metadata"]["name"]: r for r in b.of_kind("TriggerAuthentication")}
    for auth in auths.values():
        for ref in auth["spec"]["secretTargetRef"]:
            assert set(ref) == {"parameter", "name", "key"}
            assert ref["name"] == "stitchcuda-secrets" and ref["key"] in secret_keys(b), ref
    for so in b.of_kind("ScaledObject"):
        spec = so["spec"]
        assert set(spec) <= {
            "scaleTargetRef", "minReplicaCount", "maxReplicaCount", "pollingInterval", "cooldownPeriod",
            "idleReplicaCount", "advanced", "triggers", "fallback",
        }  # fmt: skip
        assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        assert spec["pollingInterval"] > 0 and spec["cooldownPeriod"] > 0
        for trigger in spec["triggers"]:
            assert trigger["type"] == "redis"
            assert trigger["authenticationRef"]["name"] in auths
            meta = trigger["metadata"]
            assert set(meta) <= {
                "listName",
                "listLength",
                "activationListLength",
                "databaseIndex",
                "enableTLS",
            }
            # KEDA reads metadata values as strings.
            assert all(isinstance(v, str) for v in meta.values()), meta
            assert int(meta["listLength"]) >= 1 and int(meta["activationListLength"]) >= 0
    for mon in [*b.of_kind("PodMonitor"), *b.of_kind("ServiceMonitor")]:
        endpoints = mon["spec"].get("podMetricsEndpoints") or mon["spec"]["endpoints"]
        assert endpoints and all("port" in e and e["path"] == "/metrics" for e in endpoints)
    for rule in b.of_kind("PrometheusRule"):
        for group in rule["spec"]["groups"]:
            assert group["name"] and all({"alert", "expr"} <= set(r) for r in group["rules"])


# -- wiring -----------------------------------------------------------------------------------------


@params
def test_every_worker_is_scaled_on_its_own_queue(target: str) -> None:
    b = BUILDS[target]
    scaled: set[str] = set()
    for so in b.of_kind("ScaledObject"):
        deployment = b.find("Deployment", so["spec"]["scaleTargetRef"]["name"])
        assert "replicas" not in deployment["spec"], (
            "KEDA owns replicas: a fixed count fights it on every apply"
        )
        (container,) = pod_template(deployment)["spec"]["containers"]
        queues = queues_of_command(container["command"])
        assert [t["metadata"]["listName"] for t in so["spec"]["triggers"]] == queues, so["metadata"]["name"]
        scaled |= set(queues)
    assert scaled == set(QUEUES) - {JUDGE}
    gpu = b.find("ScaledObject", "verifier-gpu")["spec"]
    assert gpu["maxReplicaCount"] >= 1
    (hpa,) = b.of_kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "gateway"
    assert "replicas" not in b.find("Deployment", "gateway")["spec"]


@params
def test_workers_may_finish_their_task_when_stopped(target: str) -> None:
    from stitchcuda.shared.celery_app import QueueSettings

    limits = QueueSettings().time_limits()
    for r in BUILDS[target].of_kind("Deployment"):
        (c,) = pod_template(r)["spec"]["containers"]
        if service_of_command(c["command"]) == "gateway":
            continue
        longest = max(limits[q] for q in queues_of_command(c["command"]))
        assert pod_template(r)["spec"]["terminationGracePeriodSeconds"] > longest, r["metadata"]["name"]


@params
def test_commands_run_existing_entry_points(target: str) -> None:
    for r in BUILDS[target].of_kind("Deployment"):
        (c,) = pod_template(r)["spec"]["containers"]
        service = service_of_command(c["command"])
        assert (ROOT / "services" / service / "__init__.py").is_file(), r["metadata"]["name"]
        assert set(queues_of_command(c["command"])) <= set(QUEUES) | {"gateway"}


@params
def test_env_references_resolve_and_stitch_names_are_settings_fields(target: str) -> None:
    b = BUILDS[target]
    configmaps = {r["metadata"]["name"]: r.get("data", {}) for r in b.of_kind("ConfigMap")}
    keys = secret_keys(b)
    for name, pod in pods(b):
        for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
            names = set()
            for source in c.get("envFrom", []):
                ref = source["configMapRef"]["name"]
                assert ref in configmaps, f"{name}: no ConfigMap {ref}"
                names |= set(configmaps[ref])
            for env in c.get("env", []):
                names.add(env["name"])
                ref = env.get("valueFrom", {})
                if "secretKeyRef" in ref:
                    assert ref["secretKeyRef"]["name"] == "stitchcuda-secrets"
                    assert ref["secretKeyRef"]["key"] in keys, (
                        f"{name}: secret key {ref['secretKeyRef']['key']}"
                    )
                if "configMapKeyRef" in ref:
                    cm = ref["configMapKeyRef"]
                    assert cm["key"] in configmaps[cm["name"]], f"{name}: {cm}"
            if c.get("command", [""])[0] == "python":
                service = service_of_command(c["command"])
                for var in sorted(names):
                    if var.startswith("STITCH_"):
                        assert var in accepted_env(service), (
                            f"{name}: {var} is not read by stitchcuda.{service}"
                        )
        for vol in pod["spec"].get("volumes", []):
            if "configMap" in vol:
                assert vol["configMap"]["name"] in configmaps


@params
def test_pods_are_locked_down(target: str) -> None:
    for name, pod in pods(BUILDS[target]):
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False, name
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] != 0, name
        seccomp = spec["securityContext"]["seccompProfile"]["type"]
        # Only the sandboxing pods relax seccomp, for bubblewrap's namespaces; the rest is RuntimeDefault.
        assert seccomp == ("Unconfined" if name in SANDBOXED else "RuntimeDefault"), name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, name
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], name
            assert "privileged" not in sc, name
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], name
            if name in OUR_DEPLOYMENTS:
                assert "livenessProbe" in c, name
                mounts = {m["mountPath"] for m in c["volumeMounts"]}
                assert {"/tmp", "/var/lib/stitchcuda"} <= mounts, (
                    f"{name}: read-only root needs writable dirs"
                )


@params
def test_verifier_gpu_gets_exactly_one_gpu_on_a_gpu_node(target: str) -> None:
    b = BUILDS[target]
    for r in b.of_kind("Deployment"):
        spec = pod_template(r)["spec"]
        (c,) = spec["containers"]
        gpus = {k: v.get("nvidia.com/gpu") for k, v in c["resources"].items()}
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        if r["metadata"]["name"] != "verifier-gpu":
            assert gpus == {"requests": None, "limits": None}, r["metadata"]["name"]
            continue
        assert gpus == {"requests": 1, "limits": 1}
        assert env["CUDA_VISIBLE_DEVICES"] == "0"
        assert env["STITCH_WORKER_CONCURRENCY"] == "1"
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in spec["volumes"])
        # Guaranteed QoS: exclusive cores, steady timings.
        assert c["resources"]["requests"] == c["resources"]["limits"]
        assert c["image"].split("/")[-1].startswith("stitchcuda-cuda")
    assert (
        b.find("Deployment", "verifier-build")["spec"]["template"]["spec"]["containers"][0]["image"]
        .split("/")[-1]
        .startswith("stitchcuda-cuda")
    )
    if target == "prod":
        assert pod_template(b.find("Deployment", "verifier-gpu"))["spec"]["runtimeClassName"] == "nvidia"


@params
def test_services_monitors_and_budgets_select_real_pods_and_ports(target: str) -> None:
    b = BUILDS[target]
    all_pods = pods(b)
    for svc in b.of_kind("Service"):
        matched = [
            p
            for _, p in all_pods
            if selects({"matchLabels": svc["spec"]["selector"]}, p["metadata"]["labels"])
        ]
        assert matched, f"Service {svc['metadata']['name']} selects no pod"
        port_names = {p["name"] for c in matched[0]["spec"]["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in port_names, (svc["metadata"]["name"], port)
    for sts in b.of_kind("StatefulSet"):
        assert sts["spec"]["serviceName"] in {s["metadata"]["name"] for s in b.of_kind("Service")}
    for pdb in b.of_kind("PodDisruptionBudget"):
        assert any(selects(pdb["spec"]["selector"], p["metadata"]["labels"]) for _, p in all_pods), pdb[
            "metadata"
        ]
        assert ("minAvailable" in pdb["spec"]) != ("maxUnavailable" in pdb["spec"])
    for r in b.of_kind("Deployment"):
        assert selects(r["spec"]["selector"], pod_template(r)["metadata"]["labels"])
    for mon in b.of_kind("PodMonitor"):
        matched = [p for _, p in all_pods if selects(mon["spec"]["selector"], p["metadata"]["labels"])]
        assert {
            p["metadata"]["labels"]["app.kubernetes.io/component"] for p in matched
        } == OUR_DEPLOYMENTS - {"gateway"}
        for p in matched:
            assert "metrics" in {port["name"] for c in p["spec"]["containers"] for port in c.get("ports", [])}
    for mon in b.of_kind("ServiceMonitor"):
        svcs = [s for s in b.of_kind("Service") if selects(mon["spec"]["selector"], s["metadata"]["labels"])]
        assert [s["metadata"]["name"] for s in svcs] == ["gateway"]
        assert mon["spec"]["endpoints"][0]["port"] in {p["name"] for p in svcs[0]["spec"]["ports"]}


@params
def test_scrape_annotations_point_at_the_metrics_port(target: str) -> None:
    for name, pod in pods(BUILDS[target]):
        if name not in OUR_DEPLOYMENTS:
            continue
        ann = pod["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/path"] == "/metrics"
        ports = {p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert int(ann["prometheus.io/port"]) in ports, name
        (c,) = pod["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        if name != "gateway":
            assert ann["prometheus.io/port"] == env["STITCH_METRICS_PORT"] == "9100", name


def test_job_names_agree_between_compose_and_kubernetes() -> None:
    compose = load_yaml(ROOT / "docker-compose.yml")["services"]
    compose_jobs = {f"stitchcuda-{n}" for n, s in compose.items() if "build" in s}
    b = BUILDS["prod"]
    k8s_jobs = set()
    for mon in [*b.of_kind("PodMonitor"), *b.of_kind("ServiceMonitor")]:
        label = mon["spec"]["jobLabel"]
        targets = (
            [
                p["metadata"]["labels"]
                for _, p in pods(b)
                if selects(mon["spec"]["selector"], p["metadata"]["labels"])
            ]
            if mon["kind"] == "PodMonitor"
            else [
                s["metadata"]["labels"]
                for s in b.of_kind("Service")
                if selects(mon["spec"]["selector"], s["metadata"]["labels"])
            ]
        )
        k8s_jobs |= {t[label] for t in targets}
    assert k8s_jobs == compose_jobs


# -- network isolation ------------------------------------------------------------------------------


def _egress_rules(b: kustomize.Build, labels: dict[str, str]) -> list[dict[str, Any]] | None:
    """The egress rules that apply to a pod, or None when no policy restricts its egress."""
    policies = [
        p
        for p in b.of_kind("NetworkPolicy")
        if "Egress" in p["spec"]["policyTypes"] and selects(p["spec"]["podSelector"], labels)
    ]
    if not policies:
        return None
    return [rule for p in policies for rule in p["spec"].get("egress", [])]


@params
def test_pods_running_tenant_code_reach_only_redis_minio_and_dns(target: str) -> None:
    b = BUILDS[target]
    labels_by_name = {n: p["metadata"]["labels"] for n, p in pods(b)}
    redis, minio = labels_by_name["redis"], labels_by_name["minio"]
    dns = {"k8s-app": "kube-dns"}
    for name in SANDBOXED:
        rules = _egress_rules(b, labels_by_name[name])
        assert rules is not None, f"{name}: egress is not restricted"
        reachable = set()
        for rule in rules:
            assert rule.get("to"), f"{name}: a rule without 'to' allows every destination"
            assert rule.get("ports"), f"{name}: a rule without ports allows every port"
            for peer in rule["to"]:
                assert "ipBlock" not in peer, f"{name}: ipBlock egress"
                sel = peer.get("podSelector")
                assert sel is not None, f"{name}: namespace-wide egress {peer}"
                if "namespaceSelector" in peer:
                    assert peer["namespaceSelector"] == {
                        "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                    }
                    assert selects(sel, dns), peer
                    assert {p["port"] for p in rule["ports"]} == {53}
                    reachable.add("dns")
                elif selects(sel, redis):
                    assert [p["port"] for p in rule["ports"]] == [6379]
                    reachable.add("redis")
                elif selects(sel, minio):
                    assert [p["port"] for p in rule["ports"]] == [9000]
                    reachable.add("minio")
                else:
                    raise AssertionError(f"{name} may reach {sel}")
        assert reachable == {"dns", "redis", "minio"}, name
    # And the coder is the one pod that may leave the cluster (its LLM endpoint).
    assert _egress_rules(b, labels_by_name["gateway"]) is not None
    assert any(not r.get("to") for r in _egress_rules(b, labels_by_name["coder"]) or [])


@params
def test_everything_is_denied_by_default_and_stores_accept_only_the_platform(target: str) -> None:
    b = BUILDS[target]
    deny = b.find("NetworkPolicy", "default-deny")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    redis = b.find("NetworkPolicy", "redis")["spec"]["ingress"]
    peers = [peer for rule in redis for peer in rule["from"]]
    assert {"podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "stitchcuda"}}} in peers
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}} in peers


# -- stores and secrets -----------------------------------------------------------------------------


@params
def test_redis_runs_with_aof_and_noeviction(target: str) -> None:
    conf = BUILDS[target].find("ConfigMap", "redis-config")["data"]["redis.conf"]
    settings = dict(
        line.split(None, 1) for line in conf.splitlines() if line.strip() and not line.startswith("#")
    )
    assert settings["appendonly"] == "yes"
    assert settings["maxmemory-policy"] == "noeviction"
    assert settings["dir"] == "/data"
    sts = BUILDS[target].find("StatefulSet", "redis")
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


def test_secret_template_holds_only_placeholders_for_every_referenced_key() -> None:
    assert SECRET_TEMPLATE["kind"] == "Secret" and SECRET_TEMPLATE["metadata"]["name"] == "stitchcuda-secrets"
    for key, value in SECRET_TEMPLATE["stringData"].items():
        if key in ("STITCH_REDIS_URL", "REDIS_ADDRESS"):
            continue  # addresses, not secrets
        assert value in PLACEHOLDER_SECRETS, f"{key}: the template must not carry a real secret"
    dev = BUILDS["dev"].find("Secret", "stitchcuda-secrets")
    assert set(dev["data"]) == set(SECRET_TEMPLATE["stringData"]), "dev Secret and template disagree"
    address = base64.b64decode(dev["data"]["REDIS_ADDRESS"]).decode()
    assert address == f"redis.{NAMESPACES['dev']}.svc.cluster.local:6379"
    assert (
        SECRET_TEMPLATE["stringData"]["REDIS_ADDRESS"] == f"redis.{NAMESPACES['prod']}.svc.cluster.local:6379"
    )
    dev_config = BUILDS["dev"].find("ConfigMap", "stitchcuda-config")["data"]
    # Dev values are placeholders, which only the development environment accepts.
    assert dev_config["STITCH_ENVIRONMENT"] == "development"
    assert BUILDS["prod"].find("ConfigMap", "stitchcuda-config")["data"]["STITCH_ENVIRONMENT"] == "production"
    assert not BUILDS["prod"].of_kind("Secret") and not BUILDS["base"].of_kind("Secret")


@params
def test_images_are_pinned_and_prod_pulls_from_a_registry(target: str) -> None:
    for name, pod in pods(BUILDS[target]):
        for c in pod["spec"]["containers"]:
            repo, tag, digest = kustomize.split_image(c["image"])
            assert digest or (tag and tag != "latest"), f"{name}: {c['image']}"
            if repo.split("/")[-1].startswith("stitchcuda-"):
                expected = {"base": "0.1.0", "dev": "dev", "prod": "0.1.0"}[target]
                assert tag == expected, c["image"]
                assert ("/" in repo) == (target == "prod"), c["image"]
