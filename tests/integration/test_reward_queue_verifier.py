"""The reward's queue verifier against a real Verifier worker process on Redis: an honest candidate gets the
verdict the in-process Verifier gives, a queue nobody consumes ends in the documented timeout (an error, not a
rejection), and a GRPO config with `verifier: queue` turns completions into rewards through the worker."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from stitchcuda.api.v1 import jobs_pb2, verify_pb2
from stitchcuda.shared import candidate as candidate_format
from stitchcuda.shared.errors import DeadlineExceeded, HarnessError
from stitchcuda.shared.transport import QUEUES, VERIFIER_CPU
from stitchcuda.training import datasets as ds
from stitchcuda.training.config import load_config
from stitchcuda.training.grpo import reward_service
from stitchcuda.training.reward import RewardRequest, RewardService
from stitchcuda.training.rollouts import RolloutScorer, TRLRewardFunction
from stitchcuda.training.settings import RewardSettings
from stitchcuda.training.verifier import InProcessVerifier, QueueVerifier
from stitchcuda.verifier.service import VerifierService
from stitchcuda.verifier.settings import VerifierSettings
from tests.conftest import PROBLEMS, REPO
from tests.integration.corpus_variants import FAST, slowed
from tests.integration.platform.harness import Platform, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# DBs of their own: the platform tests flush theirs (13 by default) while workers of theirs run.
WORKER_URL = "redis://127.0.0.1:6379/12"  # a Verifier worker consumes verifier.cpu here
NOBODY_URL = "redis://127.0.0.1:6379/11"  # no worker at all
REFERENCE = (PROBLEMS / "01_elementwise_chain.py").read_text()
# Short measurements on shared cores, no torch.compile baseline; the same for the worker and in process.
VERIFIER_ENV = {
    "STITCH_COMPILE_BASELINE": "false",
    "STITCH_TRIALS": "2",
    "STITCH_WARMUP_ITERATIONS": "1",
    "STITCH_BUILD_JOBS": "1",
    "STITCH_STANDBY": "false",
    # The corpus kit is compiled once for every test tier.
    "STITCH_BUILD_CACHE_DIR": os.environ["STITCH_TEST_BUILD_CACHE"],
}


def empty(url: str) -> None:
    """The platform's keys and queues of a test DB, gone (the broker's bindings stay, as harness.flush_redis)."""
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter("stitch:*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])
    client.delete(*QUEUES)
    client.close()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The artifact store the trainer and the worker share (S3 on a cluster, a folder on one machine)."""
    return tmp_path_factory.mktemp("artifacts")


@pytest.fixture(scope="module")
def worker(artifacts: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    empty(WORKER_URL)
    workdir = tmp_path_factory.mktemp("worker")
    env = {
        **os.environ,
        **VERIFIER_ENV,
        "STITCH_ENVIRONMENT": "test",
        "STITCH_JOB_STORE": "redis",
        "STITCH_REDIS_URL": WORKER_URL,
        "STITCH_BROKER_URL": "",
        "STITCH_ARTIFACT_STORE": "local",
        "STITCH_ARTIFACT_DIR": str(artifacts),
        "STITCH_HOME": str(workdir / "home"),
        "STITCH_METRICS_PORT": "0",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    platform = Platform(env, workdir, fake=False)
    try:
        platform.start_worker("verifier", "--queues", VERIFIER_CPU, "--concurrency", "1")
        yield platform
    except BaseException:
        print(platform.logs())
        raise
    finally:
        platform.stop()
        empty(WORKER_URL)


def trainer_settings(url: str, artifacts: Path, **fields: object) -> RewardSettings:
    return RewardSettings(
        redis_url=url,
        artifact_store="local",
        artifact_dir=artifacts,
        **fields,  # type: ignore[arg-type]
    )


def rules(verdict: verify_pb2.Verdict) -> set[tuple[str, int]]:
    """Its warnings and rejections, less the timing ones (D7: noise, drift), which two runs on shared cores
    need not agree on."""
    shown = (verify_pb2.SEVERITY_WARNING, verify_pb2.SEVERITY_REJECT)
    return {
        (f.rule, f.severity) for f in verdict.findings if f.severity in shown and not f.rule.startswith("D7.")
    }


def jobs_of(url: str, tenant: str) -> list[jobs_pb2.Job]:
    from stitchcuda.shared.redis_store import RedisJobStore

    store = RedisJobStore.from_url(url)
    try:
        return store.list_jobs(tenant, limit=100)[0]
    finally:
        store.redis.close()


def test_an_honest_candidate_through_the_queue_gets_the_in_process_verdict(
    worker: Platform, artifacts: Path, tmp_path: Path
):
    candidate = candidate_format.read_dir(FAST)
    queue = QueueVerifier.from_settings(trainer_settings(WORKER_URL, artifacts, reward_queue_timeout_s=600))
    try:
        remote = queue.verify(REFERENCE, candidate, device="cpu")
    finally:
        queue.close()
    settings = {k.removeprefix("STITCH_").lower(): v for k, v in VERIFIER_ENV.items()}
    local_service = VerifierService(VerifierSettings(home=tmp_path / "home", **settings))  # type: ignore[arg-type]
    local = InProcessVerifier(local_service).verify(REFERENCE, candidate, device="cpu")

    assert remote.accepted, (remote.reason, worker.logs())
    assert (remote.accepted, remote.compiled, remote.correct) == (
        local.accepted,
        local.compiled,
        local.correct,
    )
    assert (remote.device, remote.kernel_policy) == (local.device, local.kernel_policy) == (
        jobs_pb2.DEVICE_CPU, "strict")  # fmt: skip
    assert rules(remote) == rules(local)
    assert remote.reason.startswith("accepted:") and remote.speedup_vs_eager > 0
    # The verification was a job of the training tenant, named after the program's content; the worker
    # ends it (report, trajectory) after the verdict the reward already holds.
    wait_for(lambda: jobs_of(WORKER_URL, "training")[0].status.state == jobs_pb2.JOB_STATE_SUCCEEDED, 30,
             "the verification job to end")  # fmt: skip
    (job,) = jobs_of(WORKER_URL, "training")
    assert job.spec.labels["source"] == "training"
    assert remote.candidate_id == f"rollout-{candidate_format.content_hash(candidate)[:12]}"
    assert job.status.best_candidate_id == remote.candidate_id


def test_a_reference_that_fails_on_the_worker_is_a_harness_error_not_a_rejection(
    worker: Platform, artifacts: Path
):
    broken = REFERENCE.replace("return y * x", 'raise RuntimeError("the reference is broken")')
    assert broken != REFERENCE
    settings = trainer_settings(WORKER_URL, artifacts, reward_queue_timeout_s=600)
    queue = QueueVerifier.from_settings(settings)
    try:
        with pytest.raises(HarnessError) as raised:
            queue.verify(broken, candidate_format.read_dir(FAST), device="cpu")
        assert "the reference is broken" in str(raised.value), worker.logs()
        assert raised.value.error_code == "invalid_problem"  # the code the worker gave the job
        service = RewardService(settings, verifier=queue)
        (result,) = service.score_many([RewardRequest(broken, candidate_format.read_dir(FAST))])
        assert result.reward == 0.0 and "the reference is broken" in result.error and service.computed == 0
    finally:
        queue.close()


def test_a_queue_nobody_consumes_times_out_promptly_as_an_error_not_a_rejection(artifacts: Path):
    empty(NOBODY_URL)
    candidate = candidate_format.read_dir(FAST)
    settings = trainer_settings(NOBODY_URL, artifacts, reward_queue_timeout_s=2)
    queue = QueueVerifier.from_settings(settings)
    try:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded) as raised:
            queue.verify(REFERENCE, candidate, device="cpu")
        waited = time.monotonic() - started
        assert 2 <= waited < 6, waited
        assert "no verdict within 2 s" in str(raised.value) and VERIFIER_CPU in str(raised.value)
        client = redis.Redis.from_url(NOBODY_URL)
        # The request really went out on verifier.cpu; its job is cancelled, so a late worker drops it.
        assert client.llen(VERIFIER_CPU) == 1
        client.close()
        (job,) = jobs_of(NOBODY_URL, "training")
        assert job.status.state == jobs_pb2.JOB_STATE_CANCELLED

        # The reward scores it as no reward with the reason, not as a rejected candidate, and caches nothing.
        service = RewardService(settings, verifier=queue)
        (result,) = service.score_many([RewardRequest(REFERENCE, candidate, "generate", "cpu")])
        assert result.reward == 0.0 and "no verdict within 2 s" in result.error
        assert result.rubric_source == "none" and not result.cached and service.computed == 0
    finally:
        queue.close()
        empty(NOBODY_URL)


def test_a_grpo_config_with_the_queue_verifier_rewards_completions(
    worker: Platform, artifacts: Path, tmp_path: Path
):
    empty_jobs = {j.job_id for j in jobs_of(WORKER_URL, "training")}
    config_file = tmp_path / "grpo.yaml"
    config_file.write_text(
        f"""
model: {{name_or_path: tiny-in-code}}
data: {{jsonl: [rows.jsonl], target: cpu}}
generation: {{backend: transformers, num_generations: 2}}
trainer: {{use_cpu: true, per_device_train_batch_size: 4}}
reward:
  device: cpu
  verifier: queue
  settings:
    redis_url: "{WORKER_URL}"
    artifact_store: local
    artifact_dir: "{artifacts}"
    reward_max_concurrent: 2
    reward_queue_timeout_s: 600
"""
    )
    config = load_config(config_file)
    assert config.reward.verifier == "queue"
    service = reward_service(config)
    assert isinstance(service.verifier, QueueVerifier)
    try:
        fast = ds.answer_text(candidate_format.read_dir(FAST))
        slow = ds.answer_text(candidate_format.read_dir(slowed(tmp_path)))
        scorer = RolloutScorer(service, device=config.reward.device)
        reward = TRLRewardFunction(scorer)
        completions = [[{"role": "assistant", "content": text}] for text in (fast, slow, "no program here")]
        rewards = reward(["p"] * 3, completions, reference=[REFERENCE] * 3, skill=["generate"] * 3,
                         target=["cpu"] * 3)  # fmt: skip
    finally:
        service.close()
    # Which of the two is faster is the timing's call on shared cores; that both earn a reward is not.
    assert rewards[0] > 0 and rewards[1] > 0 and rewards[2] == 0.0, (rewards, worker.logs())
    results = [s.result for s in scorer.history[:2]]
    assert all(r is not None and r.verdict.accepted and not r.error and not r.cached for r in results)
    assert [r.reward for r in results if r is not None] == rewards[:2]
    # Both verifications were in flight at once: the second job existed before the first verdict came back.
    jobs = [j for j in jobs_of(WORKER_URL, "training") if j.job_id not in empty_jobs]
    assert len(jobs) == 2
    from stitchcuda.shared.redis_store import RedisJobStore

    store = RedisJobStore.from_url(WORKER_URL)
    verdicts = [
        e.at.ToNanoseconds()
        for j in jobs
        for e in store.read_events(j.job_id)
        if e.kind == jobs_pb2.EVENT_KIND_VERDICT
    ]
    store.redis.close()
    assert max(j.created_at.ToNanoseconds() for j in jobs) < min(verdicts)
