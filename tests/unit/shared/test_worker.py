"""BaseWorker: the reference comes from the job record, so an inline reference needs no artifact store."""

from stitchcuda.api.v1 import jobs_pb2, messages_pb2
from stitchcuda.shared.artifacts import MemoryArtifactStore
from stitchcuda.shared.envelope import encode, new_envelope
from stitchcuda.shared.jobstore import MemoryJobStore
from stitchcuda.shared.transport import PLANNER, InProcessTransport
from stitchcuda.shared.worker import BaseWorker
from stitchcuda.shared.workflow import Workflow
from tests.conftest import problem_source


class Reader(BaseWorker):
    def __init__(self, workflow: Workflow, artifacts: MemoryArtifactStore) -> None:
        super().__init__(workflow, artifacts)
        self.read: list[str] = []

    def work(self, env: messages_pb2.Envelope, job: jobs_pb2.Job) -> None:
        self.read.append(self.load_reference(env.plan_request.reference_key))


def test_a_worker_reads_an_inline_reference_from_the_job_record():
    jobs, artifacts, transport = MemoryJobStore(), MemoryArtifactStore(), InProcessTransport()
    sent: list[bytes] = []
    transport.register(PLANNER, sent.append)
    workflow = Workflow(jobs, artifacts, transport)
    job = workflow.submit(jobs_pb2.JobSpec(reference_source=problem_source("01")), "acme")
    transport.drain()
    assert artifacts.list("") == []  # the small reference was stored nowhere but the job record
    worker = Reader(workflow, artifacts)
    worker.handle(sent[0])
    assert worker.read == [problem_source("01")]
    other = new_envelope(job.job_id, "acme")
    other.plan_request.reference_key = job.artifacts["reference"]
    worker.handle(encode(other))
    assert worker.read == [problem_source("01")] * 2
