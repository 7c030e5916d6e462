"""Lowers attention to the IR: nn.MultiheadAttention as its projections (library linears) around the same
attention core as scaled_dot_product_attention (batched GEMMs around one fused softmax row kernel)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from stitchcuda.coder.synth.ir import (
    HOST,
    LIB,
    Const,
    Op,
    Ref,
    Unsupported,
    Value,
    broadcast_shapes,
    contiguous_strides,
)

if TYPE_CHECKING:
    from stitchcuda.coder.synth.normalize import Normalizer
    from stitchcuda.coder.synth.trace import TracedNode

MHA_ARGS = ["query", "key", "value", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights",
            "is_causal"]  # fmt: skip


def lib_shaped(
    n: Normalizer, fn: str, args: list[Any], attrs: dict[str, Any], shape: tuple[int, ...], origin: str
) -> Ref:
    """A library op whose result is an intermediate of the node (its shape given, not the node's)."""
    ident = n.fresh(origin)
    n.g.add_value(Value(ident, "tensor", shape, contiguous_strides(shape)))
    n.g.add_op(Op(LIB, fn, ident, args, attrs, origin=origin))
    return Ref(ident)


def attention_probs(n: Normalizer, q: Ref, k: Ref, scale: float | None, causal: bool, origin: str) -> Ref:
    """softmax(q k^T * scale [causal]) over the last dim: one GEMM and one fused row kernel."""
    qs, ks = n.shape_of(q), n.shape_of(k)
    kt_shape = (*ks[:-2], ks[-1], ks[-2])
    kt = n.view_op("transpose", k, {"args": [Const(-2), Const(-1)], "kwargs": {}}, kt_shape, origin)
    batch = broadcast_shapes(qs[:-2], ks[:-2])
    scores = lib_shaped(n, "matmul", [q, kt], {"causal": causal}, (*batch, qs[-2], ks[-2]), origin)
    if scale is None:
        # The default scale reads the head size at run time, as torch does.
        e = n.fresh(origin)
        n.g.add_value(Value(e, "int", const=qs[-1]))
        n.g.add_op(Op(HOST, "size", e, [q, Const(-1)], origin=origin))
        root = n.fresh(origin)
        n.g.add_value(Value(root, "float", const=math.sqrt(qs[-1])))
        n.g.add_op(Op(HOST, "sqrt", root, [Ref(e)], origin=origin))
        scaled = n.emit_ew("div", [scores, Ref(root)], [], origin)
    else:
        scaled = n.emit_ew("mul", [scores, Const(float(scale))], [], origin)
    return n.softmax_of(scaled, -1, origin, log=False)


def _transpose01(n: Normalizer, x: Ref, origin: str) -> Ref:
    s = n.shape_of(x)
    return n.view_op(
        "transpose", x, {"args": [Const(0), Const(1)], "kwargs": {}}, (s[1], s[0], *s[2:]), origin
    )


def _narrow(n: Normalizer, x: Ref, dim: int, start: int, length: int, origin: str) -> Ref:
    shape = list(n.shape_of(x))
    shape[dim] = length
    args = [Const(dim), Const(start), Const(length)]
    return n.view_op("narrow", x, {"args": args, "kwargs": {}}, tuple(shape), origin)


def _heads(n: Normalizer, x: Ref, heads: int, origin: str) -> Ref:
    """(T, N, E) -> (N * heads, T, E / heads), as torch splits the heads; T is read at run time."""
    t, batch, e = n.shape_of(x)
    steps = n.fresh(origin)
    n.g.add_value(Value(steps, "int", const=t))
    n.g.add_op(Op(HOST, "size", steps, [x, Const(0)], origin=origin))
    hd = e // heads
    split = n.view_op(
        "reshape",
        x,
        {"args": [Ref(steps), Const(-1), Const(hd)], "kwargs": {}},
        (t, batch * heads, hd),
        origin,
    )
    return _transpose01(n, split, origin)


def lower_multihead_attention(
    n: Normalizer, node: TracedNode, args: list[Any], kwargs: dict[str, Any]
) -> None:
    """nn.MultiheadAttention without masks: in-projection (one linear when query, key and value are the
    same tensor), per-head attention, out-projection. The module's second result, the attention weights,
    is not produced: an error only if the forward uses it."""
    mod = node.module or {}
    a = mod.get("attrs", {})
    params = mod.get("params", {})
    got = dict(zip(MHA_ARGS, args, strict=False)) | kwargs
    for key in ("key_padding_mask", "attn_mask"):
        if got.get(key) is not None:
            raise Unsupported(f"{node.name}: MultiheadAttention with a {key}")
    if got.get("is_causal") is not None and n.literal(got["is_causal"]):
        raise Unsupported(f"{node.name}: MultiheadAttention with is_causal")
    if "in_proj_weight" not in params:
        raise Unsupported(f"{node.name}: MultiheadAttention with separate key and value sizes")
    if "bias_k" in params or a.get("add_zero_attn"):
        raise Unsupported(f"{node.name}: MultiheadAttention with add_bias_kv or add_zero_attn")
    if a.get("dropout", 0.0) and mod.get("training"):
        raise Unsupported(f"{node.name}: attention dropout in training mode is random")
    q, k, v = got["query"], got["key"], got["value"]
    if not all(n.is_tensor(t) and len(n.shape_of(t)) == 3 for t in (q, k, v)):
        raise Unsupported(f"{node.name}: MultiheadAttention on inputs that are not batched 3-D tensors")
    origin = node.name
    embed, heads = int(a["embed_dim"]), int(a["num_heads"])
    w_in = n.module_param(node, "in_proj_weight")
    b_in = n.module_param(node, "in_proj_bias")
    assert w_in is not None
    w_out = n.param_ref(f"{node.target}.out_proj.weight", (embed, embed))
    b_out = n.param_ref(f"{node.target}.out_proj.bias", (embed,)) if b_in is not None else None
    batch_first = bool(a.get("batch_first"))
    if batch_first:
        same = q.id == k.id == v.id
        q = _transpose01(n, q, origin)
        k, v = (q, q) if same else (_transpose01(n, k, origin), _transpose01(n, v, origin))

    def project(x: Ref, w: Ref, b: Ref | None, out: int) -> Ref:
        t, batch, _ = n.shape_of(x)
        operands = [x, w] + ([b] if b is not None else [])
        return lib_shaped(n, "linear", operands, {"bias": b is not None}, (t, batch, out), origin)

    if q.id == k.id == v.id:
        # Self-attention: one GEMM for the three projections, split along its last dim.
        qkv = project(q, w_in, b_in, 3 * embed)
        qp, kp, vp = (_narrow(n, qkv, 2, i * embed, embed, origin) for i in range(3))
    else:
        qp, kp, vp = (
            project(
                x,
                _narrow(n, w_in, 0, i * embed, embed, origin),
                _narrow(n, b_in, 0, i * embed, embed, origin) if b_in is not None else None,
                embed,
            )
            for i, x in enumerate((q, k, v))
        )
    qh, kh, vh = (_heads(n, x, heads, origin) for x in (qp, kp, vp))
    probs = attention_probs(n, qh, kh, 1.0 / math.sqrt(embed // heads), False, origin)
    lanes, t, hd = n.shape_of(qh)
    ctx = lib_shaped(n, "matmul", [probs, vh], {}, (lanes, t, hd), origin)
    merged = _transpose01(n, ctx, origin)  # (T, N * heads, hd)
    steps = n.fresh(origin)
    n.g.add_value(Value(steps, "int", const=t))
    n.g.add_op(Op(HOST, "size", steps, [merged, Const(0)], origin=origin))
    batch = lanes // heads
    merged = n.view_op(
        "reshape",
        merged,
        {"args": [Ref(steps), Const(-1), Const(embed)], "kwargs": {}},
        (t, batch, embed),
        origin,
    )
    out = project(merged, w_out, b_out, embed)
    if batch_first:
        out = _transpose01(n, out, origin)
    n.g.add_value(Value(node.name, "list", const=[out.id, None]))
    n.g.add_op(Op(HOST, "tuple", node.name, [out, "MultiheadAttention's attention weights"], origin=origin))
