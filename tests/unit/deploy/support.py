"""Helpers of the deployment checks: repository paths, settings' env names, PromQL names, k8s schemas."""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "k8s"
MONITORING = K8S / "monitoring"
SERVICES = ("gateway", "planner", "coder", "verifier")
WORKERS = ("planner", "coder", "verifier")

# Env names a service will read once its settings module lands; used only while that module is missing
# (the check becomes strict by itself when it exists).
PENDING_ENV = {
    "coder": {"STITCH_LLM_BASE_URL", "STITCH_LLM_MODEL", "STITCH_LLM_API_KEY"},
}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_yaml_docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


# -- settings ---------------------------------------------------------------------------------------


def settings_env_names(cls: type[BaseSettings]) -> set[str]:
    prefix = str(cls.model_config.get("env_prefix", ""))
    names: set[str] = set()
    for name, info in cls.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, str):
            names.add(alias.upper())
        elif isinstance(alias, AliasChoices):
            names |= {c.upper() for c in alias.choices if isinstance(c, str)}
        else:
            names.add(f"{prefix}{name}".upper())
    return names


def _settings_classes(module_name: str) -> list[type[BaseSettings]]:
    module = importlib.import_module(module_name)
    return [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, BaseSettings) and obj is not BaseSettings
    ]


@functools.cache
def accepted_env(service: str) -> frozenset[str]:
    """STITCH_* names `python -m stitchcuda.<service>` reads: common, queue-worker and its own settings."""
    from stitchcuda.shared.settings import CommonSettings

    names = settings_env_names(CommonSettings)
    if service in WORKERS:
        from stitchcuda.shared.celery_app import QueueSettings

        names |= settings_env_names(QueueSettings)
        names.add(f"STITCH_{service.upper()}_QUEUES")
    if (ROOT / "services" / service / "settings.py").is_file():
        for cls in _settings_classes(f"stitchcuda.{service}.settings"):
            names |= settings_env_names(cls)
    else:
        names |= PENDING_ENV.get(service, set())
    return frozenset(names)


def service_of_command(command: list[str]) -> str:
    """['python', '-m', 'stitchcuda.verifier', ...] -> 'verifier'."""
    assert command[:2] == ["python", "-m"], command
    module = command[2]
    assert module.startswith("stitchcuda."), module
    return module.removeprefix("stitchcuda.")


def queues_of_command(command: list[str]) -> list[str]:
    if "--queues" in command:
        return command[command.index("--queues") + 1].split(",")
    return [service_of_command(command)]


# -- PromQL -----------------------------------------------------------------------------------------

PROMQL_FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg", "avg_over_time", "bottomk", "ceil", "changes",
    "clamp", "clamp_max", "clamp_min", "count", "count_over_time", "count_values", "delta", "deriv",
    "exp", "floor", "group", "histogram_quantile", "idelta", "increase", "irate", "label_join",
    "label_replace", "last_over_time", "ln", "max", "max_over_time", "min", "min_over_time",
    "predict_linear", "quantile", "quantile_over_time", "rate", "resets", "round", "scalar", "sort",
    "sort_desc", "sqrt", "stddev", "stdvar", "sum", "sum_over_time", "time", "timestamp", "topk",
    "vector",
}  # fmt: skip
PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
}
_GROUPING = r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)"


class PromQLError(ValueError):
    pass


def _strip(expr: str) -> str:
    s = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    s = re.sub(r"'(?:\\.|[^'\\])*'", "''", s)
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for ch in s:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                raise PromQLError(f"unbalanced {ch!r} in {expr!r}")
    if stack:
        raise PromQLError(f"unclosed {stack[-1]!r} in {expr!r}")
    return s


def promql_selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, label names matched on it) for every selector in the expression."""
    s = _strip(expr)
    s = re.sub(r"\$\{?\w+\}?", "x", s)  # Grafana variables ($__rate_interval, ${datasource})
    out: list[tuple[str, set[str]]] = []
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^{}]*)\}", s):
        labels = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", m.group(2)))
        out.append((m.group(1), labels))
    return out


_STRING = r"\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'"
_SELECTOR = re.compile(rf"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{{((?:{_STRING}|[^{{}}\"'])*)\}}")
_MATCHER = re.compile(rf"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*({_STRING})")


def promql_matchers(expr: str) -> list[tuple[str, str, str, str]]:
    """(metric, label, operator, value) of every label matcher, the value unquoted."""
    out: list[tuple[str, str, str, str]] = []
    for selector in _SELECTOR.finditer(expr):
        for m in _MATCHER.finditer(selector.group(2)):
            value = re.sub(r"\\(.)", r"\1", m.group(3)[1:-1])
            out.append((selector.group(1), m.group(1), m.group(2), value))
    return out


def promql_grouping_labels(expr: str) -> set[str]:
    s = _strip(expr)
    labels: set[str] = set()
    for m in re.finditer(_GROUPING, s):
        labels |= {x.strip() for x in m.group(2).split(",") if x.strip()}
    return labels


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression selects; raises on unbalanced brackets or an unknown function."""
    s = _strip(expr)
    s = re.sub(r"\{[^{}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\[\]]*\]", " ", s)  # ranges and subqueries
    s = re.sub(_GROUPING, r" \1 ", s)  # label lists of grouping modifiers
    s = re.sub(r"\boffset\s+-?\w+", " ", s)
    s = re.sub(r"\$\{?\w+\}?", " ", s)  # Grafana variables
    s = re.sub(r"(?<![\w:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?", " ", s)  # numbers
    names: set[str] = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        token = m.group(0)
        rest = s[m.end() :].lstrip()
        is_call = rest.startswith("(") or re.match(r"(by|without)\b", rest) is not None
        if token in PROMQL_KEYWORDS or token.lower() in ("inf", "nan"):
            continue
        if is_call:
            if token not in PROMQL_FUNCTIONS:
                raise PromQLError(f"unknown PromQL function {token!r} in {expr!r}")
            continue
        names.add(token)
    return names


def grafana_query_metrics(query: str) -> set[str]:
    """Metric names of a Grafana Prometheus variable query such as label_values(metric, label)."""
    m = re.fullmatch(r"\s*label_values\(\s*([^,()]+?)\s*(?:,\s*\w+\s*)?\)\s*", query)
    if m:
        return promql_metric_names(m.group(1))
    m = re.fullmatch(r"\s*query_result\((.*)\)\s*", query, re.S)
    return promql_metric_names(m.group(1) if m else query)


# -- Kubernetes schemas -----------------------------------------------------------------------------

K8S_VERSION = "1.31"


@functools.cache
def _k8s_definitions() -> tuple[Any, str]:
    from kubernetes_validate import utils

    version = [v for v in utils.all_versions() if utils.major_minor(v) <= K8S_VERSION][-1]
    schema_dir = f"v{version}-local-strict"
    defs = utils.schema_contents(f"kubernetes-json-schema/{schema_dir}/_definitions.json", K8S_VERSION)
    return defs, schema_dir


@functools.cache
def k8s_validator(api_version: str, kind: str) -> Any:
    """A strict (unknown fields rejected) JSON-schema validator of one built-in kind, cached."""
    import jsonschema
    from kubernetes_validate import utils
    from referencing import Registry, Resource

    defs, schema_dir = _k8s_definitions()
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = utils.schema_contents(
        f"kubernetes-json-schema/{schema_dir}/{kind.lower()}-{group_version}.json", K8S_VERSION
    )
    registry: Registry[Any] = Resource.from_contents(schema) @ Registry()
    registry = Resource.from_contents(defs) @ registry
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)
