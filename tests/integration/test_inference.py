"""Central inference over a real Redis: batches run when full or when the delay expires, answers equal a local
forward pass, servers load weights before serving and pick up new versions, clients re-send when a server
vanishes with their request, unsigned requests are refused."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from rqrl.engine.codec import weights_key
from rqrl.engine.keys import RunKeys
from rqrl.engine.weights import WeightStore
from rqrl.errors import RunStoppedError
from rqrl.seed.inference import (
    REPLY_TTL_SECONDS,
    ActorInference,
    InferenceClient,
    InferenceServer,
    server_requests_key,
)
from rqrl.seed.request_frames import HeldFrames
from rqrl.seed.store import SeedRun, seal, unseal
from tests.conftest import TEST_SECRET
from tests.polling import wait_until
from tests.seed_fixtures import mlp


@pytest.fixture
def run(connection, run_name):
    return SeedRun(connection, RunKeys(run_name), TEST_SECRET)


def publish(run, model):
    return WeightStore(run.connection, run.keys, weights_key(TEST_SECRET, run.keys.run_name)).publish(
        model.state_dict())


class ServerThread:
    """An InferenceServer looping in a thread of the test process; stopped at the end of the test."""

    def __init__(self, run, model, batch_size=4, delay=0.1, broadcast_period=0.1, name="server-t"):
        self.server = InferenceServer(run, model, name, batch_size, delay, "cpu", broadcast_period)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.server.run_forever, args=(self.stop,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self.server

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


def evaluate_concurrently(run, observations, timeout=10.0):
    answers = [None] * len(observations)

    def ask(index):
        answers[index] = InferenceClient(run, f"c{index}", timeout).evaluate(observations[index])

    threads = [threading.Thread(target=ask, args=(index,)) for index in range(len(observations))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


def test_a_full_batch_runs_at_once_and_answers_equal_a_local_forward_pass(run, one_torch_thread):
    torch.manual_seed(1)
    reference = mlp()
    publish(run, reference)
    torch.manual_seed(2)
    observations = [np.random.default_rng(index).normal(size=4).astype(np.float32) for index in range(4)]
    with ServerThread(run, mlp(), batch_size=4, delay=20.0) as server:  # random init: must load v1 first
        answers = evaluate_concurrently(run, observations)
    assert [(answer.reason, answer.batch_size, answer.version) for answer in answers] == [("full", 4, 1)] * 4
    expected = reference(torch.as_tensor(np.stack(observations))).detach().numpy()
    np.testing.assert_allclose(np.stack([answer.q_values for answer in answers]), expected, rtol=1e-5, atol=1e-6)
    assert server.batches == {"full": 1, "delay": 0}
    assert run.counters()["batches_full"] == 1 and run.counters()["inferences"] == 4


def test_a_lone_request_runs_when_the_delay_expires(run):
    publish(run, mlp())
    with ServerThread(run, mlp(), batch_size=4, delay=0.3):
        client = InferenceClient(run, "lone", 10.0)
        client.evaluate(np.zeros(4, np.float32))  # the server is up and holds weights
        started = time.monotonic()
        answer = client.evaluate(np.zeros(4, np.float32))
        waited = time.monotonic() - started
    assert (answer.reason, answer.batch_size) == ("delay", 1)
    assert waited >= 0.3  # it waited for company the whole delay


def test_new_weights_reach_the_server(run):
    torch.manual_seed(0)
    model = mlp()
    publish(run, model)
    obs = np.ones(4, np.float32)
    with ServerThread(run, mlp(), batch_size=1, delay=0.0, broadcast_period=0.05):
        client = InferenceClient(run, "w", 10.0)
        assert client.evaluate(obs).version == 1
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(1.0)
        assert publish(run, model) == 2
        deadline = time.monotonic() + 20
        while (answer := client.evaluate(obs)).version != 2:
            assert time.monotonic() < deadline, "version 2 never reached the server"
            time.sleep(0.02)
    np.testing.assert_allclose(answer.q_values, model(torch.as_tensor(obs[None])).detach().numpy()[0], rtol=1e-5)


def test_a_request_lost_with_its_server_is_sent_again_to_another(run):
    publish(run, mlp())
    client = InferenceClient(run, "orphan", timeout=0.5)
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("answer", client.evaluate(np.zeros(4, np.float32))))
    thread.start()
    # a server takes the request and dies before answering
    assert run.connection.blpop([run.keys.seed("requests")], timeout=10) is not None
    with ServerThread(run, mlp(), batch_size=1, delay=0.0):
        thread.join(20)
    assert result["answer"].batch_size == 1 and client.resent >= 1


def test_a_waiting_client_gives_up_when_the_run_stops(run):
    client = InferenceClient(run, "stopped", timeout=5.0)
    run.stop()
    with pytest.raises(RunStoppedError):
        client.evaluate(np.zeros(4, np.float32))


def test_unsigned_and_forged_requests_are_dropped(run, caplog):
    from rqrl.engine.codec import encode_arrays

    publish(run, mlp())
    server = InferenceServer(run, mlp(), "s", 2, 0.0)
    assert server.load_weights()
    unsigned = encode_arrays({"obs": np.zeros(4, np.float32)}, {"reply": "x", "id": "0"})
    forged = seal({"obs": np.zeros(4, np.float32)}, {"reply": "x", "id": "0"}, b"not-the-key")
    run.connection.rpush(run.keys.seed("requests"), unsigned, forged)
    assert server.serve_once(1.0) == 0
    assert not run.connection.exists("x")
    assert "not a signed observation" in caplog.text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_server_runs_on_the_inference_device(run):
    torch.manual_seed(3)
    reference = mlp()
    publish(run, reference)
    server = InferenceServer(run, mlp(), "gpu", 1, 0.0, device="cuda")
    assert server.load_weights()
    assert next(server.model.parameters()).device.type == "cuda"
    obs = np.random.default_rng(0).normal(size=4).astype(np.float32)
    run.connection.rpush(run.keys.seed("requests"), seal({"obs": obs[None]}, {"reply": "r", "id": "0"},
                                                         run.message_key))
    assert server.serve_once(1.0) == 1
    arrays, _ = unseal(run.connection.lpop("r"), run.message_key)
    np.testing.assert_allclose(arrays["q"], reference(torch.as_tensor(obs[None])).detach().numpy(), rtol=1e-4,
                               atol=1e-5)


def ask_as_members(inference, observations, idle_members=0, timeout=30):
    """Each observation asked by its own member thread of ``inference`` (plus members that never ask); the answers
    or errors in order."""
    results = [None] * len(observations)
    joined = threading.Barrier(len(observations) + idle_members + 1)
    leave = threading.Event()

    def ask(index):
        with inference.member():
            joined.wait(10)
            try:
                results[index] = inference.evaluate(observations[index])
            except Exception as error:  # handed to the test
                results[index] = error

    def idle():
        with inference.member():
            joined.wait(10)
            leave.wait(timeout)

    threads = [threading.Thread(target=ask, args=(index,)) for index in range(len(observations))]
    threads += [threading.Thread(target=idle) for _ in range(idle_members)]
    for thread in threads:
        thread.start()
    joined.wait(10)
    for thread in threads[:len(observations)]:
        thread.join(timeout)
    leave.set()
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads)
    return results


def test_an_actor_process_threads_observations_go_as_one_request(run, one_torch_thread):
    torch.manual_seed(1)
    reference = mlp()
    publish(run, reference)
    observations = [np.random.default_rng(index).normal(size=4).astype(np.float32) for index in range(6)]
    client = InferenceClient(run, "process", 30.0)
    with ServerThread(run, mlp(), batch_size=6, delay=20.0):  # a smaller batch would wait 20 s: it must be full
        answers = ask_as_members(ActorInference(client, batch_size=8, delay=20.0), observations)
    assert [(answer.reason, answer.batch_size, answer.version) for answer in answers] == [("full", 6, 1)] * 6
    expected = reference(torch.as_tensor(np.stack(observations))).detach().numpy()
    np.testing.assert_allclose(np.stack([answer.q_values for answer in answers]), expected, rtol=1e-5, atol=1e-6)
    assert (client.requests, client.resent) == (1, 0)  # all six members waited: one request, sent at once
    assert run.counters()["batches_full"] == 1 and run.counters()["inferences"] == 6, run.counters()


def test_a_member_that_does_not_ask_holds_a_request_back_only_for_the_delay(run):
    publish(run, mlp())
    client = InferenceClient(run, "slow-member", 10.0)
    inference = ActorInference(client, batch_size=4, delay=0.3)
    with ServerThread(run, mlp(), batch_size=2, delay=0.0):
        started = time.monotonic()
        answers = ask_as_members(inference, [np.zeros(4, np.float32)] * 2, idle_members=1)
        waited = time.monotonic() - started
    assert [(answer.reason, answer.batch_size) for answer in answers] == [("full", 2)] * 2
    assert client.requests == 1 and 0.3 <= waited < 10  # both asked together, after the idle member's delay


def test_a_request_larger_than_the_batch_runs_in_forward_passes_of_the_batch_size(run, one_torch_thread):
    torch.manual_seed(4)
    reference = mlp()
    publish(run, reference)
    observations = np.random.default_rng(5).normal(size=(10, 4)).astype(np.float32)
    with ServerThread(run, mlp(), batch_size=4, delay=20.0) as server:
        answers = InferenceClient(run, "wide", 10.0).evaluate_batch(observations)
    assert [answer.batch_size for answer in answers] == [4] * 8 + [2] * 2
    expected = reference(torch.as_tensor(observations)).detach().numpy()
    np.testing.assert_allclose(np.stack([answer.q_values for answer in answers]), expected, rtol=1e-5, atol=1e-6)
    assert server.batches == {"full": 3, "delay": 0} and run.counters()["inferences"] == 10


def test_a_stopped_run_reaches_every_waiting_member(run):
    inference = ActorInference(InferenceClient(run, "stopping", 5.0, stopped=run.stopped), batch_size=4, delay=0.0)
    run.stop()
    results = ask_as_members(inference, [np.zeros(4, np.float32)] * 3)
    assert all(isinstance(result, RunStoppedError) for result in results), results


def test_a_request_of_another_observation_shape_is_dropped_and_the_batch_still_runs(run, caplog):
    publish(run, mlp())
    server = InferenceServer(run, mlp(), "s", 4, 0.0)
    assert server.load_weights()
    run.connection.rpush(run.keys.seed("requests"),
                         seal({"obs": np.zeros((1, 4), np.float32)}, {"reply": "good", "id": "0"}, run.message_key),
                         seal({"obs": np.zeros((1, 3), np.float32)}, {"reply": "odd", "id": "0"}, run.message_key))
    assert server.serve_once(1.0) == 1
    assert run.connection.llen("good") == 1 and not run.connection.exists("odd")
    assert "observations shaped (1, 3), expected (N, 4)" in caplog.text


def test_junk_on_a_reply_list_is_refused_and_the_real_answer_still_comes(run, caplog):
    """48 random bytes pushed 20 times onto a client's reply list (and replies of the wrong shape or run) are
    refused and counted; the thread gets its answer, it does not die."""
    import os

    publish(run, mlp())
    client = InferenceClient(run, "junked", timeout=5.0)
    foreign = seal({"q": np.zeros((1, 2), np.float32), "batch_size": np.ones(1, np.int64)},
                   {"id": "0", "version": "1", "reason": "full", "server": "s"}, b"another run's key")
    wrong_rows = seal({"q": np.zeros((3, 2), np.float32), "batch_size": np.ones(3, np.int64)},
                      {"id": "0", "version": "1", "reason": "full", "server": "s"}, run.message_key)
    run.connection.rpush(client.reply_key, *[os.urandom(48) for _ in range(20)], foreign, wrong_rows)
    with ServerThread(run, mlp()):
        answer = client.evaluate(np.zeros(4, np.float32))
    assert answer.q_values.shape == (2,) and answer.server == "server-t"
    assert run.junk == 22
    assert "refusing a reply that is no answer of this run's servers" in caplog.text


class MeanPixel(torch.nn.Module):
    """Two Q-values from an image's mean pixel; remembers the dtypes it was given."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
        self.given: set[torch.dtype] = set()

    def forward(self, obs):
        self.given.add(obs.dtype)
        return obs.flatten(1).mean(1, keepdim=True) / 255.0 * self.weight


def test_images_travel_as_uint8_and_the_network_gets_float32(run, connection):
    model = MeanPixel()
    publish(run, model)
    answers = []
    asking = threading.Thread(target=lambda: answers.append(
        InferenceClient(run, "c0", 10.0).evaluate(np.full((4, 8, 8), 255, np.uint8))))
    asking.start()
    wait_until(lambda: connection.llen(run.keys.seed("requests")) == 1, 10, message="the request in Redis")
    arrays, _ = unseal(connection.lindex(run.keys.seed("requests"), 0), run.message_key)
    assert arrays["frames"].dtype == np.uint8  # a quarter of float32's bytes
    assert arrays["frames"].shape == (1, 8, 8) and arrays["frame_index"].shape == (1, 4)  # four frames alike: one
    with ServerThread(run, model, batch_size=1, delay=0.01):
        asking.join(30)
    np.testing.assert_allclose(answers[0].q_values, [1.0, 2.0], rtol=1e-6)
    assert model.given == {torch.float32}


def moving_stacks(steps, envs=3, side=16, seed=0):
    """``[steps, envs, 4, side, side]``: each env's 4-frame stack at each step, one new random frame a step."""
    frames = np.random.default_rng(seed).integers(0, 256, (envs, steps + 3, side, side), np.uint8)
    return np.stack([frames[:, t:t + 4] for t in range(steps)])


def assert_answers_are_the_models(answers, model, observations):
    with torch.no_grad():
        expected = model(torch.as_tensor(observations).float()).numpy()
    np.testing.assert_allclose(np.stack([answer.q_values for answer in answers]), expected, rtol=1e-5)


def test_image_requests_after_the_first_send_one_frame_per_observation_to_their_server(run):
    model = MeanPixel()
    publish(run, model)
    stacks = moving_stacks(steps=5)
    client = InferenceClient(run, "frames", 10.0)
    sizes = []
    with ServerThread(run, model, batch_size=3, delay=0.0) as server:
        for step in stacks:
            before = client.bytes_sent
            assert_answers_are_the_models(client.evaluate_batch(step), model, step)
            sizes.append(client.bytes_sent - before)
    assert client.sent_frames.server == "server-t" and server.missing == 0 and client.resent == client.missed == 0
    frame_bytes = 16 * 16
    assert sizes[0] > 3 * 4 * frame_bytes  # every frame of the three stacks
    assert all(size < 3 * 2 * frame_bytes for size in sizes[1:]), sizes  # about one frame each
    assert server.held_frames.clients == 1


def test_requests_of_frames_and_whole_ones_share_a_batch_and_each_gets_its_own_answers(run):
    """Two clients relying on held frames and one sending whole stacks, at once: one full batch of nine answers
    them all, each with the model's Q-values of its own observations."""
    model = MeanPixel()
    publish(run, model)
    stacks = [moving_stacks(steps=2, seed=seed) for seed in range(3)]
    clients = [InferenceClient(run, "a", 10.0), InferenceClient(run, "b", 10.0),
               InferenceClient(run, "c", 10.0, send_frames=False)]
    def ask(index: int, step: int, answers: dict[int, list]) -> None:
        answers[index] = clients[index].evaluate_batch(stacks[index][step])

    with ServerThread(run, model, batch_size=9, delay=10.0) as server:
        for step in range(2):
            answers: dict[int, list] = {}
            asking = [threading.Thread(target=ask, args=(index, step, answers)) for index in range(3)]
            for thread in asking:
                thread.start()
            for thread in asking:
                thread.join(30)
            for index in range(3):
                assert_answers_are_the_models(answers[index], model, stacks[index][step])
                assert {answer.batch_size for answer in answers[index]} == {9}
    assert [client.sent_frames.server for client in clients] == ["server-t", "server-t", None]
    assert server.missing == 0 and server.held_frames.clients == 2


def test_a_server_that_lost_a_clients_frames_gets_its_request_again_whole(run):
    model = MeanPixel()
    publish(run, model)
    stacks = moving_stacks(steps=3)
    client = InferenceClient(run, "forgotten", 10.0)
    with ServerThread(run, model, batch_size=3, delay=0.0) as server:
        client.evaluate_batch(stacks[0])
        server.held_frames = HeldFrames()  # as after a restart under the same name
        assert_answers_are_the_models(client.evaluate_batch(stacks[1]), model, stacks[1])
        assert_answers_are_the_models(client.evaluate_batch(stacks[2]), model, stacks[2])
    assert (client.missed, server.missing, client.resent) == (1, 1, 0)
    assert run.counters()["requests_missing"] == 1


def second_request_on_the_first_servers_list(run, model, client):
    """The client's first request answered by server-t, which then stops; its second sent, from a thread, onto
    server-t's own list: (the stacks, the thread, the answers it gets, that list)."""
    stacks = moving_stacks(steps=2)
    with ServerThread(run, model, batch_size=3, delay=0.0):
        client.evaluate_batch(stacks[0])
    answers = []
    asking = threading.Thread(target=lambda: answers.extend(client.evaluate_batch(stacks[1])), daemon=True)
    asking.start()
    own_list = server_requests_key(run.keys, "server-t")
    wait_until(lambda: run.connection.llen(own_list) == 1, 10, message="the request on the first server's list")
    return stacks, asking, answers, own_list


def test_a_request_for_a_server_that_died_goes_whole_to_another(run):
    model = MeanPixel()
    publish(run, model)
    client = InferenceClient(run, "moved", timeout=0.5)
    stacks, asking, answers, own_list = second_request_on_the_first_servers_list(run, model, client)
    assert 0 < run.connection.ttl(own_list) <= REPLY_TTL_SECONDS  # left behind, it expires
    with ServerThread(run, model, batch_size=3, delay=0.0, name="server-u"):
        asking.join(20)
    assert_answers_are_the_models(answers, model, stacks[1])
    assert client.resent >= 1 and client.sent_frames.server == "server-u"


def test_a_client_told_not_to_send_frames_sends_whole_observations(run, connection):
    model = MeanPixel()
    publish(run, model)
    stacks = moving_stacks(steps=2)
    client = InferenceClient(run, "whole", 10.0, send_frames=False)
    with ServerThread(run, model, batch_size=3, delay=0.0) as server:
        client.evaluate_batch(stacks[0])
        answers = []
        asking = threading.Thread(target=lambda: answers.extend(client.evaluate_batch(stacks[1])), daemon=True)
    asking.start()  # the server stopped: the second request waits in Redis, where the test reads it
    wait_until(lambda: connection.llen(run.keys.seed("requests")) == 1, 10, message="the request in Redis")
    arrays, _ = unseal(connection.lindex(run.keys.seed("requests"), 0), run.message_key)
    np.testing.assert_array_equal(arrays["obs"], stacks[1])
    with ServerThread(run, model, batch_size=3, delay=0.0):
        asking.join(20)
    assert_answers_are_the_models(answers, model, stacks[1])
    assert server.held_frames.clients == 0


def test_a_server_that_stops_hands_back_the_requests_on_its_own_list(run):
    """A request waiting on a stopping server's own list is answered "missing": its client sends it again, whole,
    to the server that goes on at once, not after request_timeout (30 s here)."""
    model = MeanPixel()
    publish(run, model)
    client = InferenceClient(run, "handed", timeout=30.0)
    stacks, asking, answers, own_list = second_request_on_the_first_servers_list(run, model, client)
    stopping = InferenceServer(run, model, "server-t", 3, 0.0)  # as the server was, its loop about to end
    assert stopping.load_weights()
    stopped = threading.Event()
    stopped.set()
    stopping.run_forever(stopped)
    assert stopping.missing == 1 and not run.connection.exists(own_list)
    with ServerThread(run, model, batch_size=3, delay=0.0, name="server-u"):
        asking.join(20)
    assert not asking.is_alive()
    assert_answers_are_the_models(answers, model, stacks[1])
    assert (client.missed, client.resent) == (1, 0) and client.sent_frames.server == "server-u"


def test_a_missing_answer_to_an_earlier_copy_does_not_send_a_whole_request_again(run):
    client = InferenceClient(run, "late", timeout=5.0)
    late = seal({}, {"id": "7", "missing": "1", "server": "server-t"}, run.message_key)
    real = seal({"q": np.zeros((1, 2), np.float32), "batch_size": np.ones(1, np.int32)},
                {"id": "7", "version": "1", "reason": "full", "server": "server-u"}, run.message_key)
    run.connection.rpush(client.reply_key, late, real)
    answers = client._wait_for_answers("7", 1, whole=True)
    assert isinstance(answers, list) and answers[0].server == "server-u"
    run.connection.rpush(client.reply_key, late)
    assert not isinstance(client._wait_for_answers("7", 1, whole=False), list)  # a copy that relied on frames
