"""A small kustomize in Python: builds the subset of kustomization features k8s/ uses, and refuses the rest.

It resolves resources (files and nested kustomizations), the namespace, images, generators and patches
(strategic-merge and JSON 6902), and fails loudly on a missing file, a patch that matches nothing or a
kustomization field it does not know, so a test built on it can fail where `kubectl kustomize` would.
"""

from __future__ import annotations

import base64
import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Resource = dict[str, Any]

KNOWN_FIELDS = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "images",
    "patches",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PriorityClass",
    "StorageClass",
    "RuntimeClass",
    "ClusterTriggerAuthentication",
}
# List fields merged item by item in a strategic-merge patch (the Kubernetes patchMergeKey).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
}


class KustomizeError(Exception):
    pass


@dataclass
class Build:
    root: Path
    resources: list[Resource]
    files: set[Path] = field(default_factory=set)  # every file the build read

    def find(self, kind: str, name: str) -> Resource:
        found = [r for r in self.resources if r["kind"] == kind and r["metadata"]["name"] == name]
        if len(found) != 1:
            raise KeyError(f"{kind}/{name}: {len(found)} matches")
        return found[0]

    def of_kind(self, kind: str) -> list[Resource]:
        return [r for r in self.resources if r["kind"] == kind]


def resource_id(r: Resource) -> tuple[str, str, str, str]:
    meta = r.get("metadata", {})
    return (r.get("apiVersion", ""), r.get("kind", ""), meta.get("namespace", ""), meta.get("name", ""))


def load_docs(path: Path) -> list[Resource]:
    with path.open() as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d is not None]
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            raise KustomizeError(f"{path}: every document needs apiVersion and kind")
    return docs


def build(directory: Path) -> Build:
    directory = directory.resolve()
    kfile = directory / "kustomization.yaml"
    if not kfile.is_file():
        raise KustomizeError(f"{directory}: no kustomization.yaml")
    spec = yaml.safe_load(kfile.read_text()) or {}
    unknown = set(spec) - KNOWN_FIELDS
    if unknown:
        raise KustomizeError(f"{kfile}: unsupported fields {sorted(unknown)}")
    result = Build(directory, [], {kfile})

    for entry in spec.get("resources", []):
        path = _inside(directory, entry, allow_parent=True)
        if path.is_dir():
            sub = build(path)
            result.resources.extend(sub.resources)
            result.files |= sub.files
        elif path.is_file():
            result.resources.extend(load_docs(path))
            result.files.add(path)
        else:
            raise KustomizeError(f"{kfile}: resource {entry!r} does not exist")

    options = spec.get("generatorOptions", {})
    for kind, key in (("ConfigMap", "configMapGenerator"), ("Secret", "secretGenerator")):
        for gen in spec.get(key, []):
            _generate(result, directory, kind, gen, options)

    for patch in spec.get("patches", []):
        _apply_patch(result, directory, patch)

    if "namespace" in spec:
        _set_namespace(result.resources, spec["namespace"])
    for image in spec.get("images", []):
        _set_image(result.resources, image)

    ids = [resource_id(r) for r in result.resources]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise KustomizeError(f"{kfile}: duplicate resources {sorted(dupes)}")
    return result


def _inside(directory: Path, entry: str, *, allow_parent: bool = False) -> Path:
    if "://" in entry or entry.startswith("github.com/"):
        raise KustomizeError(f"remote resource {entry!r}: the build must work offline")
    path = (directory / entry).resolve()
    # kustomize's load restrictor: files (not other kustomizations) must sit under the kustomization.
    if not allow_parent and directory not in path.parents:
        raise KustomizeError(f"{entry!r} is outside {directory} (kustomize's load restrictor refuses it)")
    return path


def _generate(
    result: Build, directory: Path, kind: str, gen: dict[str, Any], options: dict[str, Any]
) -> None:
    allowed = {"name", "namespace", "behavior", "literals", "files", "envs", "options", "type"}
    if set(gen) - allowed:
        raise KustomizeError(f"generator {gen.get('name')}: unsupported fields {sorted(set(gen) - allowed)}")
    opts = {**options, **gen.get("options", {})}
    if not opts.get("disableNameSuffixHash"):
        raise KustomizeError(f"generator {gen['name']}: name-hash suffixes are not modelled; disable them")
    data: dict[str, str] = {}
    for literal in gen.get("literals", []):
        key, sep, value = literal.partition("=")
        if not sep:
            raise KustomizeError(f"generator {gen['name']}: literal {literal!r} has no '='")
        data[key] = value
    for entry in gen.get("files", []):
        key, sep, rel = entry.partition("=")
        path = _inside(directory, rel if sep else key)
        if not path.is_file():
            raise KustomizeError(f"generator {gen['name']}: file {entry!r} does not exist")
        result.files.add(path)
        data[key if sep else path.name] = path.read_text()
    for rel in gen.get("envs", []):
        path = _inside(directory, rel)
        result.files.add(path)
        for line in path.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                data[key.strip()] = value
    if gen.get("behavior", "create") != "create":
        raise KustomizeError(f"generator {gen['name']}: only behavior 'create' is modelled")
    meta: dict[str, Any] = {"name": gen["name"]}
    if "namespace" in gen:
        meta["namespace"] = gen["namespace"]
    if opts.get("labels"):
        meta["labels"] = dict(opts["labels"])
    if opts.get("annotations"):
        meta["annotations"] = dict(opts["annotations"])
    doc: Resource = {"apiVersion": "v1", "kind": kind, "metadata": meta}
    if kind == "Secret":
        doc["type"] = gen.get("type", "Opaque")
        doc["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    else:
        doc["data"] = data
    result.resources.append(doc)


def _gvk(r: Resource) -> tuple[str, str, str]:
    group, _, version = r["apiVersion"].rpartition("/")
    return group, version, r["kind"]


def _matches(r: Resource, target: dict[str, Any]) -> bool:
    group, version, kind = _gvk(r)
    meta = r.get("metadata", {})
    checks = {"group": group, "version": version, "kind": kind, "name": meta.get("name", "")}
    for key, actual in checks.items():
        if key in target and not re.fullmatch(target[key], actual):
            return False
    if "namespace" in target and meta.get("namespace", "") != target["namespace"]:
        return False
    if "labelSelector" in target:
        labels = meta.get("labels", {})
        for term in target["labelSelector"].split(","):
            k, _, v = term.partition("=")
            if labels.get(k.strip()) != v.strip():
                return False
    unknown = set(target) - {*checks, "namespace", "labelSelector"}
    if unknown:
        raise KustomizeError(f"patch target: unsupported selector fields {sorted(unknown)}")
    return True


def _apply_patch(result: Build, directory: Path, patch: dict[str, Any]) -> None:
    if set(patch) - {"path", "patch", "target", "options"}:
        raise KustomizeError(f"patch: unsupported fields {sorted(set(patch) - {'path', 'patch', 'target'})}")
    if "path" in patch:
        path = _inside(directory, patch["path"])
        if not path.is_file():
            raise KustomizeError(f"patch file {patch['path']!r} does not exist")
        result.files.add(path)
        text = path.read_text()
    else:
        text = patch["patch"]
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    if len(docs) == 1 and isinstance(docs[0], list):
        if "target" not in patch:
            raise KustomizeError("a JSON 6902 patch needs a target")
        targets = [r for r in result.resources if _matches(r, patch["target"])]
        if not targets:
            raise KustomizeError(f"JSON patch target {patch['target']} matches no resource")
        for r in targets:
            for op in docs[0]:
                _json6902(r, op)
        return
    for doc in docs:
        if "target" in patch:
            targets = [r for r in result.resources if _matches(r, patch["target"])]
        else:
            name = doc.get("metadata", {}).get("name")
            targets = [
                r
                for r in result.resources
                if _gvk(r) == _gvk(doc) and r.get("metadata", {}).get("name") == name
            ]
        if not targets:
            raise KustomizeError(
                f"patch for {doc.get('kind')}/{doc.get('metadata', {}).get('name')} matches nothing"
            )
        for r in targets:
            if doc.get("$patch") == "delete":
                result.resources.remove(r)
            else:
                merged = strategic_merge(r, {k: v for k, v in doc.items() if k != "metadata"} | _meta(doc))
                r.clear()
                r.update(merged)


def _meta(doc: Resource) -> dict[str, Any]:
    # name (and namespace) in a patch select the target; labels/annotations in it merge.
    meta = {k: v for k, v in doc.get("metadata", {}).items() if k not in ("name", "namespace")}
    return {"metadata": meta} if meta else {}


def strategic_merge(base: Any, patch: Any, key: str = "") -> Any:
    """Strategic-merge semantics for the shapes used here: maps merge, null deletes, keyed lists merge."""
    if isinstance(base, dict) and isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
        out = copy.deepcopy(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = strategic_merge(out[k], v, k)
            else:
                out[k] = copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        merge_key = MERGE_KEYS[key]
        out_list = copy.deepcopy(base)
        for item in patch:
            match = next((i for i, b in enumerate(out_list) if b.get(merge_key) == item.get(merge_key)), None)
            if match is None:
                out_list.append(copy.deepcopy(item))
            elif item.get("$patch") == "delete":
                out_list.pop(match)
            else:
                out_list[match] = strategic_merge(out_list[match], item)
        return out_list
    return copy.deepcopy(patch)


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise KustomizeError(f"JSON pointer {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json6902(doc: Resource, op: dict[str, Any]) -> None:
    parts = _pointer(op["path"])
    parent: Any = doc
    for part in parts[:-1]:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    last = parts[-1]
    kind = op["op"]
    if kind in ("replace", "remove", "test"):
        exists = (int(last) < len(parent)) if isinstance(parent, list) else last in parent
        if not exists:
            raise KustomizeError(f"JSON patch {kind} {op['path']}: no such field")
    if kind == "remove":
        del parent[int(last) if isinstance(parent, list) else last]
    elif kind in ("add", "replace"):
        if isinstance(parent, list):
            if last == "-":
                parent.append(op["value"])
            elif kind == "add":
                parent.insert(int(last), op["value"])
            else:
                parent[int(last)] = op["value"]
        else:
            parent[last] = op["value"]
    else:
        raise KustomizeError(f"JSON patch op {kind!r} is not modelled")


def _set_namespace(resources: list[Resource], namespace: str) -> None:
    for r in resources:
        if r["kind"] == "Namespace":
            r["metadata"]["name"] = namespace
        elif r["kind"] not in CLUSTER_SCOPED:
            r.setdefault("metadata", {})["namespace"] = namespace


def _containers(node: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("containers", "initContainers") and isinstance(v, list):
                found.extend(c for c in v if isinstance(c, dict))
            else:
                found.extend(_containers(v))
    elif isinstance(node, list):
        for item in node:
            found.extend(_containers(item))
    return found


def split_image(image: str) -> tuple[str, str, str]:
    """'repo/name:tag@sha256:..' -> (name, tag, digest)."""
    name, _, digest = image.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = ""
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    return name, tag, digest


def _set_image(resources: list[Resource], rule: dict[str, Any]) -> None:
    for r in resources:
        for c in _containers(r.get("spec", {})):
            name, tag, digest = split_image(c.get("image", ""))
            if name != rule["name"]:
                continue
            name = rule.get("newName", name)
            if "digest" in rule:
                c["image"] = f"{name}@{rule['digest']}"
            else:
                tag = rule.get("newTag", tag)
                c["image"] = (
                    name
                    + (f":{tag}" if tag else "")
                    + (f"@{digest}" if digest and "newTag" not in rule else "")
                )
