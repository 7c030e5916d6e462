"""One way to run untrusted Python (a user's reference program) outside the Verifier: the Planner's
analysis and the Coder's trace both start it through `Isolation`.

The process gets bubblewrap where it works: no network namespace (so no Redis, S3 or LLM endpoint), its
own PID namespace (it sees no other process, so neither their environment nor, through
`/proc/<pid>/root`, their file system, and nothing it starts outlives it), its own IPC and UTS
namespaces, and a file system of only the system folders, the interpreter and its packages (read-only),
the script's folder (read-only) and its own work folder (writable): the host's temporary files, home
folders and the platform's credentials are not there. Also an environment with an allowlist of
variables (no credentials), an address-space limit, no core files, and its own process group so a
time-out kills everything it started. `mode="none"` (or no bubblewrap in "auto") keeps every limit but
the namespaces, and says so in `name`.

The Verifier's sandbox (stitchcuda.verifier.sandbox) is the stricter superset for candidate code: it
also drops to a fresh uid and mounts only the candidate's folders.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from stitchcuda.shared import cutlass

# Variables the untrusted process may see; everything else (credentials, tokens, endpoints) stays out.
PASSED_ENV = (
    "PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME",
    "NVIDIA_VISIBLE_DEVICES", "STITCHCUDA_SIZE", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "TORCH_CUDA_ARCH_LIST", "CC", "CXX",
)  # fmt: skip
# Sets the limits inside the child, then runs the script in the same process (no preexec_fn: it is
# unsafe when the caller is a threaded server).
LAUNCH = (
    "import resource, runpy, sys; m = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); "
    "m and resource.setrlimit(resource.RLIMIT_AS, (m, m)); sys.argv = sys.argv[2:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)
Mode = Literal["auto", "bwrap", "none"]


@functools.cache
def bwrap_works(cuda: bool) -> bool:
    """Whether bubblewrap can start a network-less sandbox of the system folders on this machine."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False
    with tempfile.TemporaryDirectory() as work:
        cmd = [*bwrap_prefix(exe, Path(work), cuda), sys.executable, "-I", "-c", "pass"]
        try:
            return subprocess.run(cmd, capture_output=True, timeout=30, check=False).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False


def bwrap_prefix(exe: str, work: Path, cuda: bool, readable: tuple[Path, ...] = ()) -> list[str]:
    """bubblewrap's arguments: the namespaces, the system and `readable` read-only, `work` writable."""
    binds = [*system_binds(cuda)]
    for folder in readable:
        binds += ["--ro-bind", str(folder), str(folder)]
    return [
        exe, "--die-with-parent", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        "--hostname", "sandbox", *binds, "--bind", str(work), str(work), "--chdir", str(work), "--",
    ]  # fmt: skip


def system_binds(cuda: bool, tools: tuple[str, ...] = ("nvcc", "ninja")) -> list[str]:
    """The system folders, the interpreter with its packages and the CUDA toolchain (the installations of
    `tools`), read-only; a private /dev (with the GPU's device nodes for `cuda`) and a /proc of the
    sandbox's own PID namespace. The Verifier's sandbox binds the same."""
    args: list[str] = []
    for top in ("/bin", "/lib", "/lib64", "/sbin", "/lib32", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for top in ("/usr", "/etc", "/opt"):
        if os.path.isdir(top):
            args += ["--ro-bind", top, top]
    extra = {sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))}
    extra.update(site.getsitepackages())
    torch = importlib.util.find_spec("torch")
    if torch is not None and torch.origin:
        extra.add(os.path.dirname(os.path.dirname(torch.origin)))
    # CUTLASS's headers, which the Verifier's builder offers a candidate's CUDA sources (shared/cutlass.py).
    headers = cutlass.package_dir()
    if headers is not None:
        extra.add(str(headers))
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        extra.add(cuda_home)
    for tool in tools:
        found = shutil.which(tool)
        if found:
            extra.add(os.path.dirname(os.path.dirname(os.path.realpath(found))))
    for path in sorted(extra):
        real = os.path.realpath(path)
        shallow = len(Path(real).parts) < 3  # never bind "/" or a top-level folder wholesale
        if os.path.isdir(real) and not shallow and not real.startswith(("/usr/", "/etc/", "/opt/")):
            args += ["--ro-bind", real, real]
            if real != path:
                args += ["--ro-bind", real, path]
    args += ["--proc", "/proc", "--dev", "/dev"]
    if os.path.isdir("/sys"):
        args += ["--ro-bind", "/sys", "/sys"]
    if cuda:
        for node in sorted(Path("/dev").glob("nvidia*")):
            args += ["--dev-bind", str(node), str(node)]
        for path in ("/dev/dri", "/run/nvidia-persistenced"):
            if os.path.exists(path):
                args += ["--dev-bind" if path.startswith("/dev") else "--ro-bind", path, path]
    return args


@dataclass(frozen=True)
class Isolation:
    mode: Mode = "auto"
    memory_mb: int = 0  # address-space limit on CPU runs; 0 = none (CUDA reserves huge address ranges)

    def uses_bwrap(self, device: str) -> bool:
        cuda = device == "cuda"
        exe = shutil.which("bwrap")
        return self.mode == "bwrap" or (self.mode == "auto" and exe is not None and bwrap_works(cuda))

    def name(self, device: str = "cpu") -> str:
        return "bwrap" if self.uses_bwrap(device) else "none"

    def command(self, script: Path, args: list[str], work: Path, device: str) -> list[str]:
        """`python -I script args...` in `work`, under the limits (and bubblewrap where it works)."""
        memory = self.memory_mb << 20 if device == "cpu" else 0
        # The real file: a linked install's link would point outside the folders the sandbox shows.
        script = script.resolve()
        base = [sys.executable, "-I", "-c", LAUNCH, str(memory), str(script), *args]
        if self.uses_bwrap(device):
            exe = shutil.which("bwrap") or "bwrap"
            return [*bwrap_prefix(exe, work, device == "cuda", (script.parent,)), *base]
        return base

    @staticmethod
    def env(work: Path, **extra: str) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.update(HOME=str(work), TMPDIR=str(work), TORCHINDUCTOR_CACHE_DIR=str(work / "inductor"))
        # getpass.getuser() reads these before the password database, which may not know the uid.
        env.update(USER="stitchcuda", LOGNAME="stitchcuda")
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.update(extra)
        return env


@dataclass
class Finished:
    returncode: int | None
    timed_out: bool
    stderr: str
    seconds: float


def run(
    isolation: Isolation,
    script: Path,
    args: list[str],
    work: Path,
    *,
    device: str = "cpu",
    timeout_s: float,
    stdin: bytes = b"",
    env: dict[str, str] | None = None,
) -> Finished:
    """Runs `script` isolated in `work` until it exits or `timeout_s` passes (then its whole process
    group is killed); stdout is discarded, the last 4000 bytes of stderr are kept."""
    started = time.monotonic()
    stderr_path = work / ".stderr"
    timed_out = False
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(
            isolation.command(script, args, work, device),
            cwd=work,
            env=env if env is not None else isolation.env(work),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            try:
                proc.communicate(stdin, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
        finally:
            kill_group(proc)
    tail = stderr_path.read_bytes()[-4000:].decode(errors="replace")
    return Finished(proc.returncode, timed_out, tail, time.monotonic() - started)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
