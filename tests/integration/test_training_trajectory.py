"""A real embedded job (`stitchcuda optimize` on the CPU) records its trajectory, and the dataset builder turns
it into generate and optimize examples with the Coder's prompts."""

import json

import pytest

from stitchcuda.coder.llm.client import ScriptedClient
from stitchcuda.coder.llm.coder import LLMCoder
from stitchcuda.coder.llm.parse import parse_answer
from stitchcuda.training import datasets as ds
from tests.conftest import PROBLEMS
from tests.integration.test_cli import stitchcuda

pytestmark = pytest.mark.slow


def test_an_optimize_job_records_a_trajectory_that_builds_examples(tmp_path):
    out = tmp_path / "job"
    proc = stitchcuda("optimize", str(PROBLEMS / "02_swish_clamp.py"), "--device", "cpu", "--rounds", "1",
                      "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    trajectory = json.loads((out / "trajectory.json").read_text())
    report = json.loads((out / "report.json").read_text())
    reference = (PROBLEMS / "02_swish_clamp.py").read_text()
    assert trajectory["reference"] == reference and trajectory["problem"] == "02_swish_clamp"
    assert trajectory["state"] == "succeeded" == report["state"]
    assert trajectory["plans"] and trajectory["plans"][0]["plan"]["subtasks"]
    rounds = trajectory["rounds"]
    # Every verdict the report shows is in the trajectory, with the candidate it judged.
    assert [(r["round"], r["index"], r["accepted"]) for r in rounds] == [
        (row["round"], row["index"], row["accepted"]) for row in report["rounds"]
    ]
    assert rounds[0]["skill"] == "generate" and rounds[1]["skill"] == "optimize"
    assert rounds[1]["parent_id"] == rounds[0]["candidate_id"]
    assert all(r["feedback"] and r["candidate"]["files"] for r in rounds)

    builder = ds.ExampleBuilder(LLMCoder(ScriptedClient([]), structured=True))
    examples = list(builder.from_trajectories(ds.read_trajectories([tmp_path])))
    generate = [e for e in examples if e.skill == "generate"]
    optimize = [e for e in examples if e.skill == "optimize"]
    assert len(generate) == 1 and len(optimize) == 1
    assert generate[0].problem_hash == ds.problem_hash(reference)
    # The accepted round-0 program is the generate example's answer, in a form the Coder parses.
    assert rounds[0]["accepted"] and generate[0].completion is not None
    files = parse_answer(generate[0].completion, backend="cpu").files
    assert files == {f["path"]: f["content"] for f in rounds[0]["candidate"]["files"]}
    # The optimize prompt shows the previous program and the Verifier's feedback on it.
    user = optimize[0].prompt[1]["content"]
    assert "## Verifier feedback" in user and rounds[0]["feedback"].splitlines()[0] in user
    assert rounds[0]["candidate"]["files"][0]["content"].splitlines()[0] in user
    assert optimize[0].feedback and optimize[0].previous_speedup == pytest.approx(
        rounds[0]["speedup_vs_eager"]
    )
    better = rounds[1]["accepted"] and rounds[1]["speedup_vs_eager"] > rounds[0]["speedup_vs_eager"]
    assert (optimize[0].completion is not None) == better
    # Reading the same job twice gives no duplicate examples.
    again = list(builder.from_trajectories(ds.read_trajectories([tmp_path, out / "trajectory.json"])))
    assert len(again) == len(examples)
