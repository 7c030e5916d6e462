"""Typed settings of the Verifier (environment variables STITCH_<FIELD>, e.g. STITCH_SANDBOX=bwrap)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from stitchcuda.shared.settings import CommonSettings


class VerifierSettings(CommonSettings):
    """Policy defaults, sandbox limits and cache locations of the Verifier."""

    # Correctness (D2/D3) and timing (D7) defaults; a VerifyPolicy overrides the non-zero fields.
    trials: int = Field(default=3, ge=1, le=16)
    timing_iterations: int = Field(default=20, ge=5, le=10_000)
    warmup_iterations: int = Field(default=5, ge=1, le=1000)
    timing_pool: int = Field(default=3, ge=3, le=16)
    min_custom_share: float = Field(default=0.5, ge=0.0, le=1.0)
    review_speedup: float = 10.0
    compile_baseline: bool = True
    # The kernel policy of requests that name none (stitchcuda.shared.policy): strict or library.
    kernel_policy: Literal["strict", "library"] = "strict"
    # Tolerance: rel_L2 <= max(floor, factor * err(fp32 reference vs fp64)), and the same for rel-max.
    tol_floor: float = 1e-5
    tol_max_floor: float = 1e-4
    tol_factor: float = 10.0
    # A time below this fraction of the physics floor is rejected.
    floor_fraction: float = 0.5
    # Event and wall clocks must agree: wall <= factor * event + slack.
    clock_factor: float = 1.5
    clock_slack_ms: float = 0.05
    # Interleaved timing (D7): the candidate and the eager reference alternate in blocks, at least
    # `timing_rounds` rounds; while the speedup's confidence interval is wider than +-timing_noise_<device>
    # more rounds follow, up to `timing_max_rounds`. Problems whose parameters and timing inputs exceed
    # `interleave_max_mb` (or whose inputs are made again from seeds) keep the reference run's baseline.
    interleave: bool = True
    timing_rounds: int = Field(default=6, ge=1, le=100)
    timing_max_rounds: int = Field(default=14, ge=1, le=200)
    timing_noise_cpu: float = Field(default=0.05, gt=0.0)
    timing_noise_cuda: float = Field(default=0.01, gt=0.0)
    interleave_max_mb: float = Field(default=1024.0, ge=0.0)
    # A round's block of calls lasts at least this long (at most 1000 calls), so its median is stable.
    timing_block_ms_cpu: float = Field(default=20.0, ge=0.0)
    timing_block_ms_cuda: float = Field(default=2.0, ge=0.0)

    # Timeouts (seconds).
    build_timeout_s: float = 600.0
    reference_timeout_s: float = 600.0
    run_timeout_s: float = 180.0

    # A GPU shared by several runs (harness/turns.py): a problem whose one input set with its float32 and
    # float64 outputs is this many GiB or more runs alone on the device throughout, not only while it times
    # (the sets a run holds would not fit beside another problem's).
    gpu_alone_set_gb: float = Field(default=1.0, gt=0.0)
    # The reference lends the node's GPU slot to another verification while torch.compile compiles its
    # baseline (host work: minutes for a large model), then waits this long to take it back before timing.
    reference_slot_wait_s: float = Field(default=180.0, ge=0.0)

    # Sandbox (D9/D10).
    sandbox: Literal["auto", "bwrap", "none"] = "auto"
    # 0 derives each runner's limit from the host's free memory and the problem (verifier.limits);
    # a positive value is a fixed limit in GiB. Runs that may share the host at once split the free
    # memory (the GPU slots of a node, or a CPU worker's concurrency).
    memory_limit_gb: float = Field(default=0.0, ge=0.0)
    memory_fraction: float = Field(default=0.8, gt=0.0, le=1.0)
    concurrent_runs: int = Field(default=1, ge=1)
    build_memory_limit_gb: float = 12.0
    nproc_limit: int = 512
    file_size_limit_mb: int = 2048
    sandbox_uid_base: int = 200_000
    runner_threads: int = 0  # torch intra-op threads in runners; 0 = torch default
    max_payload_gb: float = 16.0
    # A runner's tensors of this many MiB or more come back as sealed memory files over a socket instead
    # of through the result pipe (about 1 GB/s); 0 sends everything through the pipe.
    shared_memory_min_mb: float = Field(default=16.0, ge=0.0)
    # Large problems (stitchcuda.verifier.harness.sketch): an output of this many elements or more is
    # checked against a summary of its float64 ground truth (a secret sample of `summary_samples`
    # positions, `summary_blocks` block norms, the first and last `summary_edge` values), and an input
    # set of `regen_input_mb` or more is made again from its seed by the candidate's runner instead of
    # being held by the verifier and sent. 0 turns either off.
    summary_min_numel: int = Field(default=1 << 25, ge=0)
    summary_samples: int = Field(default=1 << 22, ge=1024)
    summary_blocks: int = Field(default=4096, ge=16)
    summary_edge: int = Field(default=1 << 16, ge=0)
    regen_input_mb: float = Field(default=1024.0, ge=0.0)

    # Build (nvcc works without a GPU, so CUDA builds run on CPU workers too).
    cuda_arch_list: str = "9.0"
    # Parallel compiles per build: the built-in Coder writes three units (kernels, host code, binding).
    build_jobs: int = 3
    build_cache_dir: Path | None = None
    run_dir: Path | None = None

    # Start the next candidate runner (interpreter, torch, device; no candidate yet) while the parent
    # evaluates the last one, so warm verifications skip that start-up.
    standby: bool = True
    standby_idle_s: float = 900.0

    # Reference results (inputs, ground truth, baselines) are reused for a few candidates of one problem.
    # The count and the age hold across jobs and worker processes of a node: results live on its disk
    # (state_root()/references, at most reference_store_gb; 0 keeps them in this process only).
    reference_reuse: int = 8
    reference_ttl_s: float = 900.0
    reference_store_gb: float = 16.0

    # Nsight Compute counters for the top custom kernels of accepted GPU candidates (feedback only; a
    # second, short run under ncu). "auto" runs it where ncu exists; off by default as it costs seconds.
    ncu: Literal["auto", "on", "off"] = "off"
    ncu_timeout_s: float = 180.0

    def build_root(self) -> Path:
        return self.build_cache_dir or (self.home / "verifier" / "builds")

    def state_root(self) -> Path:
        return self.home / "verifier"
