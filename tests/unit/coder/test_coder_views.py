"""The Coder's view rule (normalize.view_strides) against torch's: where torch's view fails, reshape copies,
and the Coder copies through its own identity kernel instead (a ViT's patches, attention heads)."""

from __future__ import annotations

import random

import torch

from stitchcuda.coder.synth.normalize import view_strides


def random_layout(rng: random.Random) -> torch.Tensor:
    t = torch.empty([rng.choice([1, 2, 3, 4]) for _ in range(rng.randint(1, 4))])
    order = list(range(t.dim()))
    rng.shuffle(order)
    t = t.permute(order)
    if rng.random() < 0.3 and t.shape[-1] > 1:
        t = t[..., ::2]
    return t


def random_shape(rng: random.Random, numel: int) -> list[int]:
    shape, rest = [], numel
    while rest > 1:
        f = rng.choice([d for d in range(2, rest + 1) if rest % d == 0])
        shape.append(f)
        rest //= f
    if rng.random() < 0.3:
        shape.insert(rng.randint(0, len(shape)), 1)
    return shape or [1]


def test_view_strides_agree_with_torch_on_random_layouts() -> None:
    rng = random.Random(0)
    copies = views = 0
    for _ in range(2000):
        t = random_layout(rng)
        new = random_shape(rng, t.numel())
        try:
            want: tuple[int, ...] | None = tuple(t.view(new).stride())
            views += 1
        except RuntimeError:
            want = None
            copies += 1
        assert view_strides(tuple(t.shape), tuple(t.stride()), tuple(new)) == want, (t.shape, t.stride(), new)
    assert copies > 100 and views > 100  # both outcomes exercised
