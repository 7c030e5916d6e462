"""The D11 static-check policy: every rule id, its default severity, and whether a policy may soften it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stitchcuda.api.v1 import verify_pb2

REJECT = verify_pb2.SEVERITY_REJECT
WARNING = verify_pb2.SEVERITY_WARNING
INFO = verify_pb2.SEVERITY_INFO


@dataclass(frozen=True)
class Rule:
    id: str
    severity: int
    # A rule named in VerifyPolicy.allowed_rules drops from REJECT to WARNING only when this is True.
    downgradable: bool
    # Rows of VERIFIER_THREATS.md section 2 the rule stands against.
    rows: str
    meaning: str


# fmt: off
# Hard REJECTs are things an honest kernel never needs (tampering with the process, the harness, or the
# reference) plus the bypasses that make the candidate not a kernel at all (PyTorch doing the work).
# Only bypasses whose honest use a problem may explicitly permit are downgradable. WARNINGs are soft
# signals for review (D12): they have honest uses, and a runtime check decides. INFO is context.
RULES: tuple[Rule, ...] = (
    #    id                        severity  downgr.  rows          meaning
    Rule("D11.structure",          REJECT,   False,   "-",
         "model_new.py does not parse, or has no class ModelNew with a forward"),
    Rule("D11.modelnew-base",      REJECT,   False,   "5",
         "ModelNew derives from something other than nn.Module"),
    Rule("D11.reference",          REJECT,   False,   "5",
         "the candidate names the reference class Model"),
    Rule("D11.ref-copy",           REJECT,   False,   "5",
         "ModelNew.forward is a copy of the reference forward"),
    Rule("D11.redefine",           REJECT,   False,   "34",
         "redefines get_inputs/get_init_inputs/Model or a module constant of the reference"),
    Rule("D11.torch-op",           REJECT,   True,    "1,2,4,6,7",
         "PyTorch compute on the forward path (torch.*, F.*, nn layers, tensor methods, arithmetic, ATen)"),
    Rule("D11.library-call",       REJECT,   True,    "1",
         "vendor library compute (cuBLAS, cuDNN, MKL, oneDNN, cblas) called from the sources"),
    Rule("D11.library-declared",   INFO,     False,   "1",
         "a declared cuBLAS/cuDNN call for GEMM/convolution, accepted by the job's library kernel policy"),
    Rule("D11.no-custom-call",     REJECT,   True,    "1,3,4",
         "the forward path never calls the extension or a kernel of its own"),
    Rule("D11.fallback",           REJECT,   False,   "2,3",
         "an except handler or an extension-missing branch computes a substitute result"),
    Rule("D11.guarded-build",      REJECT,   False,   "3",
         "the extension import is guarded or conditional, or the candidate builds code itself"),
    Rule("D11.monkeypatch",        REJECT,   False,   "24,25",
         "assigns, setattr()s or deletes attributes of torch/time/sys/builtins/os/... or torch classes"),
    Rule("D11.global-state",       REJECT,   False,   "27,36",
         "writes torch.backends.* or calls a process-wide set_* (TF32, matmul precision, dtype, threads)"),
    Rule("D11.introspection",      REJECT,   False,   "18,25",
         "frame walking, inspect, gc, ctypes, __main__, sys.modules, globals()"),
    Rule("D11.dynamic-code",       REJECT,   False,   "18,24,25",
         "exec/eval/compile/__import__/importlib, computed getattr on modules, Python driven from C++"),
    Rule("D11.io",                 REJECT,   False,   "30,31",
         "file-system or file-descriptor access (open, glob, os.listdir, pathlib, torch.load, fopen)"),
    Rule("D11.network",            REJECT,   False,   "32",         "sockets, urllib, http, requests, curl"),
    Rule("D11.process",            REJECT,   False,   "31,36",
         "subprocesses, os.system, exec, fork, kill, dlopen"),
    Rule("D11.exit",               REJECT,   False,   "30",
         "os._exit, sys.exit, atexit, signal handlers, exit() in C++"),
    Rule("D11.environ",            REJECT,   False,   "31",
         "reads or writes the process environment (os.environ, getenv)"),
    Rule("D11.thread",             REJECT,   False,   "21,36",
         "threads, process pools, async executors, detached C++ threads"),
    Rule("D11.tensor-subclass",    REJECT,   False,   "22",
         "tensor subclasses, wrapper subclasses, __torch_dispatch__/__torch_function__, dispatch modes"),
    Rule("D11.stream-unjoined",    REJECT,   False,   "20",
         "side streams with no join (wait_stream, event wait, stream synchronize) anywhere"),
    Rule("D11.identity-key",       REJECT,   False,   "12,16,35",
         "data_ptr()/id()/_version/storage of an input compared, used as a key, or stored"),
    Rule("D11.output-cache",       REJECT,   False,   "12,13,14",
         "input-derived values kept in module/instance/class state (memo dicts, lru_cache, C++ statics)"),
    Rule("D11.stored-output",      REJECT,   False,   "14,15,23",
         "forward returns a tensor held in module or instance state"),
    Rule("D11.call-counter",       REJECT,   False,   "14,35",
         "a counter bumped in forward decides what forward does (warm-up / phase detection, cursors)"),
    Rule("D11.input-mutation",     REJECT,   False,   "19",         "forward writes into its input tensors"),
    Rule("D11.ignores-inputs",     REJECT,   False,   "8",
         "no input data reaches a kernel or the output"),
    Rule("D11.seed",               REJECT,   False,   "15",
         "seeds or reads RNGs (the seed names the call's input set), or generates random tensors at import "
         "or outside torch on the forward path"),
    Rule("D11.random-draw",        INFO,     False,   "15",
         "draws from torch's generator through ATen (dropout in training mode, randn): how a random "
         "reference's numbers are drawn again; the Verifier seeds every call, the reference's and the "
         "candidate's"),
    Rule("D11.precision",          REJECT,   True,    "26",
         "fp16/bf16/fp8/TF32 casts, intrinsics or autocast when the reference is fp32"),
    Rule("D11.precision-split",    WARNING,  False,   "26",
         "TF32 tensor-core products with residual terms (3xTF32) when the reference is fp32: float32-class "
         "accuracy, which D3 checks against float64"),
    Rule("D11.memory",             REJECT,   False,   "33",
         "allocates 1 GiB or more from constant sizes"),
    Rule("D11.gpu-control",        REJECT,   False,   "36",
         "NVML, device limits/flags, device reset"),
    Rule("D11.smem-limit",         REJECT,   False,   "37",
         "shared memory above 48 KiB without the opt-in attribute, or above the device limit"),
    Rule("D11.no-kernel-launch",   REJECT,   False,   "4,17",
         "CUDA sources define __global__ kernels but launch none of them"),
    Rule("D11.try-except",         WARNING,  False,   "2",
         "try/except (or suppress) on the forward path whose handler re-raises"),
    Rule("D11.stream",             WARNING,  False,   "20",         "side streams, joined before return"),
    Rule("D11.cuda-graph",         WARNING,  False,   "16",
         "CUDA graph capture or replay (legitimate only if inputs are copied in on every call)"),
    Rule("D11.print",              WARNING,  False,   "30",
         "writes to stdout/stderr or the logging system"),
    Rule("D11.timing",             WARNING,  False,   "35",
         "reads clocks or CUDA event timings inside the candidate"),
    Rule("D11.random",             WARNING,  False,   "15",
         "random tensors created outside forward (parameter init)"),
    Rule("D11.memory-probe",       WARNING,  False,   "33",
         "queries free device memory or allocates device memory directly"),
    Rule("D11.commented-launch",   WARNING,  False,   "17",
         "a commented-out kernel launch or extension call"),
    Rule("D11.unlaunched-kernel",  WARNING,  False,   "4",
         "a __global__ kernel that is never referenced outside its definition"),
    Rule("D11.nan-literal",        WARNING,  False,   "29",         "NaN literals"),
    Rule("D11.shape-gate",         WARNING,  False,   "28",
         "input shapes compared with literal sizes"),
    Rule("D11.expand-output",      WARNING,  False,   "23",
         "expand/as_strided/broadcast_to on input-derived tensors (stride-0 outputs)"),
    Rule("D11.input-alias",        WARNING,  False,   "23",
         "forward returns a view of an input tensor (D5 rejects the overlap at run time)"),
    Rule("D11.host-read",          WARNING,  False,   "13",
         ".item()/.tolist()/float() of input-derived values on the forward path"),
    Rule("D11.subsample",          WARNING,  False,   "10",
         "strided slicing of inputs on the forward path"),
    Rule("D11.unused-input",       WARNING,  False,   "8",
         "some forward inputs never reach a kernel or the output"),
    Rule("D11.ignores-init-args",  WARNING,  False,   "34",
         "ModelNew.__init__ ignores its arguments"),
    Rule("D11.call-override",      WARNING,  False,   "-",
         "ModelNew overrides __call__ or registers forward hooks (analysed as entry points)"),
    Rule("D11.import",             WARNING,  False,   "-",
         "imports a module outside the known set, or a star import"),
    Rule("D11.tf32-default",       WARNING,  False,   "26",
         "tl.dot without input_precision='ieee' (Triton defaults fp32 dots to TF32)"),
    Rule("D11.param-op",           INFO,     False,   "-",
         "PyTorch compute on parameters only (weight preparation); not input-derived"),
    Rule("D11.unchecked-launch",   INFO,     False,   "37",
         "kernel launches with no cudaGetLastError / C10_CUDA_KERNEL_LAUNCH_CHECK"),
)
# fmt: on

BY_ID: dict[str, Rule] = {r.id: r for r in RULES}

# Older or shorter names accepted in VerifyPolicy.allowed_rules.
ALIASES = {"torch-op-in-forward": "D11.torch-op", "torch-in-forward": "D11.torch-op"}


def canonical(rule_id: str) -> str:
    rule_id = ALIASES.get(rule_id, rule_id)
    if rule_id in BY_ID:
        return rule_id
    prefixed = "D11." + rule_id
    return prefixed if prefixed in BY_ID else rule_id


def default_severity(rule_id: str) -> int:
    return BY_ID[rule_id].severity


def allowed(policy: verify_pb2.VerifyPolicy | None) -> set[str]:
    """The downgradable rules the policy permits, as canonical ids."""
    if policy is None:
        return set()
    names = {canonical(r) for r in policy.allowed_rules}
    if policy.allowed_precision:
        names.add("D11.precision")
    return {n for n in names if n in BY_ID and BY_ID[n].downgradable}


def apply(
    findings: Iterable[verify_pb2.Finding], policy: verify_pb2.VerifyPolicy | None
) -> list[verify_pb2.Finding]:
    """Copies of the findings with allowed REJECTs lowered to WARNING (the detail says why)."""
    permitted = allowed(policy)
    out = []
    for f in findings:
        g = verify_pb2.Finding()
        g.CopyFrom(f)
        if g.rule in permitted and g.severity == REJECT:
            g.severity = WARNING
            g.detail += " (allowed by policy)"
        out.append(g)
    return out
