"""Runs a harness script in a fresh, sandboxed subprocess and collects its private-channel frames (D1/D9/D10).

bubblewrap gives an empty network namespace, a private PID namespace, read-only system binds and a
private writable work dir; without it the run falls back (loudly) to a plain subprocess. Either way:
a stripped environment, rlimits (CPU, address space on CPU runs, processes, file size), a separate
uid when the Verifier runs as root, a wall-clock timeout, an RSS watchdog, and the whole process
tree killed at the end. Results come only from the frames on a pipe the parent owns.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import re
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stitchcuda.shared.gpu_slots import device_gpu, held_slot
from stitchcuda.shared.isolation import system_binds
from stitchcuda.verifier.harness import turns, wire
from stitchcuda.verifier.settings import VerifierSettings

log = logging.getLogger("stitchcuda.verifier.sandbox")

HARNESS_DIR = Path(__file__).resolve().parent / "harness"
INSIDE = "/sandbox"

ENV_ALLOW = {
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_MODULE_LOADING",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
}
ENV_DENY = re.compile(
    r"^(STITCH_|AWS_|GITHUB_|HF_|OPENAI|ANTHROPIC|MINIO|S3_|REDIS|CELERY|GOOGLE_|AZURE_)"
    r"|KEY|TOKEN|SECRET|PASSW|CREDENTIAL|COOKIE|SESSION|AUTH",
    re.IGNORECASE,
)


SANDBOX_USER = "stitchcuda"


def clean_env(env: dict[str, str]) -> dict[str, str]:
    """Keeps only allowlisted variables, and drops anything that looks like a secret even then."""
    return {k: v for k, v in env.items() if k in ENV_ALLOW and not ENV_DENY.search(k)}


@dataclass
class Mount:
    host: Path
    writable: bool = False


@dataclass
class RunSpec:
    script: str
    header: dict[str, Any]
    payload: wire.Payload
    mounts: dict[str, Mount]
    device: str
    timeout_s: float
    memory_bytes: int
    label: str
    extra_env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    # A tool that wraps the interpreter (ncu); it runs inside the sandbox too.
    prefix: list[str] = field(default_factory=list)
    log_limit: int = 6000
    # More arguments for the script (the candidate runner's --device, --threads, --idle-timeout).
    args: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    frames: list[tuple[dict[str, Any], wire.Payload]]
    returncode: int | None
    timed_out: bool
    memory_exceeded: bool
    wire_error: str
    log_tail: str
    seconds: float
    sandbox: str
    shared_bytes: int = 0

    def all(self, kind: str) -> list[tuple[dict[str, Any], wire.Payload]]:
        return [(h, p) for h, p in self.frames if h.get("kind") == kind]

    def first(self, kind: str) -> tuple[dict[str, Any], wire.Payload] | None:
        found = self.all(kind)
        return found[0] if found else None

    def completed(self, nonce: str) -> bool:
        done = self.first("done")
        return done is not None and done[0].get("nonce") == nonce and self.returncode == 0

    def crash_reason(self) -> str:
        """One line for a run that ended without a completion record."""
        if self.timed_out:
            return (
                f"timed out after {self.seconds:.0f} s (hang or infinite loop); the process tree was killed"
            )
        if self.memory_exceeded:
            return "exceeded the memory limit; the process tree was killed"
        code = self.returncode
        if self.sandbox == "bwrap" and code is not None and 128 < code < 160:
            code = 128 - code  # bwrap's init reports a child killed by signal N as 128 + N
        if code is not None and code < 0:
            # A process killed while it wrote leaves a cut frame: the signal is the cause, not the channel.
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            hint = {
                "SIGSEGV": " (segmentation fault)",
                "SIGKILL": " (killed: out of memory?)",
                "SIGXCPU": " (CPU limit)",
            }
            cut = f"; its last record was cut short ({self.wire_error})" if self.wire_error else ""
            return f"crashed with {name}{hint.get(name, '')}{cut}"
        if self.wire_error:
            return f"corrupted the result channel ({self.wire_error})"
        if code == 0:
            return "exited without a completion record"
        last = _last_error_line(self.log_tail)
        return f"exited with code {code}" + (f": {last}" if last else "")


@dataclass
class Launch:
    """A started sandboxed process, waiting for its job on the pipe the parent holds."""

    spec: RunSpec
    proc: subprocess.Popen[bytes]
    token: str
    job_fd: int
    log_path: Path
    uid: int
    frames: list[tuple[dict[str, Any], wire.Payload]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None
    shared_bytes: int = 0  # bytes that came as sealed memory files, not through the pipe
    # Applied by the reader to each frame as it arrives (a large output reduced to its summary), so
    # the parent never holds every frame whole.
    transform: Callable[[dict[str, Any], wire.Payload], tuple[dict[str, Any], wire.Payload]] | None = None

    def ready(self, timeout: float) -> bool:
        """Waits until the process says it is prepared (a `ready` frame); False if it died or is late."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(h.get("kind") == "ready" for h, _ in self.frames):
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.02)
        return False

    def alive(self) -> bool:
        return self.proc.poll() is None


def _last_error_line(text: str) -> str:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if re.match(r"^[A-Za-z_.]*(Error|Exception|Killed|error)\b", line) or "Error:" in line:
            return line[:300]
    return ""


_BWRAP_OK: dict[str, bool] = {}


def bwrap_usable() -> bool:
    """bwrap exists and can create its namespaces here (containers sometimes forbid it)."""
    exe = shutil.which("bwrap")
    if not exe:
        return False
    if exe not in _BWRAP_OK:
        cmd = [
            exe,
            "--unshare-net",
            "--unshare-pid",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
        ]
        try:
            res = subprocess.run([*cmd, "true"], capture_output=True, timeout=20, check=False)
            _BWRAP_OK[exe] = res.returncode == 0
            if res.returncode != 0:
                log.warning(
                    "bwrap is installed but cannot run here: %s", res.stderr.decode(errors="replace")[:300]
                )
        except (OSError, subprocess.TimeoutExpired):
            _BWRAP_OK[exe] = False
    return _BWRAP_OK[exe]


def _world_traversable(path: Path) -> bool:
    try:
        for part in [path, *path.parents]:
            if not part.stat().st_mode & 0o001:
                return False
    except OSError:
        return False
    return True


class Sandbox:
    """Launches harness scripts; one instance per Verifier, safe to use from several threads."""

    def __init__(self, settings: VerifierSettings) -> None:
        self.settings = settings
        mode = settings.sandbox
        self.warning = ""
        if mode == "auto":
            mode = "bwrap" if bwrap_usable() else "none"
            if mode == "none":
                self.warning = (
                    "bubblewrap (bwrap) is unavailable: candidates run without a network namespace or "
                    "filesystem isolation (install the Debian package 'bubblewrap')"
                )
        elif mode == "bwrap" and not bwrap_usable():
            raise RuntimeError("STITCH_SANDBOX=bwrap but bwrap is missing or cannot create namespaces here")
        if mode == "none" and not self.warning:
            self.warning = (
                "sandbox disabled by settings (STITCH_SANDBOX=none): no network or filesystem isolation"
            )
        if self.warning:
            log.warning("%s", self.warning)
        self.mode = mode
        self.root = os.geteuid() == 0
        # Every uid this sandbox ran a process as, so a caller can prove none of them outlived it.
        self.uids_used: set[int] = set()
        python_home_open = _world_traversable(Path(sys.base_prefix)) and _world_traversable(Path(sys.prefix))
        # Without bwrap, a separate uid only works if it can still read the interpreter.
        self.drop_uid = self.root and (mode == "bwrap" or python_home_open)
        if mode == "none" and self.root and not self.drop_uid:
            self.warning += (
                "; the interpreter is not world-readable, so runs keep root and no process limit applies"
            )

    @property
    def name(self) -> str:
        return self.mode

    def inside(self, name: str, mounts: dict[str, Mount]) -> str:
        if self.mode == "bwrap":
            return f"{INSIDE}/{name}"
        return str(mounts[name].host)

    def paths(self, mounts: dict[str, Mount]) -> dict[str, str]:
        return {name: self.inside(name, mounts) for name in mounts}

    # --- launching -------------------------------------------------------------------------------

    def _system_binds(self, device: str) -> list[str]:
        return system_binds(device == "cuda", tools=("nvcc", "ncu", "ninja"))

    def _turn_files(self, spec: RunSpec) -> tuple[int, int] | None:
        """The node's turn files of this run's GPU, opened for it alone (None: no turns to take)."""
        gpu = device_gpu(spec.device) if self.settings.gpu_turns else None
        if gpu is None:
            return None
        try:
            return turns.open_files(self.settings.gpu_slot_dir, gpu)
        except OSError as exc:  # the run is as correct without; only another process's kernels could overlap
            log.warning(
                "no turn files in %s (%s): this run times without waiting for other work on GPU %s",
                self.settings.gpu_slot_dir,
                exc,
                gpu,
            )
            return None

    @staticmethod
    def _lent_slot(spec: RunSpec, turn_fds: tuple[int, int] | None) -> int | None:
        """The GPU slot the surrounding verification holds, lent to a reference run so it can give it back
        while torch.compile compiles (host work). Only where turns are taken: a run that gives the slot
        back still times with the device alone. The caller keeps its descriptor open (the slot is its)."""
        if spec.label != "reference" or turn_fds is None:
            return None
        return held_slot()

    def _command(
        self,
        spec: RunSpec,
        job_fd: int,
        result_fd: int,
        share_fd: int,
        uid: int,
        turn_fds: tuple[int, int] | None = None,
        slot_fd: int | None = None,
    ) -> tuple[list[str], str]:
        harness = (
            self.inside("harness", {"harness": Mount(HARNESS_DIR)})
            if self.mode == "bwrap"
            else str(HARNESS_DIR)
        )
        runner = [*spec.prefix, sys.executable, "-I", f"{harness}/{spec.script}", "--job-fd", str(job_fd)]
        share_min = int(self.settings.shared_memory_min_mb * (1 << 20))
        runner += ["--result-fd", str(result_fd), "--share-fd", str(share_fd), "--share-min", str(share_min)]
        runner += ["--uid", str(uid), "--gid", str(uid), *spec.args]
        if turn_fds:
            runner += ["--turns", f"{turn_fds[0]},{turn_fds[1]}"]
        if slot_fd is not None:
            runner += ["--slot", str(slot_fd)]
        work = self.inside("work", spec.mounts)
        if self.mode != "bwrap":
            return runner, work
        # The parent's bwrap, by absolute path: Popen looks names up in the child's (stripped) PATH.
        args = [
            shutil.which("bwrap") or "bwrap",
            "--die-with-parent",
            "--unshare-net",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
        ]
        args += ["--unshare-cgroup-try", "--hostname", "sandbox"]
        # The private /tmp first: an interpreter or venv that lives under /tmp (a CI checkout, say) is
        # bound over it afterwards, on mount points made here with modes the sandbox uid can traverse.
        private_tmp = spec.mounts["work"].host / "tmp"
        args += ["--bind", str(private_tmp), "/tmp"]
        system = self._system_binds(spec.device)
        _mount_points_under_tmp(system, private_tmp)
        args += system
        args += ["--ro-bind", str(HARNESS_DIR), f"{INSIDE}/harness"]
        for name, mount in spec.mounts.items():
            args += ["--bind" if mount.writable else "--ro-bind", str(mount.host), f"{INSIDE}/{name}"]
        args += ["--chdir", work]
        return _with_parent_dirs(args) + runner, "/"

    def _env(self, spec: RunSpec, token: str) -> dict[str, str]:
        work = self.inside("work", spec.mounts)
        env = clean_env(dict(os.environ))
        bins = [os.path.join(sys.prefix, "bin"), "/usr/local/cuda/bin", "/usr/local/bin", "/usr/bin", "/bin"]
        # The toolchain where the parent finds it (nvcc and ninja may live in a venv or under /opt).
        for tool in ("nvcc", "ninja", "ncu"):
            found = shutil.which(tool)
            if found and os.path.dirname(found) not in bins:
                bins.append(os.path.dirname(found))
        env.update(
            {
                "PATH": ":".join(bins),
                "HOME": work,
                # getpass.getuser() (inductor, triton) falls back to the password database, which has
                # no entry for the uid a container or a sandbox often runs as: torch.compile then fails.
                "USER": SANDBOX_USER,
                "LOGNAME": SANDBOX_USER,
                "TMPDIR": f"{work}/tmp" if self.mode != "bwrap" else "/tmp",
                "PYTHONDONTWRITEBYTECODE": "1",
                # The reference compiles the torch.compile baseline: inductor's parallel compile cuts
                # that from minutes to seconds; candidates never compile and keep one thread.
                # The GPU's slots may all compile at once: they share the cores.
                "TORCHINDUCTOR_COMPILE_THREADS": str(
                    min(8, max(1, (os.cpu_count() or 1) // self.settings.gpu_slots_per_gpu))
                )
                if spec.label == "reference"
                else "1",
                "TORCHINDUCTOR_CACHE_DIR": f"{work}/tmp/inductor",
                # Triton's compile and autotune caches live in this run's private work dir: one candidate
                # can never read (or plant) another's compiled kernels or tuning results.
                "TRITON_CACHE_DIR": f"{work}/tmp/triton",
                "TRITON_HOME": f"{work}/tmp",
                "CUDA_CACHE_PATH": f"{work}/tmp/nv",
                "SC_SANDBOX_RUN": token,
            }
        )
        nvcc = shutil.which("nvcc")
        if nvcc and "CUDA_HOME" not in env:
            env["CUDA_HOME"] = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        if spec.device == "cpu" and spec.label == "candidate":
            # A Triton candidate on a CPU runs its kernels in Triton's interpreter (no GPU to compile for).
            env["TRITON_INTERPRET"] = "1"
        env.update(spec.extra_env)
        return env

    def run(self, spec: RunSpec) -> Outcome:
        """Starts the script, sends it its job, waits for it (or kills it), returns what it sent."""
        return self.finish(self.launch(spec), spec.header, spec.payload)

    def launch(self, spec: RunSpec) -> Launch:
        """Starts the script; it may prepare (import torch, initialise the device) before its job comes."""
        work = spec.mounts["work"].host
        (work / "tmp").mkdir(parents=True, exist_ok=True)
        uid = -1
        if self.drop_uid:
            uid = self.settings.sandbox_uid_base + secrets.randbelow(60_000)
            self.uids_used.add(uid)
            for path in [work, *work.rglob("*")]:
                with contextlib.suppress(OSError):
                    os.chown(path, uid, uid)
        os.chmod(work, 0o700)
        token = secrets.token_hex(8)
        job_r, job_w = os.pipe()
        res_r, res_w = os.pipe()
        # Large tensors come back as sealed memfds over this socket (harness/wire.py), not the pipe.
        share_r, share_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        share_r.settimeout(wire.SHARE_WAIT_S)
        turn_fds = self._turn_files(spec)
        slot_fd = self._lent_slot(spec, turn_fds)
        cmd, cwd = self._command(spec, job_r, res_w, share_w.fileno(), uid, turn_fds, slot_fd)
        env = self._env(spec, token)
        limits = self._limits(spec, uid)
        log_path = spec.log_path or (work.parent / f"{spec.label}.log")
        with open(log_path, "wb") as log_file:
            try:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    pass_fds=(job_r, res_w, share_w.fileno(), *(turn_fds or ()), *_given(slot_fd)),
                    start_new_session=True,
                    preexec_fn=limits,  # noqa: PLW1509 - rlimits must be set between fork and exec
                    env=env,
                    cwd=cwd,
                    close_fds=True,
                )
            except BaseException:
                share_r.close()
                raise
            finally:
                os.close(job_r)
                os.close(res_w)
                share_w.close()
                # The runner holds the only descriptions of its turn files: its turn ends when it does.
                for fd in turn_fds or ():
                    os.close(fd)
        launch = Launch(spec=spec, proc=proc, token=token, job_fd=job_w, log_path=log_path, uid=uid)
        # The channel carries at most what the run may hold (a large problem's inputs and ground truth).
        max_payload = max(int(self.settings.max_payload_gb * (1 << 30)), spec.memory_bytes)
        launch.reader = threading.Thread(
            target=_read, args=(res_r, share_r, launch, max_payload), daemon=True
        )
        launch.reader.start()
        return launch

    def finish(
        self,
        launch: Launch,
        header: dict[str, Any],
        payload: wire.Payload,
        timeout_s: float | None = None,
        transform: Callable[[dict[str, Any], wire.Payload], tuple[dict[str, Any], wire.Payload]]
        | None = None,
    ) -> Outcome:
        """Sends the job; the wall-clock limit counts from here, not from the launch."""
        spec = launch.spec
        launch.transform = transform
        started = time.monotonic()
        writer = threading.Thread(target=_write, args=(launch.job_fd, header, payload), daemon=True)
        writer.start()
        limit = timeout_s if timeout_s is not None else spec.timeout_s
        timed_out, memory_exceeded = self._watch(launch.proc, spec, started, limit)
        _kill_tree(launch.proc, launch.token)
        reader = launch.reader
        if reader is not None:
            reader.join(timeout=10)
            if reader.is_alive():
                _kill_tree(launch.proc, launch.token)
                reader.join(timeout=5)
        writer.join(timeout=1)
        return Outcome(
            frames=[f for f in launch.frames if f[0].get("kind") != "ready"],
            returncode=launch.proc.returncode,
            timed_out=timed_out,
            memory_exceeded=memory_exceeded,
            wire_error=launch.errors[0] if launch.errors else "",
            log_tail=_tail(launch.log_path, spec.log_limit),
            seconds=time.monotonic() - started,
            sandbox=self.mode,
            shared_bytes=launch.shared_bytes,
        )

    def discard(self, launch: Launch) -> None:
        """Kills a launched process that will never get its job."""
        with contextlib.suppress(OSError):
            os.close(launch.job_fd)
        _kill_tree(launch.proc, launch.token)
        if launch.reader is not None:
            launch.reader.join(timeout=5)

    def _limits(self, spec: RunSpec, uid: int) -> Any:
        nproc = self.settings.nproc_limit
        if not self.root:
            nproc += _task_count(os.getuid())
        fsize = self.settings.file_size_limit_mb << 20
        cpu = int(spec.timeout_s * max(1, os.cpu_count() or 1)) + 30
        address_space = spec.memory_bytes if spec.device == "cpu" else 0

        def apply() -> None:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 10))
            if uid >= 0 or not self.root:
                resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
            if address_space:
                resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

        return apply

    def _watch(
        self, proc: subprocess.Popen[bytes], spec: RunSpec, started: float, limit: float
    ) -> tuple[bool, bool]:
        rss_limit = spec.memory_bytes
        next_rss = 0.0
        while True:
            try:
                proc.wait(timeout=0.05)
                return False, False
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now - started > limit:
                return True, False
            if rss_limit and now >= next_rss:
                next_rss = now + 0.25
                if _tree_rss(proc.pid) > rss_limit:
                    return False, True


_BIND_OPTS = {
    "--bind",
    "--ro-bind",
    "--dev-bind",
    "--symlink",
    "--bind-try",
    "--ro-bind-try",
    "--dev-bind-try",
}


def _given(fd: int | None) -> tuple[int, ...]:
    return () if fd is None else (fd,)


def _bind_destinations(args: list[str]) -> list[Path]:
    """The destination of every bind option (`--bind SRC DEST` and its variants) in a bwrap argument list."""
    found: list[Path] = []
    i = 0
    while i < len(args):
        if args[i] in _BIND_OPTS and i + 2 < len(args):
            found.append(Path(args[i + 2]))
            i += 3
        else:
            i += 1
    return found


def _mount_points_under_tmp(args: list[str], private_tmp: Path) -> None:
    """Creates, in the private /tmp, the mount points (0755, with their parents) of binds under /tmp."""
    for dest in _bind_destinations(args):
        if dest.is_relative_to("/tmp") and dest != Path("/tmp"):
            target = private_tmp / dest.relative_to("/tmp")
            target.mkdir(parents=True, exist_ok=True)
            for path in [target, *target.parents]:
                if path == private_tmp or not path.is_relative_to(private_tmp):
                    break
                path.chmod(0o755)


def _with_parent_dirs(args: list[str]) -> list[str]:
    """Prepends world-traversable `--dir`s for every bind's parents (bwrap would create them 0700)."""
    parents: list[str] = []
    for dest in _bind_destinations(args):
        for parent in reversed(dest.parents):
            text = str(parent)
            if text != "/" and text not in parents:
                parents.append(text)
    prefix = args[:1]
    for path in parents:
        prefix += ["--perms", "0755", "--dir", path]
    return prefix + args[1:]


def _read(fd: int, share: socket.socket, launch: Launch, max_payload: int) -> None:
    errors = launch.errors
    # The transform (a large output reduced to its summary, seconds for a GiB output) runs on its own
    # thread while the next frame is read: the runner is not held on a full pipe meanwhile. A frame is
    # read only while fewer than two are held, so the parent holds at most two outputs, as
    # limits.ProblemSize.parent_bytes counts.
    handoff: queue.Queue[tuple[dict[str, Any], wire.Payload] | None] = queue.Queue()
    held = threading.Semaphore(2)  # frames read and not yet transformed
    transformer = threading.Thread(target=_transform, args=(handoff, held, launch), daemon=True)
    transformer.start()
    with os.fdopen(fd, "rb", buffering=1 << 20) as src, share:
        try:
            frames = wire.read_frames(src, max_payload, share)
            for count in itertools.count(1):
                held.acquire()
                frame = next(frames, None)
                if frame is None:
                    break
                if count > 10_000:
                    errors.append("too many frames")
                    break
                launch.shared_bytes += wire.shared_bytes(frame[1])
                handoff.put(frame)
                del frame
        except wire.WireError as exc:
            errors.append(str(exc))
        except (OSError, ValueError) as exc:
            errors.append(f"read failed: {exc}")
        finally:
            handoff.put(None)
            transformer.join()


def _transform(
    handoff: queue.Queue[tuple[dict[str, Any], wire.Payload] | None],
    held: threading.Semaphore,
    launch: Launch,
) -> None:
    """Appends the reader's frames to the launch in order, each through the launch's transform."""
    while (frame := handoff.get()) is not None:
        try:
            if launch.transform is not None:
                frame = launch.transform(*frame)
            launch.frames.append(frame)
        except Exception as exc:  # the reader must go on draining the pipe whatever happens here
            launch.errors.append(f"could not reduce a {frame[0].get('kind')} frame: {exc}")
        finally:
            del frame
            held.release()


def _write(fd: int, header: dict[str, Any], payload: wire.Payload) -> None:
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as dst:
            wire.write_frame(dst, header, payload)
    except (BrokenPipeError, OSError):
        pass  # the child died before reading its job; the outcome says why


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                found += [int(c) for c in fh.read().split()]
    except (OSError, ValueError):
        pass
    return found


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo and len(out) < 5000:
        current = todo.pop()
        out.append(current)
        todo += _children(current)
    return out


def _tree_rss(pid: int) -> int:
    total = 0
    for p in _descendants(pid):
        try:
            with open(f"/proc/{p}/statm") as fh:
                total += int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            pass
    return total


def _task_count(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                pass
    return count


def _kill_tree(proc: subprocess.Popen[bytes], token: str) -> None:
    """Kills the process group, every descendant, and anything still carrying this run's token."""
    victims = _descendants(proc.pid)
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in victims:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    marker = f"SC_SANDBOX_RUN={token}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if marker in fh.read().split(b"\0"):
                        os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _tail(path: Path, limit: int = 6000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""
