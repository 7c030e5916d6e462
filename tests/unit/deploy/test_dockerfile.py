"""Dockerfile and .dockerignore, linted for the properties that matter (hadolint is not available here)."""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .support import ROOT


@dataclass
class Stage:
    name: str
    image: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.instructions if o == op]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages); continuation lines joined, comments dropped."""
    logical: list[str] = []
    buf = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        logical.append(buf + stripped)
        buf = ""
    assert not buf, "dangling line continuation"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            m = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest.strip(), re.I)
            assert m, f"every stage is named: {line}"
            image = re.sub(r"\$\{?(\w+)\}?", lambda v: args.get(v.group(1), v.group(0)), m.group(1))
            stages.append(Stage(m.group(2), image))
        elif not stages:
            assert op == "ARG", f"only ARG may precede the first FROM: {line}"
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
        else:
            stages[-1].instructions.append((op, rest.strip()))
    return args, stages


ARGS, STAGES = parse_dockerfile((ROOT / "Dockerfile").read_text())
BY_NAME = {s.name: s for s in STAGES}


def test_two_named_targets_from_pinned_bases() -> None:
    assert set(BY_NAME) == {"cpu", "cuda"}
    for stage in STAGES:
        repo, _, tag = stage.image.rpartition(":")
        assert repo and tag != "latest" and re.search(r"\d+\.\d+", tag), (
            f"{stage.name}: {stage.image} not pinned"
        )
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-\w+", BY_NAME["cpu"].image)
    # nvcc is in the devel flavour only; verifier.build compiles CUDA without a GPU.
    assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-devel-ubuntu\d+\.\d+", BY_NAME["cuda"].image)


@pytest.mark.parametrize("stage", ["cpu", "cuda"])
def test_stage_runs_as_a_non_root_user(stage: str) -> None:
    s = BY_NAME[stage]
    users = s.all("USER")
    assert users, "no USER: the container would run as root"
    uid = users[-1].split(":")[0]
    assert uid not in ("root", "0")
    # The user exists and the writable state dir belongs to it.
    runs = " ".join(s.all("RUN"))
    assert re.search(rf"useradd .*--uid {uid}\b", runs)
    assert "install -d -o stitch" in runs
    # Nothing after USER switches back to root.
    after = s.instructions[[i for i, (o, _) in enumerate(s.instructions) if o == "USER"][-1] :]
    assert not any(o == "RUN" and "sudo" in a for o, a in after)


@pytest.mark.parametrize("stage", ["cpu", "cuda"])
def test_stage_has_the_sandbox_and_the_toolchain(stage: str) -> None:
    runs = " ".join(BY_NAME[stage].all("RUN"))
    for package in ("bubblewrap", "tini", "g++", "ninja-build"):
        assert re.search(rf"apt-get install[^&]*(?<![\w+-]){re.escape(package)}(?![\w+-])", runs), (
            stage,
            package,
        )
    assert "--no-install-recommends" in runs
    assert "rm -rf /var/lib/apt/lists/*" in runs
    assert re.search(r'pip install "torch==\$\{TORCH_VERSION\}" --index-url', runs)
    assert 'pip install ".[platform]"' in runs and "pip install --no-deps ." in runs


@pytest.mark.parametrize("stage", ["cpu", "cuda"])
def test_stage_has_healthcheck_and_an_init_entrypoint(stage: str) -> None:
    s = BY_NAME[stage]
    (health,) = s.all("HEALTHCHECK")
    m = re.search(r"CMD\s+(\[.*\])$", health)
    assert m, health
    cmd = json.loads(m.group(1))
    assert cmd[:2] == ["python", "-c"] and "HEALTHCHECK_URL" in cmd[2]
    assert any("HEALTHCHECK_URL=" in env for env in s.all("ENV"))
    (entry,) = s.all("ENTRYPOINT")
    assert json.loads(entry) == ["tini", "--"]
    (cmd_line,) = s.all("CMD")
    default = json.loads(cmd_line)
    assert default[:2] == ["python", "-m"] and default[2].startswith("stitchcuda.")
    assert (ROOT / "services" / default[2].removeprefix("stitchcuda.")).is_dir()


def test_no_remote_add_and_no_secrets_in_build_args() -> None:
    for stage in STAGES:
        for op, arg in stage.instructions:
            assert not (op == "ADD" and "://" in arg), "ADD of a URL: use RUN with a checksum"
            if op in ("ARG", "ENV"):
                assert not re.search(r"(PASSWORD|SECRET|TOKEN|ACCESS_KEY)\s*=", arg, re.I), arg


def test_cpu_exposes_the_gateway_ports() -> None:
    ports = " ".join(BY_NAME["cpu"].all("EXPOSE")).split()
    assert {"8080", "50051", "9100"} <= set(ports)


# -- .dockerignore ---------------------------------------------------------------------------------


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def glob_regex(pattern: str) -> str:
    """Go's filepath.Match syntax plus '**' (any number of folders), as Docker reads .dockerignore."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1].replace("[!", "[^"), end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return out


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern also matches everything below it."""
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").strip("/")
        if re.fullmatch(glob_regex(pat) + r"(?:/.*)?", path):
            result = not negate
    return result


@functools.cache
def context_files() -> tuple[str, ...]:
    """The files `docker build .` sends, pruning ignored folders as the walk goes (fast on a big .venv)."""
    patterns = dockerignore_patterns()
    out = []
    for folder, dirs, files in os.walk(ROOT):
        rel_dir = Path(folder).relative_to(ROOT).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        dirs[:] = [d for d in dirs if not ignored(prefix + d, patterns)]
        out.extend(prefix + f for f in files if not ignored(prefix + f, patterns))
    return tuple(out)


def test_dockerignore_matcher_follows_docker_rules() -> None:
    pats = ["tests", "**/__pycache__", "*.egg-info", ".env.*", "!keep.md"]
    assert ignored("tests/unit/x.py", pats)
    assert ignored("shared/__pycache__/a.pyc", pats)
    assert ignored("__pycache__/a.pyc", pats)
    assert ignored("stitchcuda.egg-info/PKG-INFO", pats)
    assert ignored(".env.prod", pats)
    assert not ignored("shared/metrics.py", pats)
    assert ignored("notes.md", ["*.md", "!keep.md"]) and not ignored("keep.md", ["*.md", "!keep.md"])


def test_build_context_has_the_sources_and_leaves_state_and_secrets_out() -> None:
    patterns = dockerignore_patterns()
    for needed in (
        "pyproject.toml",
        "setup.py",
        "shared/settings.py",
        "shared/metrics.py",
        "services/__init__.py",
    ):
        assert not ignored(needed, patterns), needed
    for root_dir in ("services", "shared", "proto/stitchcuda/api", "training"):
        assert any(f.startswith(root_dir + "/") for f in context_files()), f"{root_dir} missing from context"
    for unwanted in (
        ".git/HEAD",
        ".venv/bin/python",
        "tests/unit/x.py",
        ".env",
        ".env.local",
        "k8s/base/x.yaml",
    ):
        assert ignored(unwanted, patterns), unwanted
    assert all("__pycache__" not in f and not f.endswith((".pyc", ".so")) for f in context_files())


def test_generated_protobuf_code_is_in_the_context() -> None:
    # The images import stitchcuda.api.v1.*_pb2 without running protoc.
    files = set(context_files())
    protos = sorted(Path(ROOT / "proto/stitchcuda/api/v1").glob("*.proto"))
    assert protos
    for proto in protos:
        assert f"proto/stitchcuda/api/v1/{proto.stem}_pb2.py" in files, proto.name


def test_gpu_stage_offers_cutlass_headers_to_candidate_builds() -> None:
    # The GPU Verifier builds programs that instantiate CUTLASS templates (variant gemm_kernel=cutlass):
    # its image holds the headers and checks them at build time.
    runs = " ".join(BY_NAME["cuda"].all("RUN"))
    assert re.search(r'pip install --no-deps "nvidia-cutlass==[\d.]+"', runs)
    assert "cutlass.include_dir()" in runs
    assert "cutlass.util_include_dir()" in runs, "the Hopper convolution includes cutlass/util/"
