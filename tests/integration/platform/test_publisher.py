"""The direct Redis publisher writes the task message kombu would, on the list a worker reads."""

import base64
import json

import pytest
from kombu.serialization import loads as kombu_loads

from stitchcuda.shared.celery_app import TASK_NAMES, QueueSettings, create_celery
from stitchcuda.shared.celery_transport import CeleryTransport, RedisQueuePublisher
from stitchcuda.shared.envelope import encode, new_envelope
from stitchcuda.shared.errors import Unavailable
from stitchcuda.shared.redis_store import connect
from stitchcuda.shared.transport import CODER, PLANNER, VERIFIER_BUILD
from tests.integration.platform.harness import REDIS_URL

pytestmark = pytest.mark.integration

# Differ per message by design: kombu's delivery tag and the publishing node's name.
_PER_MESSAGE = {"delivery_tag"}


def _pop(client, queue: str) -> dict:  # type: ignore[no-untyped-def]
    raw = client.rpop(queue)
    assert raw is not None, f"nothing on {queue}"
    return json.loads(raw)


def _shape(doc: object) -> object:
    if isinstance(doc, dict):
        return {k: _shape(v) for k, v in doc.items() if k not in _PER_MESSAGE}
    return type(doc).__name__


@pytest.mark.parametrize("queue", [PLANNER, CODER, VERIFIER_BUILD])
def test_the_message_matches_the_one_send_task_publishes(redis_db: object, queue: str):
    client = connect(REDIS_URL)
    app = create_celery(QueueSettings(redis_url=REDIS_URL))
    env = new_envelope("job1", "acme", 2)
    env.plan_request.reference_key = "tenants/acme/jobs/job1/reference.py"
    data = encode(env)
    CeleryTransport(app, client).send(queue, env)  # kombu's producer
    theirs = _pop(client, queue)
    CeleryTransport(app, client, publisher=RedisQueuePublisher(app, client)).send(queue, env)
    ours = _pop(client, queue)

    assert _shape(ours) == _shape(theirs)
    for part in ("headers", "properties"):
        mine = {k: v for k, v in ours[part].items() if k not in _PER_MESSAGE | {"origin"}}
        assert mine == {k: v for k, v in theirs[part].items() if k not in _PER_MESSAGE | {"origin"}}
    assert ours["headers"]["task"] == TASK_NAMES[queue]
    assert ours["headers"]["id"] == env.message_id
    assert ours["properties"]["delivery_tag"] != theirs["properties"]["delivery_tag"]
    for doc in (ours, theirs):
        body = kombu_loads(
            base64.b64decode(doc["body"]),
            doc["content-type"],
            doc["content-encoding"],
            accept={"application/x-msgpack"},
        )
        assert body[0] == [data] and body[1] == {}
    # Both recorded the task id for Cancel.
    assert client.smembers("stitch:job:job1:tasks") == {env.message_id.encode()}
    app.close()


def test_a_dead_broker_is_unavailable_not_a_crash():
    app = create_celery(QueueSettings(redis_url="redis://127.0.0.1:1/0"))
    dead = connect("redis://127.0.0.1:1/0")
    transport = CeleryTransport(app, dead, publisher=RedisQueuePublisher(app, dead))
    with pytest.raises(Unavailable, match="broker is unavailable"):
        transport.send(PLANNER, new_envelope("job1", "acme", 0))
    app.close()


def test_with_a_broker_apart_from_the_store_the_task_id_is_still_recorded_in_the_store(redis_db: object):
    broker_url = REDIS_URL.rsplit("/", 1)[0] + "/15"
    store, broker = connect(REDIS_URL), connect(broker_url)
    app = create_celery(QueueSettings(redis_url=REDIS_URL, broker_url=broker_url))
    env = new_envelope("job2", "acme", 0)
    queue = "judge"
    before = broker.llen(queue)
    CeleryTransport(app, store, publisher=RedisQueuePublisher(app, broker)).send(queue, env)
    try:
        assert broker.llen(queue) == before + 1 and store.llen(queue) == 0
        assert json.loads(broker.lindex(queue, 0))["headers"]["id"] == env.message_id
        # Cancel reads the store: the id is there, not in the broker's database.
        assert store.smembers("stitch:job:job2:tasks") == {env.message_id.encode()}
        assert not broker.exists("stitch:job:job2:tasks")
    finally:
        broker.lrem(queue, 1, broker.lindex(queue, 0))
        app.close()
