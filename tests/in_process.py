"""An rqrl worker inside the test process, for job logic that a worker process would prove nothing more about:
RQ's own work(burst=True) on a RolloutWorker, with the signal handlers and torch threads it sets put back."""

from __future__ import annotations

import signal
import threading
from typing import Any

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


def obtain_in_process(connection: redis.Redis, sampler: Any, n_episodes: int) -> Any:
    """``sampler.obtain_exact_episodes(n_episodes, None)``, its jobs run in this process by ``work_burst`` while the
    call waits in a thread; returns its EpisodeBatch, or raises what the call raised."""
    from rqrl.engine.rq_safety import rollout_queue
    from tests.polling import wait_until

    outcome: list[Any] = []

    def call() -> None:
        try:
            outcome.append(sampler.obtain_exact_episodes(n_episodes, None))
        except BaseException as error:  # the test's to see, not the thread's to print
            outcome.append(error)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    queue = rollout_queue(sampler.config.queue_name, connection)
    wait_until(lambda: queue.count == len(sampler.config.actor_groups), 10, message="the call's jobs enqueued")
    work_burst(connection, (sampler.config.queue_name,))
    caller.join(30)
    assert outcome, "the call did not return within 30 s"
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]
