"""Verification throughput against the number of verifier workers (one per GPU, or several sharing one).

The same batch of corpus candidates goes through 1, 2, 4, ... worker processes. Each worker is pinned
with CUDA_VISIBLE_DEVICES to one GPU (round-robin over --gpus), takes a per-node CUDA context slot
(`shared.gpu_slots`) around each candidate, and shares one build cache, so a build made by any worker
is reused by all. Prints candidates per minute, time-to-verdict, scaling efficiency and whether the
verdicts agree across worker counts.

    python benchmarks/verifier_scaling.py --device cuda --workers 1,2,4,8          # 8-GPU node
    python benchmarks/verifier_scaling.py --device cuda --workers 1,2 --gpus 0     # two workers share GPU 0
    python benchmarks/verifier_scaling.py --device cpu --workers 1,2 --limit 6     # smoke run, no GPU
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def corpus(device: str, limit: int) -> list[Path]:
    root = REPO / "tests" / "corpus" / ("cuda" if device == "cuda" else "")
    folders = sorted(p for p in root.iterdir() if (p / "expect.json").is_file())
    return folders[:limit] if limit else folders


def worker(
    index: int, gpu: str, device: str, cache: str, slots: str, per_gpu: int, todo: Any, done: Any
) -> None:
    if device == "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    from stitchcuda.shared.artifacts import LocalArtifactStore
    from stitchcuda.shared.candidate import read_dir
    from stitchcuda.shared.gpu_slots import gpu_slot
    from stitchcuda.verifier.service import VerifierService

    service = VerifierService(artifacts=LocalArtifactStore(Path(cache)))
    while True:
        item = todo.get()
        if item is None:
            return
        folder = Path(item)
        expect = json.loads((folder / "expect.json").read_text())
        reference = (REPO / expect["reference"]).read_text()
        candidate = read_dir(folder)
        candidate.candidate_id = folder.name
        started = time.monotonic()
        with gpu_slot(Path(slots), gpu, per_gpu):
            verdict = service.verify(reference, candidate, device=device)
        done.put(
            {
                "candidate": folder.name,
                "worker": index,
                "gpu": gpu,
                "accepted": verdict.accepted,
                "expected": expect["expected"] == "accept",
                "seconds": time.monotonic() - started,
                "timing_spread": verdict.timing.spread,
                "build_cached": verdict.build.cached,
            }
        )


def run_batch(
    folders: list[Path], workers: int, gpus: list[str], device: str, per_gpu: int, cache: str
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    todo, done = ctx.Queue(), ctx.Queue()
    slots = tempfile.mkdtemp(prefix="stitch-slots-")
    procs = [
        ctx.Process(target=worker, args=(i, gpus[i % len(gpus)], device, cache, slots, per_gpu, todo, done))
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    started = time.monotonic()
    for folder in folders:
        todo.put(str(folder))
    for _ in procs:
        todo.put(None)
    results = [done.get() for _ in folders]
    wall = time.monotonic() - started
    for p in procs:
        p.join()
    return {
        "workers": workers,
        "wall_s": wall,
        "per_minute": 60 * len(folders) / wall,
        "median_time_to_verdict_s": statistics.median(r["seconds"] for r in results),
        "correct": sum(r["accepted"] == r["expected"] for r in results),
        "verdicts": {r["candidate"]: r["accepted"] for r in results},
        "spread_by_worker": {
            str(w): statistics.median([r["timing_spread"] for r in results if r["worker"] == w] or [0.0])
            for w in range(workers)
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--gpus", default="", help="GPU ids to pin workers to (default: all visible)")
    parser.add_argument("--per-gpu", type=int, default=1, help="CUDA contexts allowed per GPU at once")
    parser.add_argument("--limit", type=int, default=0, help="Use only the first N corpus candidates")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from stitchcuda.shared.gpu_slots import visible_gpus

    gpus = [g for g in args.gpus.split(",") if g] or (visible_gpus() if args.device == "cuda" else ["cpu"])
    if not gpus:
        print("no GPU visible; use --device cpu for a smoke run", file=sys.stderr)
        return 2
    folders = corpus(args.device, args.limit)
    cache = tempfile.mkdtemp(prefix="stitch-scaling-cache-")
    # Warm the shared build cache once so every worker count measures verification, not first builds.
    run_batch(folders, 1, gpus[:1], args.device, args.per_gpu, cache)
    rows = [
        run_batch(folders, int(w), gpus, args.device, args.per_gpu, cache) for w in args.workers.split(",")
    ]
    base = rows[0]["per_minute"]
    print(f"{len(folders)} candidates on {args.device}, GPUs {gpus}, {args.per_gpu} context(s) per GPU")
    header = ("workers", "cand/min", "speedup", "efficiency", "median ttv s", "correct", "agree")
    print(" ".join(f"{h:>12}" for h in header))
    for row in rows:
        speedup = row["per_minute"] / base
        agree = row["verdicts"] == rows[0]["verdicts"]
        cells = (
            row["workers"],
            f"{row['per_minute']:.1f}",
            f"{speedup:.2f}",
            f"{speedup / row['workers']:.2f}",
            f"{row['median_time_to_verdict_s']:.2f}",
            f"{row['correct']}/{len(folders)}",
            agree,
        )
        print(" ".join(f"{c!s:>12}" for c in cells))
    if args.out:
        args.out.write_text(json.dumps({"gpus": gpus, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
