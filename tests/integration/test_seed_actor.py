"""SEED actors against a real Redis: the bounded transition list makes actors wait (nothing dropped), action
masks are honoured, a dead thread is reported and replaced, seeds derive from the run seed."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from rqrl.engine.codec import weights_key
from rqrl.engine.keys import RunKeys
from rqrl.engine.weights import WeightStore
from rqrl.errors import RunStoppedError
from rqrl.seed.actor import Actor, TransitionSender, decode_transitions, encode_transitions, thread_seeds
from rqrl.seed.config import Config
from rqrl.seed.inference import InferenceServer
from rqrl.seed.nstep import TransitionBatch
from rqrl.seed.store import SeedRun
from tests.conftest import TEST_SECRET
from tests.polling import wait_until
from tests.seed_fixtures import MaskedEnv, make_exploding_env


@pytest.fixture
def run(connection, run_name):
    return SeedRun(connection, RunKeys(run_name), TEST_SECRET)


def settings(**overrides):
    values = {**Config(actor_threads=1, request_timeout=1.0).process_settings(), "n_actions": 3, "gamma": 0.9}
    values.update(overrides)
    return values


def pop_transitions(run):
    batches = [decode_transitions(blob, run.message_key)[0]
               for blob in run.connection.lrange(run.keys.seed("transitions"), 0, -1)]
    return batches


def one_transition(value=0.0):
    return TransitionBatch(np.full((1, 1), value, np.float32), np.zeros(1, np.int64), np.ones(1, np.float32),
                           np.ones(1, np.float32), np.zeros((1, 1), np.float32), np.ones((1, 3), bool))


def test_a_full_list_makes_the_sender_wait_until_the_learner_takes_one(run):
    sender = TransitionSender(run, bound=2)
    for value in range(2):
        sender.send(encode_transitions(one_transition(value), run.message_key), 1)
    third = threading.Thread(target=sender.send, args=(encode_transitions(one_transition(2), run.message_key), 1))
    third.start()
    wait_until(lambda: run.counters().get("full_waits", 0) >= 1, 10, message="the third push to wait")
    assert third.is_alive() and run.connection.llen(run.keys.seed("transitions")) == 2
    run.connection.lpop(run.keys.seed("transitions"))
    third.join(10)
    assert not third.is_alive()
    values = [batch.obs[0, 0] for batch in pop_transitions(run)]
    assert values == [1.0, 2.0] and run.counters()["pushed"] == 3


def test_with_drop_when_full_a_full_list_drops_the_message_and_counts_its_transitions(run):
    sender = TransitionSender(run, bound=1, drop_when_full=True)
    assert sender.send(encode_transitions(one_transition(0), run.message_key), 1)
    assert not sender.send(encode_transitions(TransitionBatch(*(np.concatenate([field, field]) for field in
                                                                one_transition(1))), run.message_key), 2)
    assert [batch.obs[0, 0] for batch in pop_transitions(run)] == [0.0]
    counters = run.counters()
    assert counters["transitions_dropped"] == 2 and counters["pushed"] == 1 and "full_waits" not in counters


def test_a_waiting_sender_stops_with_the_run(run):
    sender = TransitionSender(run, bound=1)
    sender.send(encode_transitions(one_transition(), run.message_key), 1)
    run.stop()
    with pytest.raises(RunStoppedError):
        sender.send(encode_transitions(one_transition(), run.message_key), 1)


def run_actor_until(actor, predicate, message):
    thread = threading.Thread(target=actor.run_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        wait_until(predicate, 20, message=message)
    finally:
        actor.stop.set()
        thread.join(10)
    assert not thread.is_alive()


def test_random_actions_are_legal_and_truncation_bootstraps(run):
    envs = []

    def environment():
        envs.append(MaskedEnv(legal=2, length=4))
        return envs[-1]

    actor = Actor(run, 0, settings(epsilon=1.0, n_step=2), environment)  # epsilon 1: no server needed
    run_actor_until(actor, lambda: run.counters().get("pushed", 0) >= 8, "8 transitions")
    assert set(envs[0].actions) == {2}
    batches = pop_transitions(run)
    discounts = np.concatenate([batch.discounts for batch in batches])
    # per episode of 4 steps: 2 transitions of 2 steps, then a truncation flushes one of 2 and one of 1
    assert discounts[:4] == pytest.approx([0.81, 0.81, 0.81, 0.9])
    assert np.concatenate([batch.next_masks for batch in batches])[:, 2].all()


def test_greedy_actions_come_from_the_server_and_respect_the_mask(run):
    class PrefersZero(torch.nn.Module):
        def forward(self, obs):
            return torch.tensor([[5.0, 1.0, 0.0]]).expand(len(obs), 3) + 0 * obs.sum()

    WeightStore(run.connection, run.keys, weights_key(TEST_SECRET, run.keys.run_name)).publish({})
    server = InferenceServer(run, PrefersZero(), "s", 1, 0.0)
    stop = threading.Event()
    serving = threading.Thread(target=server.run_forever, args=(stop,), daemon=True)
    serving.start()
    envs = []

    def environment():
        envs.append(MaskedEnv(legal=1 if not envs else 2, length=1000))
        return envs[-1]

    try:
        actor = Actor(run, 0, settings(epsilon=0.0, actor_threads=1), environment)
        run_actor_until(actor, lambda: envs and len(envs[0].actions) >= 5, "5 greedy steps")
    finally:
        stop.set()
        serving.join(10)
    assert set(envs[0].actions) == {1} and run.counters()["inferences"] >= 5


def test_a_dead_thread_is_reported_and_replaced(run):
    actor = Actor(run, 3, settings(epsilon=1.0, actor_threads=2), make_exploding_env)
    run_actor_until(actor, lambda: actor.replaced >= 3, "three replacements")
    events = run.take_events()
    assert {event["actor"] for event in events} == {3}
    assert {event["thread"] for event in events} == {0, 1}
    assert all("ExplodingEnv exploded" in event["error"] for event in events)


def test_thread_seeds_derive_from_the_run_seed():
    first = thread_seeds(7, 0, 1, 0)
    assert first[0] == thread_seeds(7, 0, 1, 0)[0]
    others = {thread_seeds(7, 0, 2, 0)[0], thread_seeds(7, 1, 1, 0)[0], thread_seeds(7, 0, 1, 1)[0],
              thread_seeds(8, 0, 1, 0)[0]}
    assert first[0] not in others and len(others) == 4
    assert first[1].random() == thread_seeds(7, 0, 1, 0)[1].random()


def test_an_env_whose_actions_do_not_fit_the_agent_is_reported(run):
    actor = Actor(run, 0, settings(epsilon=1.0, n_actions=5), lambda: MaskedEnv())
    run_actor_until(actor, lambda: actor.replaced >= 1, "a replacement")
    events = run.take_events()
    assert events and "Discrete(5)" in events[0]["error"] and "Discrete(3)" in events[0]["error"]


def test_an_env_whose_observations_do_not_fit_the_agent_is_reported(run):
    """A worker of queue_name may make another env than the learner checked: each thread checks its own."""
    actor = Actor(run, 0, settings(epsilon=1.0, state_shape=[2]), lambda: MaskedEnv())
    run_actor_until(actor, lambda: actor.replaced >= 1, "a replacement")
    events = run.take_events()
    assert events and "shaped (2,) (the agent's state_shape), got (1,)" in events[0]["error"]


def test_a_thread_that_keeps_dying_is_replaced_after_growing_pauses(run):
    actor = Actor(run, 0, settings(epsilon=1.0, actor_threads=1), make_exploding_env)
    run_actor_until(actor, lambda: actor.replaced >= 4, "four replacements")
    times = [event["time"] for event in run.take_events()]
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert len(gaps) >= 3 and gaps[2] >= 0.7 and gaps[1] >= 0.3  # pauses of 0.1, 0.3, 0.7 s before restarts


def test_an_env_reward_that_is_no_finite_number_is_reported_and_never_sent(run):
    """A NaN reward reached the replay: DQN trained on it, and every weight of final.safetensors was NaN."""

    class NanRewardEnv(MaskedEnv):
        def step(self, action):
            obs, _, terminated, truncated, info = super().step(action)
            return obs, float("nan"), terminated, truncated, info

    actor = Actor(run, 0, settings(epsilon=1.0), lambda: NanRewardEnv())
    run_actor_until(actor, lambda: actor.replaced >= 1, "a replacement")
    events = run.take_events()
    assert events and "actor 0 thread 0's env returned reward nan at step 0 of its episode" in events[0]["error"]
    assert pop_transitions(run) == []
