"""Breadth of the lowerings: one reference with norms, reductions over leading and trailing dims,
arg-reductions, pooling variants, views, chunks and many activations, synthesized for both back ends
and (slow) compiled and compared with the reference on fresh inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from synth_build import load_program

from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.candidate import validate

SOURCE = (Path(__file__).with_name("coder_kitchen_sink.py")).read_text()


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer(in_process=True)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_output_is_synthesized(synth: Synthesizer, device: str) -> None:
    synthesis = synth.synthesize(SOURCE, None, variant=Variant(), device=device)
    validate(to_candidate(synthesis))
    kinds = {k.split(":")[1].split()[0] for k in synthesis.kernels}
    assert kinds == {"pointwise", "row", "pool"}
    # On CUDA its 45 launches replay from a CUDA graph (synthesizer.graph_pays).
    call = "self._stitch_replay([x, y], [" if device == "cuda" else "ext.forward(x, y, "
    assert call in synthesis.files["model_new.py"]


def test_fusion_none_is_also_complete(synth: Synthesizer) -> None:
    fused = synth.synthesize(SOURCE, None, variant=Variant(), device="cpu")
    split = synth.synthesize(SOURCE, None, variant=Variant(fusion="none"), device="cpu")
    assert len(split.kernels) > len(fused.kernels)


@pytest.mark.slow
@pytest.mark.parametrize("variant", [Variant(), Variant(fusion="none")])
def test_compiled_program_matches_every_output(synth: Synthesizer, variant: Variant) -> None:
    synthesis = synth.synthesize(SOURCE, None, variant=variant, device="cpu")
    mn = load_program(synthesis)
    ns: dict[str, object] = {"__name__": "reference"}
    exec(compile(SOURCE, "reference.py", "exec"), ns)
    torch.manual_seed(0)
    ref = ns["Model"]()  # type: ignore[operator]
    torch.manual_seed(0)
    new = mn["ModelNew"]()  # type: ignore[operator]
    for seed in (3, 4):
        torch.manual_seed(seed)
        xs = ns["get_inputs"]()  # type: ignore[operator]
        with torch.no_grad():
            want64 = ref.double()(*[x.double() for x in xs])
            ref.float()
            got = new(*xs)
        assert len(got) == len(want64)
        for i, (g, w) in enumerate(zip(got, want64, strict=True)):
            assert g.shape == w.shape, (i, g.shape, w.shape)
            if not w.dtype.is_floating_point:
                assert torch.equal(g, w), f"output {i} differs"
                continue
            assert g.dtype == torch.float32
            rel = ((g.double() - w).norm() / w.norm()).item()
            assert rel < 1e-5, f"output {i}: relative L2 error {rel:.2e}"
