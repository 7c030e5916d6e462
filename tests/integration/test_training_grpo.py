"""Two GRPO steps on the CPU: a tiny randomly initialised model (built here from a config, with a tokenizer
trained here, nothing downloaded), rewards from the real CPU Verifier on suite problems."""

import math
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

from stitchcuda.coder.llm.client import ScriptedClient
from stitchcuda.coder.llm.coder import LLMCoder
from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.artifacts import LocalArtifactStore
from stitchcuda.training import datasets as ds
from stitchcuda.training.config import GRPOConfig
from stitchcuda.training.grpo import build
from stitchcuda.training.reward import RewardService
from stitchcuda.training.settings import RewardSettings
from stitchcuda.training.verifier import InProcessVerifier
from stitchcuda.verifier.service import VerifierService
from stitchcuda.verifier.settings import VerifierSettings
from tests.conftest import PROBLEMS

pytestmark = pytest.mark.slow

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_tokenizer(texts: list[str]):
    """A byte-level BPE trained on the prompts themselves: every byte is in its alphabet, so any text
    (including a program the model never wrote) encodes without unknowns."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=800, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_model(vocab: int):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=16384,
    )
    return Qwen2ForCausalLM(config)


def test_two_grpo_steps_on_the_cpu_verifier(tmp_path: Path):
    suite = [p for p in ds.load_suite(PROBLEMS) if p.name.startswith(("01_", "02_"))]
    assert len(suite) == 2
    # No retrieved notes: shorter prompts keep the tiny model's CPU steps quick.
    builder = ds.ExampleBuilder(LLMCoder(ScriptedClient([]), structured=True))
    rows = list(builder.from_suite(suite, target="cpu"))
    texts = [m["content"] for r in rows for m in r.prompt]
    tokenizer = tiny_tokenizer(texts)
    model = tiny_model(len(tokenizer))

    # One known-good answer: the built-in synthesizer's program for problem 02, written as the JSON answer
    # the system prompt asks for; it replaces the first completion of every batch that holds problem 02.
    good_source = suite[1].source
    good = ds.answer_text(
        to_candidate(Synthesizer().synthesize(good_source, None, variant=Variant(), device="cpu"))
    )

    def inject(reward_fn):
        def with_known_good(prompts, completions, **columns):
            completions = list(completions)
            for i, reference in enumerate(columns["reference"]):
                if reference == good_source:
                    completions[i] = [{"role": "assistant", "content": good}]
                    break
            return reward_fn(prompts, completions, **columns)

        with_known_good.__name__ = "stitchcuda_reward"
        return with_known_good

    verifier = VerifierService(
        VerifierSettings(home=tmp_path / "verifier", compile_baseline=False, build_jobs=1),
        artifacts=LocalArtifactStore(tmp_path / "artifacts"),
    )
    service = RewardService(RewardSettings(), verifier=InProcessVerifier(verifier))
    config = GRPOConfig.model_validate(
        {
            "model": {"name_or_path": "tiny-in-code"},
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            "data": {"suites": [str(PROBLEMS)], "target": "cpu", "plan": False},
            "generation": {"backend": "transformers", "num_generations": 2, "max_completion_tokens": 12},
            "trainer": {
                "output_dir": str(tmp_path / "out"),
                "max_steps": 2,
                "per_device_train_batch_size": 2,
                "use_cpu": True,
                "bf16": False,
                "save_steps": 100,
                "learning_rate": 1e-3,
            },
            "reward": {"device": "cpu"},
        }
    )
    run = build(config, model=model, tokenizer=tokenizer, service=service, rows=rows, reward_function=inject)
    output = run.trainer.train()
    assert output.global_step == 2
    history = run.scorer.history
    # Two steps of one prompt with two completions each.
    assert len(history) == 4
    garbage = [s for s in history if s.result is None]
    rewarded = [s for s in history if s.result is not None]
    # The tiny model's completions hold no program: reward 0, and no verification was spent on them.
    assert garbage and all(s.reward == 0.0 and s.parse_error for s in garbage)
    # Problem 02 comes up in at least one of the two steps (the sampler sees both prompts over 2 steps).
    assert rewarded, "the known-good completion was never scored"
    assert all(s.result.verdict.accepted and s.reward > 0 for s in rewarded)
    # Scored once: every later batch that held the same program was served from the reward cache.
    assert service.computed == 1
    logged = [h for h in run.trainer.state.log_history if "reward" in h]
    assert logged and max(h["reward"] for h in logged) > 0
    assert all(math.isfinite(h["loss"]) for h in run.trainer.state.log_history if "loss" in h)

    # verl's adapter scores through the same reward: the known-good program gets the reward it got in
    # training (from the cache, no second verification) and a garbage answer 0, unparsed.
    from stitchcuda.training import verl

    verl.configure(run.scorer)
    try:
        scores = verl.compute_score_batch(
            ["stitchcuda", "stitchcuda"],
            [good, "def forward(): pass"],
            [good_source, good_source],
            [{"skill": "generate", "target": "cpu"}, None],
        )
    finally:
        verl.configure(None)
    assert scores[0]["score"] == rewarded[0].reward > 0 and scores[0]["accepted"] == 1.0
    assert scores[1] == {"score": 0.0, "accepted": 0.0, "speedup": 0.0, "rubric": 0.0, "parsed": 0.0}
    assert service.computed == 1
