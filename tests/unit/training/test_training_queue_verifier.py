"""The queue verifier's configuration: `reward.verifier` takes queue, and a setup that could never deliver a
verdict (no shared artifact store, more waiters than Redis connections) is refused at start-up, not at step one.
Verifications through real workers: tests/integration/test_reward_queue_verifier.py."""

from pathlib import Path

import pytest

from stitchcuda.shared.errors import InvalidRequest
from stitchcuda.training.config import ConfigError, GRPOConfig, load_config
from stitchcuda.training.settings import RewardSettings
from stitchcuda.training.verifier import InProcessVerifier, QueueVerifier, build_verifier

RUN = (
    "model: {name_or_path: tiny}\ndata: {jsonl: [rows.jsonl]}\n"
    "generation: {backend: transformers, num_generations: 2}\n"
    "trainer: {use_cpu: true, per_device_train_batch_size: 2}\n"
)


def test_the_config_takes_the_queue_verifier_and_names_a_wrong_one(tmp_path: Path):
    (tmp_path / "queue.yaml").write_text(RUN + "reward: {device: cuda, verifier: queue}\n")
    assert load_config(tmp_path / "queue.yaml").reward.verifier == "queue"
    (tmp_path / "grpc.yaml").write_text(RUN + "reward: {verifier: grpc}\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "grpc.yaml")
    assert "reward.verifier" in str(err.value) and "'queue'" in str(err.value)


def test_the_factory_builds_the_port_the_run_names():
    settings = RewardSettings()
    assert isinstance(build_verifier("in_process", settings), InProcessVerifier)
    with pytest.raises(InvalidRequest, match="unknown verifier 'grpc'"):
        build_verifier("grpc", settings)
    assert GRPOConfig.model_fields["reward"].default.verifier == "in_process"


def test_an_artifact_store_the_workers_cannot_read_is_refused():
    with pytest.raises(InvalidRequest, match="STITCH_ARTIFACT_STORE=s3"):
        QueueVerifier.from_settings(RewardSettings(artifact_store="memory"))


def test_more_waiting_verifications_than_the_redis_pool_serves_are_refused(tmp_path: Path):
    # The clients connect lazily: no Redis is reached before the refusal.
    settings = RewardSettings(
        redis_url="redis://127.0.0.1:1/0", artifact_dir=tmp_path, reward_max_concurrent=64
    )
    with pytest.raises(InvalidRequest, match=r"reward_max_concurrent \(64\) is above 32"):
        QueueVerifier.from_settings(settings)


def test_the_tenant_must_be_a_tenant_id():
    with pytest.raises(ValueError, match="reward_queue_tenant"):
        RewardSettings(reward_queue_tenant="Training Runs")
