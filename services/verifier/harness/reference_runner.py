"""Runs the pristine reference in its own sandboxed process (stdlib + torch only).

It makes every input set from the seeds the parent sends (secret to the candidate), computes float32 and
float64 ground truth, times eager and torch.compile on the same rotating inputs, measures device ceilings
when asked, and sends everything back over the private channel. It never sees candidate code.
"""

# mypy: disable-error-code="no-untyped-call,no-any-return"

from __future__ import annotations

import contextlib
import copy
import importlib.util
import math
import os
import sys
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common
import turns
import wire


class StageError(Exception):
    def __init__(self, stage: str, exc: BaseException) -> None:
        super().__init__(f"{stage}: {exc}")
        self.stage = stage
        self.exc = exc


def main() -> None:
    args, job_file, out = common.start("StitchCUDA reference runner")
    header, payload = common.read_job(job_file)
    device = header["device"]
    work = header["work_dir"]
    ref_path = os.path.join(work, "reference.py")
    with open(ref_path, "w") as fh:
        fh.write(payload.decode())

    import torch

    common.ieee_fp32(torch)
    if header.get("threads"):
        torch.set_num_threads(int(header["threads"]))
    send = lambda h, p=b"": wire.write_frame(out, h, p, args.share, args.share_min)  # noqa: E731
    if device == "cuda" and not torch.cuda.is_available():
        send(
            {
                "kind": "error",
                "stage": "device",
                "message": "torch.cuda.is_available() is False in the sandbox",
            }
        )
        common.exit_now(out, 4)
    send({"kind": "info", **common.environment(device)})
    try:
        run(header, ref_path, device, send, args.turns)
    except StageError as err:
        line, code = common.where_in(err.exc, ref_path)
        send(
            {
                "kind": "error",
                "stage": err.stage,
                "message": common.error_line(err.exc),
                "line": line,
                "code": code,
                "traceback": "".join(traceback.format_exception(err.exc))[-4000:],
            }
        )
        common.exit_now(out, 3)
    send({"kind": "done", "nonce": header["nonce"]})
    common.exit_now(out, 0)


def load_module(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["reference"] = module
    spec.loader.exec_module(module)
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, name):
            raise AttributeError(f"the reference does not define {name}")
    return module


def rel_l2(a: Any, b: Any) -> float:
    import sketch

    return sketch.errors(a, b)[0]


def forward(model: Any, items: list[Any], device: str, host: bool = True) -> list[Any]:
    import torch

    with torch.no_grad():
        result = model(*common.to_device(items, device))
    if device == "cuda":
        torch.cuda.synchronize()
    outs = common.flatten(result)
    return common.to_cpu(outs) if host else outs


def forward64(model64: Any, items: list[Any], device: str, host: bool = True) -> list[Any]:
    import torch

    items64 = [
        x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
        for x in common.to_device(items, device)
    ]
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad():
            result = model64(*items64)
    finally:
        torch.set_default_dtype(old)
    outs = common.flatten(result)
    return common.to_cpu(outs) if host else outs


def make_set(
    module: Any, spec: dict[str, Any], made: dict[str, list[Any]], where: str
) -> tuple[list[Any], str]:
    """One input set, made on `where` when get_inputs can run with that default device, else on the CPU."""
    if where != "cpu":
        try:
            return common.make_inputs(module, spec, made, where), where
        except Exception:
            pass
    return common.make_inputs(module, spec, made), "cpu"


def nbytes(items: list[Any]) -> int:
    import torch

    return sum(x.numel() * x.element_size() for x in items if isinstance(x, torch.Tensor))


def ground_truth(
    ref32: list[Any], ref64: list[Any] | None, lean: dict[str, Any]
) -> tuple[list[Any], list[Any] | None]:
    """What the parent keeps of one set's results: whole tensors, or summaries of the large outputs
    (`lean["min_numel"]` elements and more), whose float64 target then lives in the summary."""
    import sketch

    if not any(sketch.wanted(t, int(lean.get("min_numel") or 0)) for t in ref32):
        return common.to_cpu(ref32), common.to_cpu(ref64) if ref64 is not None else None
    out32: list[Any] = []
    out64: list[Any] = []
    for i, a in enumerate(ref32):
        b = ref64[i] if ref64 is not None and i < len(ref64) else None
        if sketch.wanted(a, int(lean["min_numel"])):
            out32.append(sketch.reference_summary(a, b, lean))
            out64.append(None)
        else:
            out32.append(common.to_cpu([a])[0])
            out64.append(common.to_cpu([b])[0] if b is not None else None)
    return out32, out64 if ref64 is not None else None


def scaled_globals(module: Any) -> dict[str, int]:
    """Module-level integer dims that get_inputs reads, scaled x1.25+3 (odd, unseen shapes: D4)."""
    names = set(module.get_inputs.__code__.co_names)
    changed = {}
    for name in names:
        value = getattr(module, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 2:
            changed[name] = int(value * 1.25) + 3
    return changed


def run(header: dict[str, Any], ref_path: str, device: str, send: Any, gpu: turns.Turns) -> None:
    import torch

    # The GPU is shared with the node's other runs while this one works, and its alone while it times
    # (turns.py); a large problem's run keeps it alone throughout (its memory is most of the device's).
    work = turns.ALONE if header.get("gpu_alone") else turns.SHARED

    # Seconds spent per step (summed over the input sets), sent with the timing: where a run's time goes
    # ("turn": waiting for the GPU's turn).
    phases: dict[str, float] = {}
    clock_at = [common.now()]

    def lap(name: str) -> None:
        now = common.now()
        phases[name] = round(phases.get(name, 0.0) + now - clock_at[0], 4)
        clock_at[0] = now

    gpu.take(work)
    lap("turn")

    try:
        module = load_module(ref_path)
    except BaseException as exc:
        raise StageError("import", exc) from exc
    try:
        init_inputs = list(module.get_init_inputs())
        common.seed_all(header["init_seed"])
        model = module.Model(*init_inputs).to(device)
    except BaseException as exc:
        raise StageError("init", exc) from exc
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    try:
        model64: Any = copy.deepcopy(model).double()
    except Exception:
        model64 = None
    try:
        blob = wire.dumps({"init_inputs": init_inputs, "state": state})
        wire.loads(blob)
    except Exception as exc:
        raise StageError(
            "init-inputs", ValueError(f"init inputs or parameters cannot be sent: {exc}")
        ) from exc
    param_bytes = sum(v.numel() * v.element_size() for v in state.values())
    send({"kind": "problem", "param_bytes": param_bytes}, blob)
    lap("init")

    lean = header.get("lean") or {}
    out_of_memory = getattr(torch, "OutOfMemoryError", MemoryError)
    f64_on = [device]  # where the float64 twin runs: the CPU once the GPU had no room for it
    regen_bytes = int(lean.get("input_bytes") or 0)
    # Sets other sets derive from, and the timing pool, are kept; a large problem's others are not.
    keep = {s.get("base") for s in header["sets"]} | set(header["pool"]) | {header["sets"][0]["name"]}
    made: dict[str, list[Any]] = {}
    first_out: list[Any] | None = None
    counted: dict[str, Any] = {}
    # Whether the reference draws random numbers, and each set's forward seed (common.forward_seed).
    random = [False]
    forward_seeds: dict[str, int] = {}
    for spec in header["sets"]:
        name = spec["name"]
        essential = spec["kind"] == "plain"
        try:
            items, made_on = make_set(module, spec, made, str(lean.get("make_on") or "cpu"))
        except BaseException as exc:
            if essential:
                raise StageError("get_inputs", exc) from exc
            send({"kind": "set", "name": name, "skipped": f"cannot make inputs: {common.error_line(exc)}"})
            continue
        regen = bool(regen_bytes) and nbytes(items) >= regen_bytes
        if name in keep or not regen:
            made[name] = items
        lap("inputs")
        seed = forward_seeds[name] = common.forward_seed(spec["seed"])
        try:
            common.seed_all(seed)
            if first_out is None:  # the first set's forward also counts FLOPs and memory (`cost`)
                ref32, counted = counted_forward(model, items, device, seed, host=not lean)
            else:
                ref32 = forward(model, items, device, host=not lean)
        except BaseException as exc:
            if essential:
                raise StageError("forward", exc) from exc
            send({"kind": "set", "name": name, "skipped": f"reference fails: {common.error_line(exc)}"})
            continue
        if first_out is None:
            first_out = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in ref32]
            random[0] = determinism(model, items, ref32, seed, device, not lean)
            if random[0]:
                # Its float64 twin would draw other numbers (a double tensor's draws differ): the float32
                # run under the same seed is the ground truth.
                model64 = None
        lap("forward")
        ref64, note = None, ""
        if random[0]:
            note = "random reference: ground truth is its float32 run with the call's seed"
        if model64 is not None:
            try:
                ref64 = forward64(model64, items, f64_on[0], host=not lean)
            except out_of_memory:
                # The float64 twin of a large problem (twice the float32 bytes) may not fit beside the
                # float32 run on the GPU: the CPU computes it then (slower, but the problem verifies).
                if f64_on[0] == "cpu":
                    raise
                f64_on[0] = "cpu"
                ref32 = common.to_cpu(ref32)
                torch.cuda.empty_cache()
                model64 = model64.to("cpu")
                note = "float64 ground truth computed on the CPU: the GPU had no room for it"
                ref64 = forward64(model64, items, "cpu", host=not lean)
            except Exception as exc:
                note = f"float64 evaluation failed: {common.error_line(exc, 200)}"
        errors = []
        if ref64 is not None:
            errors = [
                rel_l2(a, b) if isinstance(a, torch.Tensor) and a.is_floating_point() else 0.0
                for a, b in zip(ref32, ref64, strict=True)
            ]
        lap("float64")
        if lean:
            try:
                ref32, ref64 = ground_truth(ref32, ref64, lean)
            except out_of_memory:  # the same summaries from host copies, when the GPU is full
                torch.cuda.empty_cache()
                ref32 = common.to_cpu(ref32)
                ref64 = common.to_cpu(ref64) if ref64 is not None else None
                torch.cuda.empty_cache()
                ref32, ref64 = ground_truth(ref32, ref64, lean)
            lap("summaries")
        head = {
            "kind": "set",
            "name": name,
            "err_ref32": errors,
            "note": note,
            "input_bytes": nbytes(items),
            "made_on": made_on,
            "random": random[0],
        }
        # A large input set is not sent: the candidate's runner makes it again from the same seed.
        sent = None if regen else common.to_cpu(items)
        if regen:
            head["regen"] = True
        del items
        send(head, wire.dumps({"inputs": sent, "ref32": ref32, "ref64": ref64}))
        del ref32, ref64
        lap("send")

    offshape = header.get("offshape")
    if offshape:
        reference_offshape(module, model, init_inputs, offshape, header, device, send, random[0])
        lap("offshape")

    pool = [common.to_device(made[n], device) for n in header["pool"] if n in made]
    # A random reference's timed calls are seeded as its checked ones are, and as the candidate's are.
    seeds = [forward_seeds[n] for n in header["pool"] if n in made] if random[0] else []
    send({"kind": "cost", **cost(made[header["sets"][0]["name"]], first_out or [], param_bytes, counted)})
    clock = common.Clock(device)
    timing: dict[str, Any] = {"kind": "timing"}
    lap("cost")
    # The compile first (host work, holding no turn), then both timings in one turn alone: a turn alone
    # waits for every run working on the device, so a run asks for it once.
    compiled = None
    if header.get("compile"):
        try:
            compiled = torch.compile(model)
            t0 = common.now()
            # The slot is taken back (lending_slot's end) before the turn held before (compiling's end).
            keep = work == turns.ALONE
            with compiling(gpu, keep=keep), lending_slot(gpu, header, timing, keep=keep):
                with torch.no_grad():
                    if seeds:
                        common.seed_all(seeds[0])
                    compiled(*pool[0])
                clock.sync()
            timing["compile_seconds"] = common.now() - t0 - float(timing.get("slot_wait_s") or 0.0)
        except Exception as exc:
            compiled = None
            timing["compile_error"] = common.error_line(exc, 300)
        lap("compile")
    gpu.take(turns.ALONE)
    lap("turn")
    timing["eager"] = time_model(model, pool, header, clock, seeds)
    lap("eager")
    if compiled is not None:
        try:
            timing["compile"] = time_model(compiled, pool, header, clock, seeds)
        except Exception as exc:
            timing["compile_error"] = common.error_line(exc, 300)
        lap("compile")
    timing["phases"] = phases
    send(timing)
    if header.get("measure_ceilings"):
        gpu.take(turns.ALONE)
        send({"kind": "ceilings", **measure_ceilings(device, header["measure_ceilings"], clock)})
    gpu.release()


@contextlib.contextmanager
def lending_slot(gpu: turns.Turns, header: dict[str, Any], timing: dict[str, Any], *, keep: bool) -> Any:
    """The torch.compile baseline's first call gives the node's GPU slot to another verification (a large
    model compiles for minutes, host work), then takes it back before the timings, waiting at most the
    header's `slot_wait_s`. Not where the run keeps the device alone (`keep`): its memory would not fit
    beside another run's, nor while it holds a turn through the compile (a torch without the compile's
    hooks): the slot's holder could never take the turn it needs to finish. The wait holds no turn, for the
    same reason. The wait is in the timing's `slot_wait_s`; a wait that ran out in `slot_note`."""
    lent = not keep and not gpu.held and gpu.lend_slot()
    try:
        yield
    finally:
        if lent:
            t0 = common.now()
            held = gpu.held
            gpu.release()
            if not gpu.take_slot(float(header.get("slot_wait_s") or 0.0)):
                timing["slot_note"] = "timed without the node's GPU slot: its holder went on too long"
            if held:
                gpu.take(held)
            timing["slot_wait_s"] = round(common.now() - t0, 3)


@contextlib.contextmanager
def compiling(gpu: turns.Turns, *, keep: bool = False) -> Any:
    """The torch.compile baseline's first call: mostly host work (tracing, code generation, kernel
    builds), done holding no turn so other runs' timings go on meanwhile. Its GPU work takes one: the
    compiled graph's runs share the device, the autotuner's timings of kernel variants have it alone.
    Where this torch lacks either hook, or the run keeps the device alone (`keep`), the whole first call
    has the device alone."""
    hooks = [] if keep else _compile_hooks()
    if not hooks:
        with gpu.holding(turns.ALONE):
            yield
        return
    before = gpu.held
    for cls, name, mode, original in hooks:
        setattr(cls, name, _in_turn(gpu, original, mode))
    gpu.release()
    try:
        yield
    finally:
        # The timed calls run the compiled graph as torch made it, without a wrapper.
        for cls, name, _, original in hooks:
            setattr(cls, name, original)
        if before:
            gpu.take(before)


def _compile_hooks() -> list[tuple[Any, str, str, Any]]:
    """(class, method name, turn, method) of inductor's graph runs and its autotuner's timings; [] where
    this torch lacks either."""
    try:
        from torch._inductor.output_code import CompiledFxGraph
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner

        return [
            (CompiledFxGraph, "__call__", turns.SHARED, CompiledFxGraph.__call__),
            (CachingAutotuner, "benchmark_all_configs", turns.ALONE, CachingAutotuner.benchmark_all_configs),
        ]
    except Exception:
        return []


def _in_turn(gpu: turns.Turns, original: Any, mode: str) -> Any:
    """`original` holding the turn in `mode`, unless the turn held already covers it (a graph's run holds
    the device shared; the autotuning inside it takes it alone, then gives it back)."""

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        if gpu.held in (mode, turns.ALONE):
            return original(self, *args, **kwargs)
        with gpu.holding(mode):
            return original(self, *args, **kwargs)

    return wrapped


def reference_offshape(
    module: Any,
    model: Any,
    init_inputs: list[Any],
    spec: dict[str, Any],
    header: dict[str, Any],
    device: str,
    send: Any,
    random: bool = False,
) -> None:
    import torch

    changed = scaled_globals(module)
    if not changed:
        send({"kind": "set", "name": spec["name"], "skipped": "no module-level dims to scale"})
        return
    old = {k: getattr(module, k) for k in changed}
    try:
        for k, v in changed.items():
            setattr(module, k, v)
        new_init = list(module.get_init_inputs())
        init_changed = new_init != init_inputs
        model2 = model
        if init_changed:
            common.seed_all(header["init_seed"])
            model2 = module.Model(*new_init).to(device)
        items = common.make_inputs(module, {"kind": "plain", "seed": spec["seed"], "name": spec["name"]}, {})
        common.seed_all(common.forward_seed(spec["seed"]))
        ref32 = forward(model2, items, device)
        ref64 = None
        try:
            if not random:
                ref64 = forward64(copy.deepcopy(model2).double(), items, device)
        except Exception:
            ref64 = None
        errors = []
        if ref64 is not None:
            errors = [
                rel_l2(a, b) if isinstance(a, torch.Tensor) and a.is_floating_point() else 0.0
                for a, b in zip(ref32, ref64, strict=True)
            ]
        send(
            {
                "kind": "set",
                "name": spec["name"],
                "err_ref32": errors,
                "dims": changed,
                "init_changed": init_changed,
            },
            wire.dumps(
                {
                    "inputs": items,
                    "ref32": ref32,
                    "ref64": ref64,
                    "init_inputs": new_init,
                    # The candidate gets these parameters off-shape too, as it does on-shape.
                    "state": {k: v.detach().cpu() for k, v in model2.state_dict().items()},
                }
            ),
        )
    except Exception as exc:
        send(
            {
                "kind": "set",
                "name": spec["name"],
                "skipped": f"reference fails off-shape: {common.error_line(exc)}",
            }
        )
    finally:
        for k, v in old.items():
            setattr(module, k, v)


def time_model(
    model: Any, pool: list[list[Any]], header: dict[str, Any], clock: common.Clock, seeds: list[int]
) -> dict[str, Any]:
    """The timed calls; `seeds` (a random reference's, one per pool set): each call is seeded first."""
    import torch

    def call(i: int) -> Any:
        if seeds:  # torch.manual_seed seeds every device, as the candidate's runner does per call
            torch.manual_seed(seeds[i % len(seeds)])
        return model(*pool[i % len(pool)])

    with torch.no_grad():
        for i in range(int(header["warmup"])):
            call(i)
        device_ms, wall_ms = clock.time_calls(call, int(header["iterations"]))
    return {"device": common.stats(device_ms), "wall": common.stats(wall_ms)}


def determinism(model: Any, items: list[Any], ref32: list[Any], seed: int, device: str, host: bool) -> bool:
    """Whether the reference draws random numbers: the same inputs under another seed give other outputs
    (dropout in training mode, torch.randn in forward) and under the same seed the same ones. Outputs that
    differ under the same seed are a broken reference (StageError)."""
    import torch

    def worst(outs: list[Any]) -> float:
        return max(
            (rel_l2(a, b) for a, b in zip(outs, ref32, strict=True) if isinstance(a, torch.Tensor)),
            default=0.0,
        )

    common.seed_all(seed ^ 0x5DEECE66D)
    other = worst(forward(model, items, device, host=host))
    if other <= 1e-5:
        return False
    common.seed_all(seed)
    same = worst(forward(model, items, device, host=host))
    if not same <= 1e-5:
        raise StageError(
            "determinism",
            RuntimeError(
                f"the reference gives different outputs for the same inputs, even with torch's random "
                f"generator seeded the same (rel {same:.2e})"
            ),
        )
    return True


def counted_forward(
    model: Any, items: list[Any], device: str, seed: int, host: bool = True
) -> tuple[list[Any], dict[str, Any]]:
    """The first set's `forward`, counted as it runs: its FLOPs (torch's flop counter) and the device memory
    it takes beyond its inputs and parameters (D10's allowance). No second forward, no second copy of the
    set."""
    import torch

    xs = common.to_device(items, device)
    before = 0
    if device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    counted: dict[str, Any] = {"flops": 0.0, "note": ""}
    try:
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with counter:
            outs = forward(model, xs, device, host)
        counted["flops"] = float(counter.get_total_flops())
    except Exception as exc:  # the counter's failure, or the model's own (raised again below)
        counted["note"] = f"flop counter failed: {common.error_line(exc, 200)}"
        common.seed_all(seed)
        outs = forward(model, xs, device, host)
    if device == "cuda":
        counted["forward_peak"] = max(0, torch.cuda.max_memory_allocated() - before)
    return outs, counted


def cost(items: list[Any], outs: list[Any], param_bytes: int, counted: dict[str, Any]) -> dict[str, Any]:
    """FLOPs and the forward's device memory (counted_forward), and the minimum bytes any implementation must
    move."""
    import torch

    nbytes = param_bytes
    for t in list(items) + list(outs):
        if isinstance(t, torch.Tensor):
            nbytes += t.numel() * t.element_size()
    dtype = next((str(t.dtype) for t in items if isinstance(t, torch.Tensor) and t.is_floating_point()), "")
    return {
        "flops": float(counted.get("flops", 0.0)),
        "bytes": float(nbytes),
        "forward_peak": int(counted.get("forward_peak", 0)),
        "dtype": dtype,
        "note": str(counted.get("note", "")),
    }


def measure_ceilings(device: str, dtypes: list[str], clock: common.Clock) -> dict[str, Any]:
    """Best copy bandwidth and matmul rate on this device (the physics floor's denominators)."""
    import torch

    def best(fn: Any, reps: int) -> float:
        fn()
        clock.sync()
        times = []
        for _ in range(reps):
            t0 = common.now()
            fn()
            clock.sync()
            times.append(common.now() - t0)
        return min(times)

    sizes = [1 << 18, 1 << 22, 1 << 26] if device == "cpu" else [1 << 24, 1 << 28, 1 << 30]
    copy_gbs = []
    for n in sizes:
        a = torch.ones(n // 4, device=device)
        b = torch.empty_like(a)
        seconds = best(lambda a=a, b=b: b.copy_(a), 5 if n < (1 << 26) else 3)
        copy_gbs.append(2 * n / seconds / 1e9)
        del a, b
    rates: dict[str, float] = {}
    dims = [256, 512, 1024] if device == "cpu" else [2048, 4096, 8192]
    for name in dtypes:
        dtype = getattr(torch, name.replace("torch.", ""), None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            continue
        if device == "cpu" and dtype in (torch.float16, torch.bfloat16):
            continue
        top = 0.0
        for n in dims:
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            seconds = best(lambda a=a, b=b: a @ b, 3)
            top = max(top, 2 * n**3 / seconds / 1e12)
        rates[str(dtype).replace("torch.", "")] = top
    return {
        "peak_copy_gbs": max(copy_gbs),
        "dram_copy_gbs": copy_gbs[-1],
        "matmul_tflops": rates,
        "finite": all(math.isfinite(x) for x in copy_gbs),
    }


if __name__ == "__main__":
    main()
