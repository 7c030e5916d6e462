"""Physics floor from measured ceilings, and the on-disk ceilings cache."""

from __future__ import annotations

from stitchcuda.verifier.ceilings import Ceilings, CeilingStore, physics_floor


def test_floor_is_the_larger_of_memory_and_compute_time():
    c = Ceilings(device="cuda", peak_copy_gbs=4000.0, dram_copy_gbs=4000.0, matmul_tflops={"float32": 50.0})
    gemm = physics_floor(c, flops=2 * 8192**3, nbytes=3 * 8192**2 * 4, dtype="float32")
    assert gemm.bound == "compute" and abs(gemm.floor_ms - 2 * 8192**3 / 50e12 * 1e3) < 1e-9
    ew = physics_floor(c, flops=0.0, nbytes=2 * 8192**2 * 4, dtype="float32")
    assert ew.bound == "memory" and abs(ew.floor_ms - 2 * 8192**2 * 4 / 4000e9 * 1e3) < 1e-12


def test_store_round_trip_and_merges_rates(tmp_path):
    store = CeilingStore(tmp_path)
    assert store.get("cpu") is None
    store.put(
        "cpu", {"peak_copy_gbs": 20.0, "dram_copy_gbs": 8.0, "matmul_tflops": {"float32": 0.1}}, "test cpu"
    )
    got = store.get("cpu")
    assert got is not None and got.peak_copy_gbs == 20.0 and got.rate("float32") == 0.1
    assert got.rate("float16") == 0.1  # falls back to fp32 when a dtype was not measured
