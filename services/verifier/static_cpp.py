"""Lexical D11 checks over a candidate's C++/CUDA sources, on comment- and string-stripped text."""

from __future__ import annotations

import ast
import bisect
import functools
import re
from dataclasses import dataclass, field

from stitchcuda.verifier.static_report import Hit, Hits

SMEM_DEFAULT = 48 * 1024
SMEM_MAX = 227 * 1024  # the opt-in per-block limit on sm_90 (H100/H200)
GiB = 1 << 30
TYPE_SIZES = {
    "char": 1, "int8_t": 1, "uint8_t": 1, "bool": 1, "short": 2, "int16_t": 2, "half": 2, "__half": 2,
    "__nv_bfloat16": 2, "int": 4, "unsigned": 4, "float": 4, "int32_t": 4, "uint32_t": 4, "double": 8,
    "long": 8, "int64_t": 8, "uint64_t": 8, "size_t": 8, "float2": 8, "float4": 16, "int4": 16, "half2": 4,
    "double2": 16,
}  # fmt: skip

_P = re.compile
# A bare or std:: call of one of the names (not a member call, not another namespace's function).
_BARE = r"\b(?<![:.>])(?:std::)?(?:"


def _bare(*names: str) -> str:
    return _BARE + "|".join(names) + r")\s*\("


def _include(*headers: str) -> str:
    return r"#\s*include\s*<(?:" + "|".join(headers) + ")>"


_RULE_PARTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "D11.thread": ("threads", (
        r"\bstd::j?thread\b", r"\bpthread_create\b", r"\bstd::async\b", r"\bat::launch\s*\(",
        r"\bboost::thread\b", r"\.\s*detach\s*\(\s*\)", _include("thread", "future", r"pthread\.h"))),
    "D11.process": ("processes or dynamic loading", (
        _bare("system", "popen", "fork", "vfork", "execv", "execve", "execvp", "execl", "execlp",
              "posix_spawnp?", "kill", "dlopen", "dlsym"),)),
    "D11.io": ("file access", (
        _bare("fopen", "freopen", "fdopen", "opendir", "readdir", "open", "openat", "creat", "unlink",
              "rename",
              "mkdir", "stat", "access", "dup2?", "fread", "fwrite", "mmap"),
        r"\bstd::(?:i|o)?fstream\b", r"\bstd::filesystem\b", r"\bFILE\s*\*",
        _include("fstream", "filesystem", r"dirent\.h"))),
    "D11.network": ("network", (
        _bare("socket", "connect", "getaddrinfo", "gethostbyname", r"curl_easy_\w+", "curl_global_init"),
        _include(r"sys/socket\.h", r"netdb\.h", r"curl/curl\.h", r"arpa/inet\.h"))),
    "D11.exit": ("process exit or signal handlers", (
        _bare("exit", "_exit", "_Exit", "abort", "quick_exit", "atexit", "at_quick_exit", "signal",
              "sigaction"),)),
    "D11.environ": ("the process environment", (
        _bare("getenv", "secure_getenv", "setenv", "putenv", "unsetenv", "clearenv"), r"\benviron\b")),
    "D11.dynamic-code": ("Python driven from C++", (
        r"\b(?:PyRun_\w+|PyImport_\w+|PyEval_\w+|PyObject_Call\w*|Py_CompileString)\s*\(",
        r"\bpy(?:bind11)?::module_?::import\s*\(", r"\bpy(?:bind11)?::(?:exec|eval|eval_file|globals)\s*\(")),
    "D11.global-state": ("process-wide numeric state", (
        r"\bat::globalContext\s*\(\s*\)\s*\.\s*set\w*", r"\b(?:at|torch)::set_num(?:_interop)?_threads\b",
        r"\bomp_set_num_threads\s*\(", r"\bsetFloat32MatmulPrecision\b", r"\bsetAllowTF32\w*",
        r"\bsetBenchmarkCuDNN\b", r"\bsetUserEnabledCuDNN\b", r"\bsetDeterministic\w*",
        r"\bsetAllow(?:BF16|FP16)Reduction\w*", r"\bset_default_dtype\b")),
    "D11.gpu-control": ("device control", (
        r"\b(?:nvml\w+|cudaDeviceSetLimit|cudaDeviceSetCacheConfig|cudaDeviceSetSharedMemConfig"
        r"|cudaSetDeviceFlags|cudaDeviceReset|cudaCtxResetPersistingL2Cache)\s*\(", _include(r"nvml\.h"))),
    "D11.library-call": ("vendor library compute", (
        r"\b(?:cublas\w+|cudnn\w+|cblas_\w+|mkl_\w+|dnnl_\w+|cusparse\w+|cufft\w+|cutensor\w+)\s*\(",
        r"\bdnnl::\w+", r"\bat::cuda::blas::", r"\bgetCurrentCUDABlasHandle\b")),
    "D11.cuda-graph": ("CUDA graphs", (r"\bcudaGraph\w+", r"\bcudaStreamBeginCapture\b", r"\bcuGraph\w+")),
    "D11.print": ("writes to stdout/stderr", (
        _bare("printf", "puts", "fprintf", "fputs", "perror"), r"\bstd::(?:cout|cerr|clog)\b",
        r"\bTORCH_WARN\w*")),
    # Reading the generator's seed or state names the call's input set (the Verifier seeds each set's calls
    # alike): a cache keyed by it would fake the timed calls.
    "D11.seed": ("seeds or reads a random generator", (
        r"\bmanual_seed\s*\(", _bare("srand"), r"\b(?:initial|current)_seed\s*\(", r"\bget_rng_state\s*\(",
        r"\bgetDefault(?:CPU|CUDA)Generator\b", r"\bphilox_cuda_state\s*\(")),
    "D11.memory-probe": ("direct device memory", (
        r"\bcudaMemGetInfo\b", r"\bcuMemGetInfo\b", r"\bcudaMalloc\w*\s*\(", r"\bcuMemAlloc\w*",
        r"\bCUDACachingAllocator::\w+")),
    "D11.timing": ("clocks or sleeps", (
        r"\bstd::chrono\b", r"\bcudaEventElapsedTime\b",
        _bare("clock_gettime", "gettimeofday", "usleep", "nanosleep", "sleep"),
        r"\bstd::this_thread::sleep_\w+",
        r"__nanosleep")),
    "D11.nan-literal": ("NaN literals", (
        r"numeric_limits\s*<\s*\w+\s*>::quiet_NaN", r"\bNAN\b", _bare("nanf?"), r"CUDART_NAN\w*",
        r"\b0x7fc00000\b")),
    "D11.identity-key": ("tensor identity", (
        r"data_ptr\s*(?:<[^<>;]*>)?\s*\(\s*\)\s*(?:==|!=)", r"(?:==|!=)\s*[\w.\->()]*data_ptr\b",
        r"\b_version\s*\(\s*\)", r"\bunsafeGetTensorImpl\b", r"\.\s*is_same\s*\(")),
}  # fmt: skip
RULES: tuple[tuple[str, re.Pattern[str], str], ...] = tuple(
    (rule, _P("|".join(parts)), what) for rule, (what, parts) in _RULE_PARTS.items()
)
PRECISION = _P(
    r"\b__float2half\w*|\b__half2float\b|\b__half2?\b|\b__nv_bfloat16\w*|\b__float2bfloat16\w*|\bnv_bfloat16\b"
    r"|\b(?:c10|at)::(?:Half|BFloat16)\b|\b(?:at|torch)::k(?:Half|BFloat16|Float16|Float8\w*)\b"
    r"|\bScalarType::(?:Half|BFloat16)\b|\b_Float16\b|\b__fp16\b|\b__nv_fp8\w*|\bwmma::precision::tf32\b"
    r"|\b__float_to_tf32\b|\btf32\b|\bCUBLAS_COMPUTE_32F_FAST\w*|\bCUBLAS_TF32_TENSOR_OP_MATH\b"
    r"|\.\s*(?:half|bfloat16)\s*\(|\(\s*half2?\s*\)|\bhalf2?\s*\*|<\s*half2?\s*>|\bhalf2?\s+[A-Za-z_]\w*\s*[=;,\[)]"
)
_TF32_HI = _P(r"\b(\w+)\s*=\s*(?:[\w:]*::)?__float_to_tf32\s*\(\s*([\w.\[\]]+)\s*\)")


def compensated_tf32(code: str) -> bool:
    """Whether `code` rounds a value to TF32 (`hi = __float_to_tf32(v)`) and also keeps the TF32 rounding of
    the residual (`__float_to_tf32(v - hi)`): operands carried as hi + lo, as 3xTF32 GEMMs do."""
    for m in _TF32_HI.finditer(code):
        hi, value = re.escape(m.group(1)), re.escape(m.group(2))
        if re.search(rf"__float_to_tf32\s*\(\s*{value}\s*-\s*{hi}\s*\)", code):
            return True
    return False


DISPATCH = _P(r"\bc10::Dispatcher\b|\bfindSchema\w*\s*\(|\bcallBoxed\s*\(|\btorch::jit::\w+")
ATEN_CALL = _P(r"\b(?:at|torch)::((?:\w+::)*)(\w+)\s*\(")
# Draws from torch's random generator: a random reference's numbers come from it, and only the same ATen
# call on it draws them again (the Verifier seeds it before every call). Reported, not rejected; D6 counts
# their device time as torch's.
ATEN_RANDOM = frozenset(
    {
        "dropout",
        "native_dropout",
        "randn",
        "rand",
        "randn_like",
        "rand_like",
        "randint",
        "bernoulli",
        "normal",
    }
)
ATEN_ALLOWED = frozenset(
    [
        "empty",
        "empty_like",
        "empty_strided",
        "zeros",
        "zeros_like",
        "ones",
        "ones_like",
        "full",
        "full_like",
        "arange",
        "from_blob",
        "tensor",
        "scalar_tensor",
        "parallel_for",
        "parallel_reduce",
        # Shape arithmetic on sizes, not on tensor data.
        "infer_size",
        "infer_size_dimvector",
        "get_num_threads",
        "get_thread_num",
        "in_parallel_region",
        "init_num_threads",
        "TensorOptions",
        "dtype",
        "device",
        "Device",
        "Tensor",
        "IntArrayRef",
        "Scalar",
        "ScalarType",
        "NoGradGuard",
        "InferenceMode",
        "AutoDispatchBelowAutograd",
        "AutoGradMode",
        "getCurrentCUDAStream",
        "getDefaultCUDAStream",
        "getStreamFromPool",
        "CUDAStream",
        "CUDAStreamGuard",
        "OptionalCUDAGuard",
        "CUDAGuard",
        "DeviceGuard",
        "OptionalDeviceGuard",
        "elementSize",
        "toString",
        "typeMetaToScalarType",
        "globalContext",
        "MemoryFormat",
        "Layout",
        "Slice",
        "makeArrayRef",
        "ArrayRef",
        "irange",
        "cat",
        "stack",
        "cpu_kernel",
        "cpu_kernel_vec",
        "gpu_kernel",
        "Half",
        "BFloat16",
        "empty_cpu",
        "TensorArg",
        "zeros_symint",
        "empty_symint",
        "isFloatingType",
        "isIntegralType",
        "get_default_dtype",
        "DimVector",
        "Generator",
    ]
)
TENSOR_METHOD = _P(
    r"(\w+|\))\s*(?:\.|->)\s*(matmul|mm|bmm|addmm|baddbmm|sum|mean|exp|log|softmax|log_softmax|relu|relu_|gelu|sigmoid|tanh|pow"
    r"|sqrt|rsqrt|norm|var|std|conv1d|conv2d|linear|mul|mul_|add|add_|sub|sub_|div|div_|clamp|clamp_|clamp_min"
    r"|abs|neg|amax|amin|argmax|argmin|cumsum|prod|einsum|layer_norm|batch_norm|max_pool2d|index_select|gather"
    r"|scatter|where|masked_fill|lerp|sort|topk|max|min|logsumexp|silu|erf|square|exp_|mse_loss|dot|mv|outer"
    r"|gelu_|sigmoid_|tanh_|sqrt_|pow_|mean_)\s*\("
)
TENSOR_VAR = _P(
    r"\b(?:at|torch)::Tensor\s*(?:const\s*)?&{0,2}\s*(\w+)|\bauto\s*&{0,2}\s*(\w+)\s*=\s*(?:at|torch)::"
)
STREAM_MAKE = _P(r"\bgetStreamFromPool\b|\bcudaStreamCreate\w*|\bgetStreamFromExternal\b|\bcuStreamCreate\w*")
STREAM_JOIN = _P(
    r"\bcudaStreamWaitEvent\b|\bcudaStreamSynchronize\b|\bcudaDeviceSynchronize\b|\bcudaEventSynchronize\b"
    r"|\.\s*synchronize\s*\(|\bcuStreamWaitEvent\b|\bcuCtxSynchronize\b|\.\s*block\s*\("
)
KERNEL_DEF = _P(r"__global__\s+([^;{()]*?)\b(\w+)\s*\(")
LAUNCH = _P(r"\b(\w+)\s*(?:<[^<>;]*(?:<[^<>;]*>[^<>;]*)*>)?\s*<<<\s*([^;]*?)>>>")
LAUNCH_API = _P(r"\b(?:cudaLaunchKernel\w*|cudaLaunchCooperativeKernel\w*|cuLaunchKernel\w*)\s*\(")
ERROR_CHECK = _P(
    r"\bcudaGetLastError\b|\bcudaPeekAtLastError\b|\bC10_CUDA_KERNEL_LAUNCH_CHECK\b|\bC10_CUDA_CHECK\b"
)
SHARED = _P(
    r"(?<!extern\s)__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?([\w:]+)\s+(\w+)\s*((?:\[[^\]]+\])+)"
)
FUNC_DEF = _P(r"\b(\w+)\s*\([^;{}()]*(?:\([^;{}()]*\)[^;{}()]*)*\)\s*(?:const\s*)?\{")
STATIC_VAR = _P(
    r"\b(?:static|thread_local)\s+(?!constexpr\b|inline\b|__device__|__global__|__host__|__forceinline__"
    r"|void\b|assert\b)([^;{}()=]*?)\b(\w+)\s*(?:=|;|\[|\{)"
)
SUSPECT_TYPE = _P(r"Tensor|map\b|map<|set<|vector|deque|list<|optional|\*|intptr_t|uintptr_t")
NOT_KEYWORDS = frozenset(
    {"if", "for", "while", "switch", "return", "sizeof", "catch", "__launch_bounds__", "defined"}
)


@dataclass
class CppResult:
    streams_made: list[str] = field(default_factory=list)
    streams_joined: list[str] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)
    functions: set[str] = field(default_factory=set)


_LEXEME = re.compile(
    r'(?<![\w])R"(?P<delim>[^()\\\s]{0,16})\((?:.|\n)*?\)(?P=delim)"'
    r"|//[^\n]*|/\*(?:.|\n)*?(?:\*/|\Z)"
    r'|"(?:\\.|[^"\\\n])*"?|\'(?:\\.|[^\'\\\n])*\'?'
)


def _blank(text: str) -> str:
    return re.sub(r"[^\n]", " ", text)


def strip(text: str, keep_strings: bool = False) -> tuple[str, list[tuple[int, str]]]:
    """The text with comments (and string/char literal contents) blanked, newlines kept, and the comments."""
    comments: list[tuple[int, str]] = []
    starts = [0] + [m.end() for m in re.finditer(r"\n", text)]

    def repl(m: re.Match[str]) -> str:
        lexeme = m.group(0)
        if lexeme.startswith(("//", "/*")):
            ln = bisect.bisect_right(starts, m.start())
            body = lexeme[2:-2] if lexeme.startswith("/*") and lexeme.endswith("*/") else lexeme[2:]
            for k, part in enumerate(body.split("\n")):
                comments.append((ln + k, part.strip("/* ")))
            return _blank(lexeme)
        if keep_strings:
            return lexeme
        quote = '"' if lexeme.startswith("R") else lexeme[0]
        inner = lexeme[1:] if lexeme.startswith("R") else lexeme
        if len(inner) >= 2 and inner.endswith(quote):
            return (" " if lexeme.startswith("R") else "") + quote + _blank(inner[1:-1]) + quote
        return _blank(lexeme)

    return _LEXEME.sub(repl, text), comments


def _line(code: str, pos: int) -> int:
    return code.count("\n", 0, pos) + 1


def constants(code: str) -> dict[str, str]:
    consts: dict[str, str] = {}
    for m in re.finditer(r"#\s*define\s+(\w+)[ \t]+([^\n]+)", code):
        consts[m.group(1)] = m.group(2).strip()
    decl = (
        r"\b(?:constexpr|const)\s+(?:static\s+)?(?:unsigned\s+|signed\s+)?(?:int|long|size_t|int64_t|int32_t"
    )
    decl += r"|uint32_t|uint64_t|auto|long\s+long)\s+(\w+)\s*=\s*([^;]+);"
    for m in re.finditer(decl, code):
        consts[m.group(1)] = m.group(2).strip()
    return consts


def evaluate(expr: str, consts: dict[str, str], depth: int = 0) -> int | None:
    """A best-effort integer value of a C constant expression; None when it depends on run-time values."""
    if depth > 8:
        return None
    text = re.sub(
        r"sizeof\s*\(\s*(?:unsigned\s+)?([\w:]+)\s*\)", lambda m: str(TYPE_SIZES.get(m.group(1), 4)), expr
    )
    text = re.sub(r"\b(\d+)(?:[uUlL]{1,3})\b", r"\1", text)
    text = re.sub(r"\(\s*(?:int|size_t|unsigned|long|int64_t)\s*\)", "", text)
    text = re.sub(r"\bstatic_cast\s*<[^>]*>", "", text)

    def sub(m: re.Match[str]) -> str:
        name = m.group(0)
        if name in consts:
            v = evaluate(consts[name], consts, depth + 1)
            if v is not None:
                return str(v)
        raise KeyError(name)

    try:
        text = re.sub(r"\b[A-Za-z_]\w*\b", sub, text).replace("/", "//")
        tree = ast.parse(text.strip(), mode="eval")
    except (KeyError, SyntaxError):
        return None
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.operator, ast.unaryop)
    if not all(isinstance(n, allowed) for n in ast.walk(tree)):
        return None
    try:
        value = eval(compile(tree, "<const>", "eval"), {"__builtins__": {}})
    except (ArithmeticError, ValueError, OverflowError):
        return None
    return value if isinstance(value, int) else None


def _body(code: str, start: int) -> str:
    """The brace-matched block that opens at or after start."""
    i = code.find("{", start)
    if i < 0:
        return ""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return code[i : j + 1]
    return code[i:]


def _globals(code: str) -> list[tuple[int, str]]:
    """Statements at file or namespace scope (namespace and extern "C" braces are transparent)."""
    out: list[tuple[int, str]] = []
    stack: list[bool] = []  # True for a transparent (namespace) brace
    start = 0
    for i, c in enumerate(code):
        if c == "{":
            head = code[start:i]
            stack.append(bool(re.search(r"(namespace\s*\w*|extern\s*\"\s*\")\s*$", head)))
            start = i + 1
        elif c == "}":
            if stack:
                stack.pop()
            start = i + 1
        elif c == ";":
            if all(stack):
                out.append((start, code[start:i]))
            start = i + 1
        elif c == "#" and (i == 0 or code[i - 1] == "\n"):
            start = code.find("\n", i) + 1 or len(code)
    return out


def scan_sources(files: dict[str, str], hits: Hits, *, fp32: bool) -> CppResult:
    """Runs every C++/CUDA rule over the sources; kernel-launch rules look across all files together."""
    found, res = _scan_cached(tuple(sorted(files.items())), fp32)
    hits.extend(found)
    return CppResult(list(res.streams_made), list(res.streams_joined), list(res.kernels), set(res.functions))


@functools.lru_cache(maxsize=64)
def _scan_cached(items: tuple[tuple[str, str], ...], fp32: bool) -> tuple[tuple[Hit, ...], CppResult]:
    # Candidates of one job share their sources round after round: scan each source set once.
    files = dict(items)
    hits = Hits()
    res = CppResult()
    stripped = {path: strip(text) for path, text in files.items()}
    all_code = "\n".join(code for code, _ in stripped.values())
    consts = constants(all_code)
    for path, (code, _notes) in stripped.items():
        _rules(path, code, hits, fp32, files[path])
        _state(path, code, hits)
        for m in STREAM_MAKE.finditer(code):
            res.streams_made.append(f"{path}:{_line(code, m.start())}")
        for m in STREAM_JOIN.finditer(code):
            res.streams_joined.append(f"{path}:{_line(code, m.start())}")
        for m in FUNC_DEF.finditer(code):
            if m.group(1) not in NOT_KEYWORDS:
                res.functions.add(m.group(1))
    _kernels(stripped, all_code, consts, hits, res)
    _comments(stripped, res, hits)
    return tuple(hits), res


def _rules(path: str, code: str, hits: Hits, fp32: bool, raw: str) -> None:
    for rule, pattern, what in RULES:
        for m in pattern.finditer(code):
            hits.add(rule, f"{what}: {m.group(0).strip()[:60]}", f"{path}:{_line(code, m.start())}")
    for m in ATEN_CALL.finditer(code):
        ns, name = m.group(1), m.group(2)
        if name in ATEN_ALLOWED or name.startswith(("check", "is_", "get_", "set_")):
            continue
        if name in ATEN_RANDOM and not ns:
            hits.add(
                "D11.random-draw",
                f"draws from torch's random generator: {m.group(0).strip()[:60]}",
                f"{path}:{_line(code, m.start())}",
            )
            continue
        if name[:1].isupper() and not ns:  # at::Tensor(...), at::Scalar(...): types, not ops
            continue
        if ns.startswith(("cuda::", "indexing::", "detail::")) and not ns.startswith("cuda::blas"):
            continue
        hits.add(
            "D11.torch-op",
            f"ATen compute in C++: {m.group(0).strip()[:60]}",
            f"{path}:{_line(code, m.start())}",
        )
    for m in DISPATCH.finditer(code):
        hits.add(
            "D11.torch-op",
            f"ATen through the dispatcher: {m.group(0).strip()[:60]}",
            f"{path}:{_line(code, m.start())}",
        )
    tensors = {n for pair in TENSOR_VAR.findall(code) for n in pair if n}
    for m in TENSOR_METHOD.finditer(code):
        # Only receivers known to be tensors (declared at::Tensor / torch::Tensor, or a call chain on one).
        if m.group(1) != ")" and m.group(1) not in tensors:
            continue
        hits.add(
            "D11.torch-op", f"ATen tensor method in C++: .{m.group(2)}()", f"{path}:{_line(code, m.start())}"
        )
    if fp32:
        split = compensated_tf32(code)
        for m in PRECISION.finditer(code):
            # TF32 in a file that splits operands into a TF32 high part and a TF32 residual (3xTF32):
            # float32-class products, a signal for the report; D3 against float64 decides.
            compensated = split and "tf32" in m.group(0).lower()
            what = "TF32 tensor cores with residual terms (3xTF32)" if compensated else "reduced precision"
            hits.add(
                "D11.precision-split" if compensated else "D11.precision",
                f"{what}: {m.group(0).strip()[:60]}",
                f"{path}:{_line(code, m.start())}",
            )
        with_strings, _ = strip(raw, keep_strings=True)
        for m in re.finditer(r"\.(?:tf32|f16|bf16|e4m3|e5m2)(?:x2)?\b", with_strings):
            hits.add(
                "D11.precision",
                f"reduced precision in inline PTX: {m.group(0)}",
                f"{path}:{_line(with_strings, m.start())}",
            )


def _state(path: str, code: str, hits: Hits) -> None:
    """Function statics and namespace-scope variables that can keep tensors, pointers or maps across calls."""
    for m in STATIC_VAR.finditer(code):
        decl = m.group(1) + m.group(2)
        if SUSPECT_TYPE.search(m.group(1)):
            hits.add(
                "D11.output-cache",
                f"static state in C++: {decl.strip()[:60]}",
                f"{path}:{_line(code, m.start())}",
            )
    for start, stmt in _globals(code):
        text = " ".join(stmt.split())
        if not text or text.startswith(
            ("using", "typedef", "template", "extern", "constexpr", "static_assert")
        ):
            continue
        head = text.split("=", 1)[0]
        if "(" in head or re.match(r"(?:const|static\s+const)\b", text) or "static" in head.split():
            continue
        if re.search(r"\b(?:struct|class|enum|union)\b", head):
            continue
        if SUSPECT_TYPE.search(head) and re.search(r"\w\s*$", head):
            hits.add("D11.output-cache", f"global state in C++: {text[:60]}", f"{path}:{_line(code, start)}")


def _kernels(
    stripped: dict[str, tuple[str, list[tuple[int, str]]]],
    all_code: str,
    consts: dict[str, str],
    hits: Hits,
    res: CppResult,
) -> None:
    launched: set[str] = set()
    any_launch = False
    opt_in = "cudaFuncAttributeMaxDynamicSharedMemorySize" in all_code
    for path, (code, _) in stripped.items():
        clean = re.sub(r"__launch_bounds__\s*\([^)]*\)", " ", code)
        for m in KERNEL_DEF.finditer(clean):
            res.kernels.append(m.group(2))
            static = 0
            for s in SHARED.finditer(_body(clean, m.end())):
                size = TYPE_SIZES.get(s.group(1).split("::")[-1], 4)
                for dim in re.findall(r"\[([^\]]+)\]", s.group(3)):
                    v = evaluate(dim, consts)
                    size = size * v if v is not None else 0
                static += size
            if static > SMEM_DEFAULT:
                hits.add("D11.smem-limit", f"kernel {m.group(2)} declares {static} B of static shared memory",
                         f"{path}:{_line(clean, m.start())}")  # fmt: skip
        for m in LAUNCH.finditer(code):
            any_launch = True
            launched.add(m.group(1))
            cfg = [c.strip() for c in _split_args(m.group(2))]
            if len(cfg) >= 3:
                v = evaluate(cfg[2], consts)
                where = f"{path}:{_line(code, m.start())}"
                if v is not None and v > SMEM_MAX:
                    hits.add(
                        "D11.smem-limit",
                        f"launch of {m.group(1)} asks {v} B of shared memory (> {SMEM_MAX})",
                        where,
                    )
                elif v is not None and v > SMEM_DEFAULT and not opt_in:
                    detail = f"launch of {m.group(1)} asks {v} B dynamic shared memory without opting in"
                    hits.add(
                        "D11.smem-limit", detail + " (cudaFuncAttributeMaxDynamicSharedMemorySize)", where
                    )
        if LAUNCH_API.search(code):
            any_launch = True
        for m in re.finditer(r"cudaFuncSetAttribute\s*\(([^;]*)\)\s*;", code):
            parts = _split_args(m.group(1))
            v = evaluate(parts[-1], consts) if len(parts) >= 3 else None
            if v is not None and v > SMEM_MAX:
                hits.add(
                    "D11.smem-limit",
                    f"opts in to {v} B of shared memory (> {SMEM_MAX})",
                    f"{path}:{_line(code, m.start())}",
                )
        if LAUNCH.search(code) and not ERROR_CHECK.search(all_code):
            hits.add(
                "D11.unchecked-launch",
                "kernel launches without cudaGetLastError / C10_CUDA_KERNEL_LAUNCH_CHECK",
                path,
            )
    if res.kernels and not any_launch:
        names = ", ".join(res.kernels[:6])
        hits.add(
            "D11.no-kernel-launch", f"__global__ kernels {names} are never launched", next(iter(stripped))
        )
    for name in res.kernels:
        refs = len(re.findall(rf"\b{re.escape(name)}\b", all_code))
        defs = len(re.findall(rf"__global__[^;{{()]*\b{re.escape(name)}\s*\(", all_code))
        if name not in launched and refs <= defs:
            hits.add(
                "D11.unlaunched-kernel",
                f"__global__ kernel {name} is never launched or referenced",
                next(iter(stripped)),
            )


def _comments(stripped: dict[str, tuple[str, list[tuple[int, str]]]], res: CppResult, hits: Hits) -> None:
    names = sorted((res.functions | set(res.kernels)) - NOT_KEYWORDS)
    call = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\s*(?:<<<|\()[^;]*;") if names else None
    for path, (_, comments) in stripped.items():
        for ln, text in comments:
            if "<<<" in text or (call is not None and call.search(text)):
                hits.add("D11.commented-launch", f"commented-out call: {text.strip()[:80]}", f"{path}:{ln}")


def _split_args(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for c in text:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return parts
