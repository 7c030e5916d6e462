"""Planner settings: subprocess limits, profiling, device ceilings, the optional LLM (STITCH_PLANNER_*)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from stitchcuda.shared.settings import CommonSettings

GIB = 1 << 30


def _env(name: str, *fallbacks: str, **kwargs: Any) -> Any:
    """A field read from STITCH_PLANNER_<NAME> (then any shared fallbacks), settable by field name too."""
    aliases = [f"STITCH_PLANNER_{name.upper()}", *fallbacks]
    return Field(validation_alias=AliasChoices(*aliases), **kwargs)


class PlannerSettings(CommonSettings):
    """What the Planner needs to analyse, profile and (optionally) refine a plan with an LLM."""

    model_config = SettingsConfigDict(
        env_prefix="STITCH_", env_file=None, extra="ignore", populate_by_name=True
    )

    # The reference runs in a subprocess: each phase has its own deadline, so a slow profile or a slow
    # torch.compile never costs the analysis.
    # The meta-device analysis runs no real compute: a reference still in it after this long loops or
    # hangs (in import, get_inputs or the traced forward) and the job ends with reference_timeout.
    analysis_timeout_s: float = _env("analysis_timeout_s", default=50.0, gt=0)
    profile_timeout_s: float = _env("profile_timeout_s", default=300.0, gt=0)
    # The real run's deadline: 3x its calls at this slow rate, at least min_run_timeout_s, at most
    # profile_timeout_s.
    slowest_flops_per_s: float = _env("slowest_flops_per_s", default=2e9, gt=0)
    min_run_timeout_s: float = _env("min_run_timeout_s", default=30.0, gt=0)
    compile_timeout_s: float = _env("compile_timeout_s", default=300.0, gt=0)
    # Address-space limit of the subprocess on CPU runs (MiB); 0 = none. A reference that would
    # allocate its 16 GiB inputs then fails fast instead of swapping the machine. Not applied on CUDA
    # runs: the CUDA driver reserves far more address space than it uses.
    subprocess_memory_mb: int = _env("subprocess_memory_mb", default=8192, ge=0)
    # "auto": bubblewrap (no network, read-only system) where it works, otherwise a plain subprocess.
    sandbox: Literal["auto", "bwrap", "none"] = _env("sandbox", default="auto")

    # Real tensors are created (to check the reference runs and to profile it) only when the inputs
    # plus parameters fit under this many bytes; above it the plan comes from the meta-device analysis.
    max_real_bytes: int = _env("max_real_bytes", default=2 * GIB, ge=0)
    seed: int = _env("seed", default=0)
    profile_warmup: int = _env("profile_warmup", default=3, ge=0)
    profile_iters: int = _env("profile_iters", default=20, ge=1)
    # Iterations of the per-op profile (an fx interpreter with a profiler range around each node).
    profile_op_iters: int = _env("profile_op_iters", default=5, ge=1)
    profile_compile: bool = _env("profile_compile", default=True)
    nsys_enabled: bool = _env("nsys_enabled", default=True)
    nsys_timeout_s: float = _env("nsys_timeout_s", default=300.0, gt=0)

    # Fusion policy: GEMM/conv/RNN anchors stay in cuBLAS/cuDNN with their epilogue fused around the call.
    library_gemm: bool = _env("library_gemm", default=True)

    # Device ceilings for the roofline floor. The floor must never flag an honest kernel, so these are
    # upper bounds of what the device delivers: H200 copy bandwidth (~4.3 TB/s of the 4.8 TB/s spec),
    # FP32 without tensor cores (~60 of 67 TFLOP/s), TF32 and FP16/BF16 tensor cores (dense).
    cuda_bandwidth_gbps: float = _env("cuda_bandwidth_gbps", default=4300.0, gt=0)
    cuda_vector_tflops: float = _env("cuda_vector_tflops", default=60.0, gt=0)
    cuda_tf32_tflops: float = _env("cuda_tf32_tflops", default=400.0, gt=0)
    cuda_half_tflops: float = _env("cuda_half_tflops", default=800.0, gt=0)
    # GEMM FLOPs of an fp32 problem may run on TF32 tensor cores in the floor: precision is policed by
    # the Verifier's static checks, the floor only has to be a true lower bound.
    floor_allow_tf32: bool = _env("floor_allow_tf32", default=True)
    # CPU ceilings: generous for a small server (a few cores of AVX2/AVX-512), so the floor stays low;
    # measuring on a shared machine would give noisy, too-low ceilings and a floor that flags honest code.
    cpu_bandwidth_gbps: float = _env("cpu_bandwidth_gbps", default=100.0, gt=0)
    cpu_tflops: float = _env("cpu_tflops", default=2.0, gt=0)

    # Optional LLM refinement of fusion boundaries and orchestration (OpenAI-compatible endpoint).
    llm_enabled: bool = _env("llm_enabled", "STITCH_LLM_ENABLED", default=False)
    llm_base_url: str = _env("llm_base_url", "STITCH_LLM_BASE_URL", default="http://127.0.0.1:8000/v1")
    llm_model: str = _env("llm_model", "STITCH_LLM_MODEL", default="")
    llm_api_key: SecretStr = _env("llm_api_key", "STITCH_LLM_API_KEY", default=SecretStr("EMPTY"))
    llm_timeout_s: float = _env("llm_timeout_s", "STITCH_LLM_TIMEOUT_S", default=120.0, gt=0)
    llm_max_retries: int = _env("llm_max_retries", default=1, ge=0)
    llm_temperature: float = _env("llm_temperature", default=0.0, ge=0)
    # "json_schema" asks the server for schema-guided decoding (vLLM, OpenAI); "json_object" only for JSON.
    llm_response_format: Literal["json_schema", "json_object"] = _env(
        "llm_response_format", default="json_schema"
    )
