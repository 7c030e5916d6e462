"""D6 accounting of CUDA-graph replays in the candidate runner (logic only; the GPU corpus runs it for real)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import stitchcuda.verifier.harness as harness_pkg

sys.path.insert(0, str(Path(harness_pkg.__file__).parent))
runner: Any = importlib.import_module("candidate_runner")


class FakeGraph:
    """The three methods torch.cuda.CUDAGraph has that the runner wraps."""

    def __init__(self) -> None:
        self.replays = 0

    def capture_begin(self, *args: Any, **kwargs: Any) -> None:
        pass

    def capture_end(self) -> None:
        pass

    def replay(self) -> None:
        self.replays += 1


def test_a_replay_counts_the_extension_calls_its_capture_recorded():
    counter = [0]
    graph_cls = type("Graph", (FakeGraph,), {})
    runner.count_graph_replays(graph_cls, counter)
    with_ext, without_ext = graph_cls(), graph_cls()
    with_ext.capture_begin()
    counter[0] += 2  # two extension calls captured
    with_ext.capture_end()
    without_ext.capture_begin()
    without_ext.capture_end()  # a graph of torch ops only
    counter[0] = 0
    with_ext.replay()
    with_ext.replay()
    assert counter[0] == 4 and with_ext.replays == 2
    without_ext.replay()
    assert counter[0] == 4 and without_ext.replays == 1  # no extension work: still zero calls


def test_a_graph_never_captured_counts_nothing():
    counter = [0]
    graph_cls = type("Graph", (FakeGraph,), {})
    runner.count_graph_replays(graph_cls, counter)
    graph = graph_cls()
    graph.replay()
    assert counter == [0] and graph.replays == 1
