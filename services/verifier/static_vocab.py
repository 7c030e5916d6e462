"""Name sets of the D11 scan: which torch calls compute, which only allocate or view, which are risky."""

from __future__ import annotations

# torch.* functions that allocate, view, query or orchestrate: allowed on the forward path.
TORCH_ALLOC = frozenset(
    {
        "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
        "full_like", "arange", "tensor", "as_tensor", "scalar_tensor", "from_numpy", "frombuffer",
    }
)  # fmt: skip
TORCH_VIEW = frozenset(
    {
        "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "transpose", "swapaxes", "swapdims",
        "permute", "movedim", "moveaxis", "t", "narrow", "select", "split", "chunk", "unbind",
        "as_strided", "broadcast_to", "view_as_real", "view_as_complex", "cat", "concat", "concatenate",
        "stack", "hstack", "vstack", "atleast_1d", "atleast_2d", "detach", "clone",
    }
)  # fmt: skip
# Dotted names under torch that never compute on tensors (queries, context managers, utilities).
TORCH_NEUTRAL_PREFIXES = (
    "torch.cuda.synchronize", "torch.cuda.current_stream", "torch.cuda.default_stream",
    "torch.cuda.current_device", "torch.cuda.device", "torch.cuda.is_available", "torch.cuda.device_count",
    "torch.cuda.get_device_", "torch.cuda.Event", "torch.cuda.nvtx", "torch.cuda.empty_cache",
    "torch.cuda.is_current_stream_capturing", "torch.cuda.Stream", "torch.cuda.stream",
    "torch.cuda.ExternalStream",
    "torch.cuda.StreamContext", "torch.cuda.CUDAGraph", "torch.cuda.graph", "torch.cuda.graphs",
    "torch.cuda.mem_get_info", "torch.cuda.memory", "torch.cuda.max_memory", "torch.cuda.streams",
    "torch.autograd.profiler", "torch.profiler", "torch.library", "torch.utils",
    "torch.backends", "torch.jit.is_scripting", "torch.compiler.is_compiling", "torch.Size", "torch.device",
    "torch.dtype", "torch.finfo", "torch.iinfo", "torch.no_grad", "torch.inference_mode", "torch.enable_grad",
    "torch.set_grad_enabled", "torch.is_grad_enabled", "torch.is_tensor", "torch.is_storage",
    "torch.is_floating_point", "torch.is_complex", "torch.numel", "torch.result_type", "torch.promote_types",
    "torch.get_default_dtype", "torch.get_num_threads", "torch._assert", "torch.nn.Parameter",
    "torch.nn.parameter", "torch.nn.Module", "torch.nn.init", "torch.Generator", "torch.Tensor._make",
    "torch.manual_seed", "torch.seed", "torch.random", "torch.set_", "torch.use_deterministic",
    "torch.Stream", "torch.Event", "torch.cuda.amp", "torch.autocast", "torch.amp", "torch.cpu.amp",
    "torch.cuda.set_", "torch.cuda.reset_", "torch.cuda.manual_seed", "torch.cuda.seed", "torch.typename",
    "torch.get_device", "torch.cuda.cudart", "torch.cuda.caching_allocator",
)  # fmt: skip
# Calls that compile or trace PyTorch programs: PyTorch (Inductor, TorchScript) writes those kernels.
TORCH_CODEGEN = frozenset({"torch.compile", "torch.jit.script", "torch.jit.trace", "torch.fx.symbolic_trace"})
TORCH_RANDOM = frozenset(
    {
        "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "normal",
        "bernoulli", "multinomial", "poisson",
    }
)  # fmt: skip
RANDOM_METHODS = frozenset(
    {"normal_", "uniform_", "random_", "bernoulli_", "exponential_", "geometric_", "cauchy_", "log_normal_"}
)
SEED_CALLS = frozenset(
    {
        "torch.manual_seed", "torch.seed", "torch.random.manual_seed", "torch.random.seed",
        "torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "torch.cuda.seed", "torch.cuda.seed_all",
        "random.seed", "numpy.random.seed", "torch.random.set_rng_state", "torch.set_rng_state",
        "torch.cuda.set_rng_state", "torch.cuda.set_rng_state_all", "random.setstate",
        # Reading the generator names the call's input set (every call on a set is seeded alike).
        "torch.initial_seed", "torch.random.initial_seed", "torch.cuda.initial_seed", "torch.get_rng_state",
        "torch.random.get_rng_state", "torch.cuda.get_rng_state", "torch.cuda.get_rng_state_all",
    }
)  # fmt: skip

# Tensor methods: metadata queries, identities, host reads, views and copies, allowed in-place writes.
META_METHODS = frozenset(
    {
        "size", "dim", "ndimension", "numel", "nelement", "stride", "storage_offset", "element_size",
        "is_contiguous", "get_device", "is_floating_point", "is_complex", "is_pinned", "is_shared",
        "is_set_to", "has_names", "is_nonzero", "type",
    }
)  # fmt: skip
META_ATTRS = frozenset(
    {
        "shape", "dtype", "device", "ndim", "is_cuda", "is_cpu", "layout", "requires_grad", "is_leaf",
        "names", "itemsize", "nbytes", "is_sparse", "is_quantized", "is_meta", "grad_fn",
    }
)  # fmt: skip
ID_METHODS = frozenset({"data_ptr", "untyped_storage", "storage", "_cdata", "_storage", "unsafe_ptr"})
ID_ATTRS = frozenset({"_version", "_cdata", "_base"})
HOST_METHODS = frozenset({"item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__"})
VIEW_METHODS = frozenset(
    {
        "view", "view_as", "reshape", "reshape_as", "t", "transpose", "permute", "unsqueeze", "squeeze",
        "flatten", "unflatten", "narrow", "select", "split", "chunk", "unbind", "expand", "expand_as",
        "as_strided", "movedim", "moveaxis", "swapaxes", "swapdims", "unfold", "contiguous", "detach",
        "to", "cuda", "cpu", "float", "double", "type_as", "requires_grad_", "pin_memory", "clone",
        "share_memory_", "record_stream", "broadcast_to", "__getitem__", "split_with_sizes",
    }
)  # fmt: skip
# Views that can give an output stride 0 (row 23).
EXPAND_METHODS = frozenset({"expand", "expand_as", "as_strided", "broadcast_to"})
# A copy, not a view: the result no longer aliases the receiver.
COPY_METHODS = frozenset({"clone", "float", "double", "to", "cuda", "cpu", "type_as"})
INPLACE_FILL = frozenset({"zero_", "fill_", "copy_", "set_", "resize_", "resize_as_", "detach_"})
NEW_METHODS = frozenset({"new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "new_empty_strided"})
CONTAINER_WRITE = frozenset(
    {"append", "extend", "insert", "add", "update", "setdefault", "__setitem__", "put", "appendleft"}
)
CONTAINER_READ = frozenset({"get", "pop", "__getitem__", "popleft", "popitem"})

# Tensor methods that compute (a curated core; dir(torch.Tensor) extends it at import when torch loads).
TENSOR_COMPUTE = frozenset(
    {
        "abs", "add", "addmm", "addbmm", "baddbmm", "addcmul", "addcdiv", "addmv", "all", "amax", "amin",
        "any", "argmax", "argmin", "argsort", "bmm", "ceil", "clamp", "clamp_min", "clamp_max", "clip",
        "cos", "cosh", "cumsum", "cumprod", "div", "dot", "einsum", "eq", "erf", "exp", "exp2", "expm1",
        "floor", "fmod", "gather", "ge", "gelu", "gt", "index_add", "index_select", "le", "lerp", "log",
        "log1p", "log2", "log_softmax", "logsumexp", "lt", "masked_fill", "matmul", "max", "maximum",
        "mean", "median", "min", "minimum", "mm", "mul", "multiply", "mv", "nan_to_num", "ne", "neg",
        "norm", "outer", "pow", "prod", "reciprocal", "relu", "remainder", "round", "rsqrt", "scatter",
        "scatter_add", "sigmoid", "sign", "sin", "sinh", "softmax", "sort", "sqrt", "square", "std",
        "sub", "subtract", "sum", "tanh", "topk", "tril", "triu", "true_divide", "trunc", "var", "where",
        "silu", "hardtanh", "logical_and", "logical_or", "logical_not", "cummax", "cummin", "diff",
        "half", "bfloat16", "sum_to_size", "repeat", "repeat_interleave", "roll", "flip", "kthvalue",
        "mode", "nansum", "nanmean", "count_nonzero", "nonzero", "equal", "allclose", "isclose", "isnan",
        "isinf", "isfinite", "sigmoid_", "softplus", "sgn", "square_", "masked_select", "masked_scatter",
        "index_put", "index_copy", "index_fill", "take", "take_along_dim", "conv2d", "linear",
    }
)  # fmt: skip
# Public Tensor methods that are neither compute nor data movement.
TENSOR_NEUTRAL = frozenset(
    {
        "register_hook", "backward", "retain_grad", "apply_", "map_", "map2_", "storage_type", "rename",
        "refine_names", "align_to", "align_as", "is_inference", "dim_order", "tolist", "numpy", "item",
        "new", "data_ptr", "untyped_storage", "storage", "share_memory_", "pin_memory", "element_size",
        "requires_grad_", "stride", "size", "dim", "numel", "nelement", "to", "cpu", "cuda", "type",
        "float", "double", "contiguous", "view", "view_as", "reshape", "clone", "detach", "copy_",
        "zero_", "fill_", "record_stream", "get_device", "storage_offset", "module_load", "to_dense",
    }
)  # fmt: skip


def _tensor_methods() -> frozenset[str]:
    try:
        import torch
    except ImportError:  # the scan must work without torch; the curated core stands alone
        return TENSOR_COMPUTE
    names = {n for n in dir(torch.Tensor) if not n.startswith("_") and not n.startswith("is_")}
    names -= TENSOR_NEUTRAL | VIEW_METHODS | META_METHODS | ID_METHODS | HOST_METHODS | NEW_METHODS
    names -= INPLACE_FILL | RANDOM_METHODS | {"register_post_accumulate_grad_hook", "bfloat16", "half"}
    return frozenset(names | TENSOR_COMPUTE)


DUNDER_COMPUTE = frozenset(
    f"__{op}__"
    for base in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor")
    for op in (base, "r" + base, "i" + base)
) | frozenset(
    {"__neg__", "__abs__", "__invert__", "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"}
)
TENSOR_METHODS = _tensor_methods() | DUNDER_COMPUTE

# Builtins that compute when handed tensors.
BUILTIN_COMPUTE = frozenset({"abs", "sum", "max", "min", "pow", "round", "divmod", "sorted"})
BUILTIN_HOST = frozenset({"float", "int", "bool", "complex"})

# Reduced-precision dtypes (rows 26/27), as qualified names.
LOW_DTYPES = frozenset(
    {
        "torch.float16", "torch.half", "torch.bfloat16", "torch.complex32", "torch.chalf",
        "torch.float8_e4m3fn", "torch.float8_e5m2", "torch.float8_e4m3fnuz", "torch.float8_e5m2fnuz",
        "torch.HalfTensor", "torch.BFloat16Tensor", "torch.cuda.HalfTensor", "torch.cuda.BFloat16Tensor",
        "triton.language.float16", "triton.language.bfloat16", "triton.language.float8e4nv",
        "triton.language.float8e5", "triton.language.float8e4b15", "numpy.float16",
    }
)  # fmt: skip
LOW_METHODS = frozenset({"half", "bfloat16"})
AUTOCAST = ("torch.autocast", "torch.cuda.amp", "torch.cpu.amp", "torch.amp")

# Module categories: (qualified prefix, rule); the first match wins (specific prefixes first); "" = harmless.
MODULE_RULES: tuple[tuple[str, str], ...] = (
    ("torch.utils.cpp_extension", "D11.guarded-build"),
    ("torch.multiprocessing", "D11.thread"),
    ("torch.library", "D11.monkeypatch"),
    ("torch.utils._python_dispatch", "D11.tensor-subclass"),
    ("torch.overrides", "D11.tensor-subclass"),
    ("torch._C._EnableTorchFunction", "D11.tensor-subclass"),
    ("torch._C._DisableTorchDispatch", "D11.tensor-subclass"),
    ("torch.Tensor._make_subclass", "D11.tensor-subclass"),
    ("torch.Tensor._make_wrapper_subclass", "D11.tensor-subclass"),
    ("torch._C._disabled_torch_function_impl", "D11.tensor-subclass"),
    ("torch.save", "D11.io"),
    ("torch.jit.load", "D11.io"),
    ("torch.jit.save", "D11.io"),
    ("torch.package", "D11.io"),
    ("torch.load", "D11.io"),
    ("torch.hub", "D11.network"),
    ("numpy.load", "D11.io"),
    ("numpy.save", "D11.io"),
    ("numpy.fromfile", "D11.io"),
    ("numpy.loadtxt", "D11.io"),
    ("numpy.memmap", "D11.io"),
    ("sys._getframe", "D11.introspection"),
    ("sys._current_frames", "D11.introspection"),
    ("sys.modules", "D11.introspection"),
    ("sys.settrace", "D11.introspection"),
    ("sys.setprofile", "D11.introspection"),
    ("sys.exit", "D11.exit"),
    ("sys.stdout", "D11.print"),
    ("sys.stderr", "D11.print"),
    ("sys.__stdout__", "D11.print"),
    ("sys.stdin", "D11.io"),
    ("sys.addaudithook", "D11.introspection"),
    ("sys.meta_path", "D11.dynamic-code"),
    ("sys.path", "D11.dynamic-code"),
    ("os._exit", "D11.exit"),
    ("os.abort", "D11.exit"),
    ("os.kill", "D11.process"),
    ("os.killpg", "D11.process"),
    ("os.environ", "D11.environ"),
    ("os.environb", "D11.environ"),
    ("os.getenv", "D11.environ"),
    ("os.putenv", "D11.environ"),
    ("os.unsetenv", "D11.environ"),
    ("os.system", "D11.process"),
    ("os.popen", "D11.process"),
    ("os.exec", "D11.process"),
    ("os.spawn", "D11.process"),
    ("os.fork", "D11.process"),
    ("os.posix_spawn", "D11.process"),
    ("os.startfile", "D11.process"),
    ("os.setsid", "D11.process"),
    ("os.nice", "D11.process"),
    ("os.sched_setaffinity", "D11.process"),
    ("os.cpu_count", ""),
    ("os.sep", ""),
    ("os.", "D11.io"),
    ("builtins.open", "D11.io"),
    ("builtins.input", "D11.io"),
    ("builtins.exec", "D11.dynamic-code"),
    ("builtins.eval", "D11.dynamic-code"),
    ("builtins.compile", "D11.dynamic-code"),
    ("builtins.__import__", "D11.dynamic-code"),
    ("builtins.globals", "D11.introspection"),
    ("builtins.locals", "D11.introspection"),
    ("builtins.vars", "D11.introspection"),
    ("builtins.exit", "D11.exit"),
    ("builtins.quit", "D11.exit"),
    ("builtins.print", "D11.print"),
    ("builtins.breakpoint", "D11.introspection"),
    ("io.", "D11.io"),
    ("glob", "D11.io"),
    ("pathlib", "D11.io"),
    ("shutil", "D11.io"),
    ("tempfile", "D11.io"),
    ("fnmatch", "D11.io"),
    ("mmap", "D11.io"),
    ("fcntl", "D11.io"),
    ("pickle", "D11.dynamic-code"),
    ("marshal", "D11.dynamic-code"),
    ("runpy", "D11.dynamic-code"),
    ("importlib", "D11.dynamic-code"),
    ("types.FunctionType", "D11.dynamic-code"),
    ("types.CodeType", "D11.dynamic-code"),
    ("code", "D11.dynamic-code"),
    ("codeop", "D11.dynamic-code"),
    ("setuptools", "D11.guarded-build"),
    ("distutils", "D11.guarded-build"),
    ("socket", "D11.network"),
    ("ssl", "D11.network"),
    ("urllib", "D11.network"),
    ("http", "D11.network"),
    ("requests", "D11.network"),
    ("httpx", "D11.network"),
    ("aiohttp", "D11.network"),
    ("ftplib", "D11.network"),
    ("smtplib", "D11.network"),
    ("telnetlib", "D11.network"),
    ("xmlrpc", "D11.network"),
    ("websocket", "D11.network"),
    ("websockets", "D11.network"),
    ("subprocess", "D11.process"),
    ("pty", "D11.process"),
    ("multiprocessing", "D11.thread"),
    ("threading", "D11.thread"),
    ("_thread", "D11.thread"),
    ("concurrent", "D11.thread"),
    ("asyncio", "D11.thread"),
    ("sched", "D11.thread"),
    ("atexit", "D11.exit"),
    ("signal", "D11.exit"),
    ("faulthandler", "D11.exit"),
    ("gc", "D11.introspection"),
    ("inspect", "D11.introspection"),
    ("ctypes", "D11.introspection"),
    ("cffi", "D11.introspection"),
    ("__main__", "D11.introspection"),
    ("traceback", "D11.introspection"),
    ("weakref", "D11.introspection"),
    ("pynvml", "D11.gpu-control"),
    ("nvidia_smi", "D11.gpu-control"),
    ("pycuda", "D11.gpu-control"),
    ("cupy", "D11.gpu-control"),
    ("logging", "D11.print"),
    ("warnings.warn", "D11.print"),
    ("time.", "D11.timing"),
    ("timeit", "D11.timing"),
)

# Imports that need no finding of their own (their dangerous members are judged where used).
KNOWN_MODULES = frozenset(
    {
        "torch", "math", "typing", "typing_extensions", "__future__", "dataclasses", "functools",
        "itertools", "collections", "numbers", "enum", "abc", "operator", "triton", "numpy", "contextlib",
        "warnings", "copy", "time", "os", "sys", "builtins", "random", "logging", "string", "struct",
        "cmath", "statistics", "types", "json",
    }
)  # fmt: skip

# Attributes whose assignment anywhere is tampering, by root module.
PROTECTED_ROOTS = frozenset(
    {
        "torch", "time", "sys", "builtins", "os", "math", "numpy", "random", "functools", "importlib",
        "gc", "inspect", "threading", "subprocess", "socket", "io", "json", "pickle", "contextlib",
        "operator", "itertools", "collections", "types", "triton", "warnings", "logging", "atexit",
        "timeit", "copy", "abc",
    }
)  # fmt: skip
# Attribute names that walk frames or code objects.
FRAME_ATTRS = frozenset(
    {
        "f_back", "f_locals", "f_globals", "f_builtins", "f_code", "tb_frame", "gi_frame", "cr_frame",
        "ag_frame", "__globals__", "__code__", "__closure__", "__subclasses__", "__builtins__", "__self__",
        "__func__", "__wrapped__", "__mro__", "__bases__", "__base__", "__dict__", "__class__",
    }
)  # fmt: skip
# Of FRAME_ATTRS, those that are ordinary in honest code when read on `self` or a local class.
BENIGN_DUNDERS = frozenset({"__class__", "__dict__", "__mro__", "__bases__", "__base__", "__wrapped__"})

GPU_CONTROL = (
    "torch.cuda.set_per_process_memory_fraction", "torch.cuda.reset_peak_memory_stats",
    "torch.cuda.reset_max_memory_allocated", "torch.cuda.reset_max_memory_cached",
    "torch.cuda.reset_accumulated_memory_stats", "torch.cuda.memory.set_per_process_memory_fraction",
    "torch.cuda.memory._set_allocator_settings", "torch.cuda.set_sync_debug_mode", "torch.cuda.cudart",
    "torch.cuda.memory.change_current_allocator", "torch.cuda.set_device", "torch.cuda.memory._record_memory",
    "torch.cuda.jiterator",
)  # fmt: skip
MEMORY_PROBE = (
    "torch.cuda.mem_get_info", "torch.cuda.memory_reserved", "torch.cuda.memory_allocated",
    "torch.cuda.max_memory_allocated", "torch.cuda.max_memory_reserved", "torch.cuda.memory_stats",
    "torch.cuda.caching_allocator_alloc", "torch.cuda.memory.", "torch.cuda.list_gpu_processes",
    "torch.cuda.memory_summary",
)  # fmt: skip
# set_* calls under torch that only touch thread-local or cosmetic state.
HARMLESS_SET = frozenset({"torch.set_grad_enabled", "torch.set_printoptions", "torch.set_autocast_enabled"})
STREAM_MAKERS = (
    "torch.cuda.Stream", "torch.cuda.ExternalStream", "torch.cuda.set_stream", "torch.Stream",
    "torch.cuda.streams.Stream", "torch.cuda.stream", "torch.cuda.StreamContext", "torch.get_device_module",
)  # fmt: skip
STREAM_JOIN_METHODS = frozenset({"wait_stream", "wait_event", "synchronize", "wait"})
GRAPH_NAMES = (
    "torch.cuda.CUDAGraph",
    "torch.cuda.graph",
    "torch.cuda.make_graphed_callables",
    "torch.cuda.graphs",
)
TIMER_FUNCS = frozenset({"elapsed_time"})
# Decorators that keep results keyed on arguments.
MEMO_DECORATORS = frozenset({"functools.lru_cache", "functools.cache", "functools.cached_property"})
TRITON_JIT = ("triton.jit", "triton.autotune", "triton.heuristics", "triton.language.jit")
