"""Sandbox pieces that need no subprocess: environment stripping, crash reasons, bwrap dir setup."""

from __future__ import annotations

import signal

from stitchcuda.verifier.harness import wire
from stitchcuda.verifier.sandbox import (
    Launch,
    Outcome,
    _mount_points_under_tmp,
    _read,
    _with_parent_dirs,
    clean_env,
)


def test_secrets_are_stripped_from_the_environment():
    env = clean_env(
        {
            "STITCH_SECRET_KEY": "x",
            "AWS_ACCESS_KEY_ID": "x",
            "OPENAI_API_KEY": "x",
            "GITHUB_TOKEN": "x",
            "HOME": "/root",
            "LD_LIBRARY_PATH": "/usr/lib",
            "CUDA_VISIBLE_DEVICES": "0",
            "MY_PASSWORD": "x",
        }
    )
    assert env == {"LD_LIBRARY_PATH": "/usr/lib", "CUDA_VISIBLE_DEVICES": "0"}


def _outcome(**kw):
    base = {
        "frames": [],
        "returncode": 0,
        "timed_out": False,
        "memory_exceeded": False,
        "wire_error": "",
        "log_tail": "",
        "seconds": 3.0,
        "sandbox": "bwrap",
    }
    base.update(kw)
    return Outcome(**base)


def test_crash_reasons_are_one_line_and_specific():
    assert "segmentation fault" in _outcome(returncode=128 + signal.SIGSEGV).crash_reason()
    assert "segmentation fault" in _outcome(returncode=-signal.SIGSEGV, sandbox="none").crash_reason()
    assert "timed out" in _outcome(timed_out=True).crash_reason()
    assert "memory" in _outcome(memory_exceeded=True).crash_reason()
    assert "without a completion record" in _outcome(returncode=0).crash_reason()
    # killed while writing: the signal is the cause, the cut frame only its trace
    killed = _outcome(returncode=128 + signal.SIGKILL, wire_error="truncated frame").crash_reason()
    assert killed.startswith("crashed with SIGKILL (killed: out of memory?)") and "truncated frame" in killed
    assert (
        "corrupted the result channel" in _outcome(returncode=0, wire_error="bad frame magic").crash_reason()
    )
    assert not _outcome(returncode=0).completed("nonce")
    done = _outcome(frames=[({"kind": "done", "nonce": "n1"}, b"")])
    assert done.completed("n1") and not done.completed("forged")


def test_bwrap_parents_are_created_world_traversable():
    args = _with_parent_dirs(["bwrap", "--ro-bind", "/a/b/c", "/a/b/c", "--bind", "/x", "/sandbox/work"])
    assert args[:5] == ["bwrap", "--perms", "0755", "--dir", "/a"]
    assert "/a/b" in args and "/sandbox" in args
    assert args.index("/a/b") < args.index("--ro-bind")


def test_binds_under_tmp_get_traversable_mount_points_in_the_private_tmp(tmp_path):
    private = tmp_path / "work" / "tmp"
    private.mkdir(parents=True)
    args = ["--ro-bind", "/tmp/ci/checkout/.venv", "/tmp/ci/checkout/.venv", "--ro-bind", "/usr", "/usr"]
    _mount_points_under_tmp(args, private)
    venv = private / "ci" / "checkout" / ".venv"
    assert venv.is_dir()
    for path in (venv, venv.parent, venv.parent.parent):
        assert path.stat().st_mode & 0o777 == 0o755, path
    assert sorted(p.name for p in private.iterdir()) == ["ci"]  # nothing for binds outside /tmp


def _launch_reading(frames: list[tuple[dict, bytes]], transform) -> Launch:
    """A launch whose reader has consumed `frames` from a real pipe through `transform`."""
    import os
    import socket
    import threading

    read_fd, write_fd = os.pipe()
    share, _peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    launch = Launch(spec=None, proc=None, token="t", job_fd=-1, log_path=None, uid=0, transform=transform)  # type: ignore[arg-type]
    reader = threading.Thread(target=_read, args=(read_fd, share, launch, 1 << 20))
    reader.start()
    with os.fdopen(write_fd, "wb") as out:
        for head, payload in frames:
            wire.write_frame(out, head, payload)
    reader.join(timeout=30)
    _peer.close()
    assert not reader.is_alive()
    return launch


def test_frames_are_transformed_off_the_reading_thread_and_kept_in_order():
    """A slow reduction of one output must not hold the pipe: the next frame is read meanwhile."""
    import threading
    import time

    reading = threading.get_ident()
    seen_on: list[int] = []

    def slow(head, payload):
        seen_on.append(threading.get_ident())
        time.sleep(0.05 if head["i"] % 2 else 0.0)
        return {**head, "reduced": True}, payload

    sent = [({"kind": "output", "i": i}, bytes([i]) * 100) for i in range(8)]
    launch = _launch_reading(sent, slow)
    assert [h["i"] for h, _ in launch.frames] == list(range(8))
    assert all(h["reduced"] for h, _ in launch.frames)
    assert [p for _, p in launch.frames] == [p for _, p in sent]
    assert reading not in seen_on and launch.errors == []


def test_a_failing_reduction_is_an_error_and_the_pipe_is_still_drained():
    def broken(head, payload):
        if head["i"] == 1:
            raise ValueError("bad table")
        return head, payload

    launch = _launch_reading([({"kind": "output", "i": i}, b"x") for i in range(4)], broken)
    assert [h["i"] for h, _ in launch.frames] == [0, 2, 3]
    assert launch.errors == ["could not reduce a output frame: bad table"]
