"""An rqrl worker inside the test process, for job logic that a worker process would prove nothing more about:
RQ's own work(burst=True) on a RolloutWorker, with the signal handlers and torch threads it sets put back."""

from __future__ import annotations

import signal

import redis
import torch

from rqrl.engine.worker import RolloutWorker
from tests.conftest import TEST_SECRET


def work_burst(connection: redis.Redis, queues: tuple[str, ...] = ("rqrl",), name: str = "in-process") -> bool:
    """Run the jobs on ``queues`` in this process until they are empty; whether any job ran (RQ's answer)."""
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    threads = torch.get_num_threads()
    try:
        worker = RolloutWorker(list(queues), connection=connection, name=name, secret=TEST_SECRET)
        return worker.work(burst=True, logging_level="WARNING", with_scheduler=False)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
        torch.set_num_threads(threads)
