"""Atomic-skill examples from the problem suite, the evaluation split, JSONL/datasets output, the run config."""

import json
from pathlib import Path

import pytest

from stitchcuda.coder.llm.client import ScriptedClient
from stitchcuda.coder.llm.coder import LLMCoder
from stitchcuda.coder.llm.parse import parse_answer
from stitchcuda.shared.errors import InvalidRequest
from stitchcuda.training import datasets as ds
from stitchcuda.training.config import ConfigError, load_config
from tests.conftest import PROBLEMS, REPO


def plain_builder() -> ds.ExampleBuilder:
    return ds.ExampleBuilder(LLMCoder(ScriptedClient([]), structured=True))


def test_suite_examples_are_the_prompts_the_serving_coder_sends():
    suite = ds.load_suite(PROBLEMS)
    names = {p.name for p in suite}
    assert len(suite) == len(list(PROBLEMS.glob("[0-9]*.py"))) and "06_gemm_bias_relu" in names
    examples = list(plain_builder().from_suite(suite, target="cpu"))
    assert [e.problem for e in examples] == [p.name for p in suite]
    # The Coder, asked for a program for one problem, sends exactly the example's prompt.
    client = ScriptedClient(["not a program"])
    coder = LLMCoder(client, structured=True)
    gemm = next(p for p in suite if p.name == "06_gemm_bias_relu")
    coder.generate(gemm.source, None, target="cpu", samples=1)
    example = next(e for e in examples if e.problem == "06_gemm_bias_relu")
    assert client.requests[0].messages == example.prompt
    assert example.skill == "generate" and example.completion is None
    assert "class Model" in example.prompt[1]["content"] and example.reference == gemm.source


def test_kernelbench_levels_are_read_in_place():
    kernelbench = REPO.parent / "shared" / "kernelbench"
    if not kernelbench.is_dir():
        pytest.skip("no ../shared/kernelbench beside the checkout")
    level3 = ds.load_suite(kernelbench, "level3/*.py")
    assert level3 and {p.level for p in level3} == {"level3"}
    assert all(Path(p.path).is_relative_to(kernelbench) for p in level3)


def test_split_keeps_renamed_and_reformatted_eval_problems_out(tmp_path):
    suite = ds.load_suite(PROBLEMS)
    evaluation = [p for p in suite if p.name in ("04_softmax", "05_layernorm")]
    softmax = next(p for p in evaluation if p.name == "04_softmax").source
    # The same program under another name, reformatted, with its comments and docstring changed.
    disguised = "# copied in\n" + softmax.replace('"""', '"""Renamed: ', 1).replace("\n\n\n", "\n\n")
    # A real change to what the program does is a different problem.
    changed = (
        softmax.replace("dim=", "dim=-1 if False else ", 1) if "dim=" in softmax else softmax + "\nX = 1\n"
    )
    (tmp_path / "zz_disguised.py").write_text(disguised)
    (tmp_path / "zz_changed.py").write_text(changed)
    extra = ds.load_suite(tmp_path)
    assert ds.problem_hash(disguised) == ds.problem_hash(softmax) != ds.problem_hash(changed)

    examples = list(plain_builder().from_suite(suite + extra, target="cpu"))
    split = ds.split_out(examples, evaluation)
    held = {e.problem for e in split.held_out}
    assert held == {"04_softmax", "05_layernorm", "zz_disguised"}
    assert "zz_changed" in {e.problem for e in split.train}
    assert len(split.train) + len(split.held_out) == len(examples)
    # Reference sources work as the evaluation set too.
    assert {e.problem for e in ds.split_out(examples, [softmax]).held_out} == {"04_softmax", "zz_disguised"}


def test_jsonl_and_dataset_rows_are_chat_format(tmp_path):
    examples = list(plain_builder().from_suite(ds.load_suite(PROBLEMS)[:3], target="cuda"))
    path = tmp_path / "train.jsonl"
    assert ds.write_jsonl(examples, path) == 3
    rows = ds.read_jsonl(path)
    assert [r["prompt"][0]["role"] for r in rows] == ["system"] * 3
    assert all(r["prompt"][1]["role"] == "user" and r["target"] == "cuda" for r in rows)
    assert "CUDA" in rows[0]["prompt"][0]["content"]
    pytest.importorskip("datasets")
    dataset = ds.to_dataset(rows)
    assert len(dataset) == 3 and {"prompt", "reference", "skill", "problem_hash"} <= set(dataset.column_names)


def test_answer_text_is_what_the_coder_parses():
    from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
    from stitchcuda.coder.synth.variants import Variant

    source = next(PROBLEMS.glob("02_*.py")).read_text()
    candidate = to_candidate(Synthesizer().synthesize(source, None, variant=Variant(), device="cpu"))
    parsed = parse_answer(ds.answer_text(candidate), backend="cpu")
    assert parsed.files == {f.path: f.content for f in candidate.files}
    assert list(parsed.build.sources) == list(candidate.build.sources)


BASE = """
model:
  name_or_path: tiny
data:
  suites: [problems]
generation:
  backend: transformers
  num_generations: 4
trainer:
  per_device_train_batch_size: 4
  use_cpu: true
"""


@pytest.mark.parametrize(
    ("text", "suffix", "message"),
    [
        (
            BASE.replace("num_generations: 4", "num_generations: 3"),
            ".yaml",
            "multiple of generation.num_generations",
        ),
        (BASE + "  learning_rat: 0.1\n", ".yaml", "trainer.learning_rat: Extra inputs are not permitted"),
        (
            BASE.replace("suites: [problems]", "skills: [generate]"),
            ".yaml",
            "give at least one of data.jsonl",
        ),
        (BASE.replace("backend: transformers", "backend: vllm_server"), ".yaml", "use_cpu needs"),
        (BASE.replace("tiny", "tiny\n  dtype: float8"), ".yaml", "model.dtype: Input should be"),
        ("[model\nname_or_path = 1", ".toml", "not valid TOML"),
        ("model: [1, 2", ".yaml", "not valid YAML"),
        ("x = 1", ".ini", "unknown config format"),
    ],
)
def test_config_errors_name_the_file_and_the_field(tmp_path, text, suffix, message):
    path = tmp_path / f"run{suffix}"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert message in str(err.value) and str(path) in str(err.value)
    assert isinstance(err.value, InvalidRequest)


def test_config_paths_are_relative_to_the_file_and_the_examples_validate(tmp_path):
    (tmp_path / "run.toml").write_text(
        '[model]\nname_or_path = "tiny"\n[data]\nsuites = ["problems"]\n'
        '[generation]\nbackend = "transformers"\nnum_generations = 2\n[trainer]\nuse_cpu = true\n'
        "per_device_train_batch_size = 2\n"
    )
    config = load_config(tmp_path / "run.toml")
    assert config.data.suites == [tmp_path / "problems"]
    examples = sorted((REPO / "training" / "configs").glob("qwen3-*.yaml"))
    assert examples
    for example in examples:
        cfg = load_config(example)
        assert cfg.generation.backend == "vllm_server" and cfg.lora.enabled


def test_train_grpo_check_counts_prompts_and_held_out_problems(tmp_path):
    from typer.testing import CliRunner

    from stitchcuda.cli import app

    config = tmp_path / "run.json"
    config.write_text(
        json.dumps(
            {
                "model": {"name_or_path": "tiny"},
                "data": {
                    "suites": [str(PROBLEMS)],
                    "eval_suites": [str(PROBLEMS / "04_softmax.py").rsplit("/", 1)[0]],
                    "plan": False,
                    "target": "cpu",
                },
                "generation": {"backend": "transformers", "num_generations": 2},
                "trainer": {"use_cpu": True, "per_device_train_batch_size": 2},
            }
        )
    )
    result = CliRunner().invoke(app, ["train", "grpo", "--config", str(config), "--check"])
    assert result.exit_code == 0, result.output
    # The whole suite is the evaluation set here: nothing is left to train on.
    assert "config ok: 0 training prompts" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {}\n")
    result = CliRunner().invoke(app, ["train", "grpo", "--config", str(bad)])
    assert result.exit_code == 2 and "model.name_or_path: Field required" in result.output
