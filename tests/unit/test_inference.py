"""ActorInference's grouping of an actor process's threads, against a stand-in for the Redis round trip (the
round trip itself is tested in tests/integration/test_inference.py), and the batch a server gathers."""

from __future__ import annotations

import threading
import time

import numpy as np

from rqrl.errors import RunStoppedError
from rqrl.seed.inference import ActorInference, Answer, ObservationBatch
from rqrl.seed.request_frames import HeldFrames, SentFrames


class SlowServer:
    """Answers each request after ``seconds``, recording how many observations it held (``short``: one answer
    too few, as a server of another version might)."""

    def __init__(self, seconds: float, stop_after: int | None = None, short: bool = False):
        self.seconds, self.stop_after, self.short = seconds, stop_after, short
        self.sizes: list[int] = []

    def evaluate_batch(self, observations: np.ndarray) -> list[Answer]:
        self.sizes.append(len(observations))
        if self.stop_after is not None and len(self.sizes) > self.stop_after:
            raise RunStoppedError("stopped")
        time.sleep(self.seconds)
        answers = [Answer(obs * 2, 1, len(observations), "full", "s") for obs in observations]
        return answers[:-1] if self.short else answers


def run_members(inference: ActorInference, steps: int, slow_first_step: float = 0.0) -> list[list[np.ndarray]]:
    """Four member threads each asking ``steps`` times; thread 0 dawdles once after its first answer."""
    answers: list[list[np.ndarray]] = [[] for _ in range(4)]
    joined = threading.Barrier(4)

    def member(index: int) -> None:
        with inference.member():
            joined.wait(10)
            for step in range(steps):
                answers[index].append(inference.evaluate(np.full(2, index * 100 + step, np.float32)).q_values)
                if index == 0 and step == 0:
                    time.sleep(slow_first_step)

    threads = [threading.Thread(target=member, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    return answers


def test_each_thread_gets_the_answer_to_its_own_observation():
    answers = run_members(ActorInference(SlowServer(0.001), batch_size=4, delay=0.05), steps=20)
    for index, rows in enumerate(answers):
        np.testing.assert_array_equal(np.stack(rows)[:, 0], 2 * (index * 100 + np.arange(20)))


def test_threads_answered_together_ask_together_again_after_one_fell_behind():
    server = SlowServer(0.2)
    # thread 0 comes back 0.16 s late once: the other three go by the delay, thread 0 waits for their request;
    # when it returns, thread 0 must wait for the three instead of going alone (which would split the four for good)
    run_members(ActorInference(server, batch_size=4, delay=0.1), steps=14, slow_first_step=0.16)
    assert server.sizes[:2] == [4, 3], server.sizes  # the three went without thread 0
    assert sum(size == 4 for size in server.sizes[-10:]) >= 8, server.sizes


def ask_once_each(inference: ActorInference, threads: int = 4) -> list[BaseException]:
    """The errors of ``threads`` member threads asking once each (all asked at once)."""
    errors: list[BaseException] = []
    joined = threading.Barrier(threads)

    def member() -> None:
        with inference.member():
            joined.wait(10)
            try:
                inference.evaluate(np.zeros(2, np.float32))
            except Exception as error:  # handed to the test
                errors.append(error)

    workers = [threading.Thread(target=member) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert not any(worker.is_alive() for worker in workers), "a thread never got its answer or error"
    return errors


def test_an_error_reaches_every_thread_of_the_request():
    errors = ask_once_each(ActorInference(SlowServer(0.0, stop_after=0), batch_size=4, delay=0.05))
    assert len(errors) == 4 and all(isinstance(error, RunStoppedError) for error in errors), errors


def test_an_answer_missing_from_a_reply_fails_every_thread_instead_of_stranding_some():
    errors = ask_once_each(ActorInference(SlowServer(0.0, short=True), batch_size=4, delay=0.05))
    assert len(errors) == 4, errors



def test_a_servers_batch_holds_what_concatenating_its_requests_would() -> None:
    """Requests sent whole and rebuilt from frames, uint8 then float32: the batch is np.concatenate's, grown and
    widened as it fills; after clear it takes observations of another shape."""
    rng = np.random.default_rng(0)
    stacks = rng.integers(0, 256, (3, 4, 6, 6), np.uint8)
    rebuilt = HeldFrames().rebuild("client", 0, SentFrames().request(stacks, 0)[0])
    parts = [rng.integers(0, 256, (1, 4, 6, 6), np.uint8), stacks, rng.normal(size=(2, 4, 6, 6)).astype(np.float32)]
    batch = ObservationBatch()
    assert batch.observation_shape is None
    for part in (parts[0], rebuilt, parts[2]):
        batch.add(part)
    expected = np.concatenate(parts)
    assert batch.view().dtype == expected.dtype and batch.observation_shape == (4, 6, 6)
    np.testing.assert_array_equal(batch.view(), expected)
    batch.clear()
    batch.add(np.ones((2, 3), np.int64))
    np.testing.assert_array_equal(batch.view(), np.ones((2, 3), np.int64))


def test_a_servers_batch_lets_go_of_an_array_grown_far_past_its_batches(monkeypatch) -> None:
    from rqrl.seed import inference

    monkeypatch.setattr(inference, "SHRINK_BATCH_BYTES", 1000)
    batch = ObservationBatch()
    batch.add(np.zeros((100, 64), np.uint8))  # one huge request
    batch.clear()
    batch.add(np.ones((2, 64), np.uint8))
    assert batch.capacity == 100  # the huge batch was the last one: kept
    batch.clear()
    assert batch.capacity == 0  # a batch of 2 in an array of 100: let go
    batch.add(np.ones((3, 64), np.uint8))
    np.testing.assert_array_equal(batch.view(), np.ones((3, 64), np.uint8))
