"""The SEED trainer end to end, with a real Redis and real actor and server processes: start(duration) returns
having left no process or key, nothing is lost under a slow learner, killed actors and servers are replaced.

The tests here start processes; the in-process ones are in tests/integration/test_trainer.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import pytest

from rqrl.engine.keys import RunKeys
from rqrl.errors import ProcessesDiedError, SignatureError
from rqrl.seed import Config, Trainer
from rqrl.seed.agent import Agent
from rqrl.seed.store import SeedRun
from tests.children import alive
from tests.conftest import TEST_SECRET
from tests.integration.test_trainer import config  # noqa: F401 - shared with the in-process tests
from tests.polling import wait_until
from tests.seed_fixtures import (
    SlowAgent,
    cartpole_agent,
    make_cartpole,
    make_flaky_env,
    make_misspelt_env,
    mlp_failing_in_children,
)


def pushed(connection, run_name) -> int:
    """Transitions the run's actors pushed so far (their counter in Redis)."""
    return int(connection.hget(f"rqrl:{run_name}:seed:stats", "pushed") or 0)


def assert_nothing_left(trainer, connection, run_name, pids):
    assert not trainer.processes
    assert [pid for pid in pids if alive(pid)] == []
    assert list(connection.scan_iter(match=f"rqrl:{run_name}:*")) == []


@pytest.mark.timeout(60)
def test_start_returns_after_duration_leaving_no_process_or_key(redis_url, connection, run_name):
    trainer = Trainer(cartpole_agent(), config(redis_url, run_name), make_cartpole)
    started = time.monotonic()
    trainer.start(3.0)
    assert time.monotonic() - started >= 3.0
    assert len(trainer.started_pids) == 2 and all(trainer.started_pids)  # one server, one actor process
    assert_nothing_left(trainer, connection, run_name, trainer.started_pids)


def test_redis_url_and_rqrl_secret_configure_a_trainer_without_arguments(redis_url, connection, run_name,
                                                                          monkeypatch):
    monkeypatch.setenv("REDIS_URL", redis_url)  # and RQRL_SECRET, the test secret (conftest)
    commands_before = connection.info("stats")["total_commands_processed"]
    trainer = Trainer(cartpole_agent(), config(None, run_name, secret=None), make_cartpole)
    trainer.start(3.0)
    assert trainer.stats.transitions_received > 0
    assert connection.info("stats")["total_commands_processed"] - commands_before > 100, "it ran on REDIS_URL's Redis"
    assert_nothing_left(trainer, connection, run_name, trainer.started_pids)


@pytest.mark.timeout(90)
def test_no_transition_is_lost_under_a_slow_learner(redis_url, connection, run_name):
    agent = cartpole_agent()
    agent.__class__ = SlowAgent  # the actors outrun the learner until they find the list full

    def actors_waited():
        return int(connection.hget(f"rqrl:{run_name}:seed:stats", "full_waits") or 0) > 0

    agent.block_until = actors_waited

    def stop_after_three_steps(trainer):
        if trainer.stats.train_steps >= 3:
            trainer.stop()

    trainer = Trainer(agent, config(redis_url, run_name, transition_queue_size=2, minimum_buffer_size=20),
                      make_cartpole, on_progress=stop_after_three_steps, progress_seconds=0.05)
    trainer.start(60.0)
    stats = trainer.stats
    assert stats.train_steps >= 3 and stats.counters.get("full_waits", 0) > 0, stats  # the actors waited
    assert stats.counters["pushed"] == stats.transitions_received == agent.replay.added > 0
    assert stats.messages_rejected == 0 and stats.restarts == []
    assert_nothing_left(trainer, connection, run_name, trainer.started_pids)


@pytest.mark.timeout(90)
def test_with_drop_when_full_a_slow_learner_makes_actors_drop_and_the_trainer_reports_it(redis_url, connection,
                                                                                        run_name, caplog):
    agent = cartpole_agent()
    agent.__class__ = SlowAgent  # the actors outrun the learner until they find the list full and drop

    def actors_dropped():
        return int(connection.hget(f"rqrl:{run_name}:seed:stats", "transitions_dropped") or 0) > 0

    agent.block_until = actors_dropped

    def stop_once_reported(trainer):
        if trainer.stats.train_steps >= 3 and trainer.stats.transitions_dropped > 0:
            trainer.stop()

    trainer = Trainer(agent, config(redis_url, run_name, transition_queue_size=2, minimum_buffer_size=20,
                                    drop_when_full=True),
                      make_cartpole, on_progress=stop_once_reported, progress_seconds=0.05)
    with caplog.at_level("WARNING", logger="rqrl.seed"):
        trainer.start(60.0)
    stats = trainer.stats
    assert stats.transitions_dropped == stats.counters["transitions_dropped"] > 0, stats
    assert "full_waits" not in stats.counters, stats  # nobody waited
    assert stats.counters["pushed"] == stats.transitions_received == agent.replay.added > 0
    assert any("dropped" in record.getMessage() and "drop_when_full=True" in record.getMessage()
               for record in caplog.records), caplog.text
    assert_nothing_left(trainer, connection, run_name, trainer.started_pids)


@pytest.mark.timeout(150)
def test_a_killed_server_and_a_killed_actor_are_replaced(redis_url, connection, run_name, caplog):
    trainer = Trainer(cartpole_agent(), config(redis_url, run_name, epsilon=0.0, max_train_frequency=20),
                      make_cartpole)
    thread = threading.Thread(target=trainer.start, args=(90.0,), daemon=True)
    thread.start()

    def pid_of(name):
        process = trainer.processes.get(name)
        return process.pid if process is not None and process.is_alive() else None

    try:
        wait_until(lambda: pushed(connection, run_name) > 20, 60, message="transitions to flow")
        killed = {name: pid_of(name) for name in ("server-0", "actor-0")}
        os.kill(killed["server-0"], signal.SIGKILL)
        wait_until(lambda: pid_of("server-0") not in (None, killed["server-0"]), 20, message="a new server")
        before = pushed(connection, run_name)
        wait_until(lambda: pushed(connection, run_name) > before + 20, 30,
                   message="transitions after the server's restart")
        os.kill(killed["actor-0"], signal.SIGKILL)
        wait_until(lambda: pid_of("actor-0") not in (None, killed["actor-0"]), 20, message="a new actor")
        before = pushed(connection, run_name)
        wait_until(lambda: pushed(connection, run_name) > before + 20, 30,
                   message="transitions after the actor's restart")
    finally:
        trainer.stop()
        thread.join(30)
    assert not thread.is_alive()
    restarts = trainer.stats.restarts
    assert any("server-0" in line and "SIGKILL" in line for line in restarts), restarts
    assert any("actor-0" in line and "SIGKILL" in line for line in restarts), restarts
    assert "restarted server-0" in caplog.text
    assert trainer.stats.counters["pushed"] == trainer.stats.transitions_received
    assert len(trainer.started_pids) >= 4 and set(killed.values()) <= set(trainer.started_pids)
    assert_nothing_left(trainer, connection, run_name, trainer.started_pids)


@pytest.mark.timeout(60)
def test_a_batch_size_no_batch_can_reach_is_warned_of_and_batches_fill_anyway(redis_url, connection, run_name,
                                                                               caplog):
    """One actor process of 2 threads and inference_batchsize=4: the server waited inference_delay for every batch
    (batches_delay only, 225 CartPole steps in 12 s); it now batches the 2 observations that can wait at once."""
    trainer = Trainer(cartpole_agent(), config(redis_url, run_name, inference_batchsize=4, inference_delay=0.2,
                                               epsilon=0.0), make_cartpole)
    with caplog.at_level("WARNING", logger="rqrl.seed"):
        trainer.start(4.0)
    assert "inference_batchsize=4 exceeds the 2 observation(s)" in caplog.text
    counters = trainer.stats.counters
    assert counters.get("batches_full", 0) > counters.get("batches_delay", 0), counters
    assert_nothing_left(trainer, connection, run_name, trainer.started_pids)


@pytest.mark.timeout(90)
def test_an_embedded_redis_that_dies_is_said_at_once_not_waited_for(run_name, monkeypatch):
    from rqrl import RedisUnavailableError

    monkeypatch.delenv("REDIS_URL", raising=False)

    def kill_redis_once_training(trainer):
        if trainer.stats.transitions_received and trainer._embedded.process.poll() is None:
            trainer._embedded.process.kill()
            killed.append(time.monotonic())

    killed: list[float] = []
    trainer = Trainer(cartpole_agent(), config(None, run_name), make_cartpole, on_progress=kill_redis_once_training,
                      progress_seconds=0.2)
    with pytest.raises(RedisUnavailableError, match=r"the embedded redis-server \(pid \d+\) exited with code -9"):
        trainer.start(60.0)
    assert killed and time.monotonic() - killed[0] < 20, "it rode out the 60 s outage window for a dead server"
    assert [pid for pid in trainer.started_pids if alive(pid)] == []


@pytest.mark.timeout(90)
def test_max_train_frequency_caps_train_steps(redis_url, connection, run_name):
    first_step: list[float] = []

    def stop_two_seconds_into_training(trainer):
        if trainer.stats.train_steps and not first_step:
            first_step.append(time.monotonic())
        if first_step and time.monotonic() > first_step[0] + 2:
            trainer.stop()

    trainer = Trainer(cartpole_agent(), config(redis_url, run_name, minimum_buffer_size=1, max_train_frequency=5),
                      make_cartpole, on_progress=stop_two_seconds_into_training, progress_seconds=0.05)
    trainer.start(60.0)
    training_seconds = time.monotonic() - first_step[0]
    assert 1 < trainer.stats.train_steps <= 5 * training_seconds + 2


@pytest.mark.timeout(90)
def test_replay_ratio_caps_samples_trained_per_transition_received(redis_url, connection, run_name):
    ratios: list[float] = []

    def watch(trainer):
        stats = trainer.stats
        if stats.train_steps:
            ratios.append(stats.train_steps * trainer.agent.config.batch_size / stats.transitions_received)
        if stats.train_steps >= 30:
            trainer.stop()

    agent = cartpole_agent()
    trainer = Trainer(agent, config(redis_url, run_name, minimum_buffer_size=1, replay_ratio=0.5), make_cartpole,
                      on_progress=watch, progress_seconds=0.05)
    trainer.start(60.0)
    assert trainer.stats.train_steps >= 30, "training ran, within the ratio"
    # the learner alone would run hundreds of train steps per second of 16 samples, far above 0.5 per transition
    assert ratios and max(ratios) <= 0.5, ratios
    assert trainer.stats.train_steps * agent.config.batch_size <= 0.5 * trainer.stats.transitions_received


def test_servers_that_keep_dying_at_start_make_start_raise_with_the_cause(redis_url, connection, run_name):
    agent = Agent(cartpole_agent().config, mlp_failing_in_children)
    trainer = Trainer(agent, config(redis_url, run_name), make_cartpole)
    started = time.monotonic()
    with pytest.raises(ProcessesDiedError, match=r"server-0 \(pid \d+\), which exited with code 1, 5 times before "
                                                 r"the first transition") as raised:
        trainer.start(120)
    assert time.monotonic() - started < 60, "start() waited out its duration instead of giving up"
    assert "if __name__ == '__main__':" in str(raised.value)
    assert_nothing_left(trainer, connection, run_name, trainer.started_pids)


def test_actor_threads_that_keep_dying_at_start_make_start_raise_with_the_cause(redis_url, connection, run_name):
    trainer = Trainer(cartpole_agent(), config(redis_url, run_name), make_misspelt_env)
    started = time.monotonic()
    with pytest.raises(ProcessesDiedError, match=r"every thread of actor \d died 5 times or more before the first "
                                                 r"transition arrived, actor \d's thread \d+ last with .*NameNotFound"
                       ) as raised:
        trainer.start(120)
    assert time.monotonic() - started < 60, "start() waited out its duration instead of giving up"
    assert "Check the environment factory" in str(raised.value)
    assert_nothing_left(trainer, connection, run_name, trainer.started_pids)


def test_an_env_that_fails_to_start_now_and_then_does_not_stop_the_run(redis_url, connection, run_name):
    """Threads whose env failed to start die and are replaced, over and over for some, but the others step: the
    run trains (a give-up counted per thread failed such runs)."""
    trainer = Trainer(cartpole_agent(), config(redis_url, run_name, minimum_buffer_size=50), make_flaky_env)
    trainer.start(8.0)
    assert trainer.stats.transitions_received > 0 and trainer.stats.train_steps > 0
    assert any("the simulator did not start this time" in line for line in trainer.stats.restarts)
    assert_nothing_left(trainer, connection, run_name, trainer.started_pids)


@pytest.mark.timeout(120)
def test_replayed_messages_and_junk_replies_from_a_redis_writer_train_nothing_and_kill_no_thread(
        redis_url, connection, run_name):
    """Issue 24, items 2 and 5, with real actor and server processes: while the run trains, a Redis writer
    without the secret pushes every transition message it sees 20 more times and junk onto the actors' reply
    lists. The trainer trains exactly what the actors pushed, refuses every copy, and no actor thread dies."""
    transitions, requests = f"rqrl:{run_name}:seed:transitions", f"rqrl:{run_name}:seed:requests"
    attacks = {"copies": 0, "junk replies": 0}
    copied: set[bytes] = set()

    def attack(trainer):
        for message in connection.lrange(transitions, 0, -1):
            if message not in copied:  # each message 20 times, not the copies again
                copied.add(message)
                connection.rpush(transitions, *[message] * 20)
                attacks["copies"] += 20
        for request in connection.lrange(requests, 0, -1):
            for reply in set(re.findall(rb'"reply":"(rqrl:[^"]+)"', request)):
                connection.rpush(reply, os.urandom(48), b"\x00" * 8)
                attacks["junk replies"] += 2

    trainer = Trainer(cartpole_agent(), config(redis_url, run_name, inference_delay=0.05), make_cartpole,
                      on_progress=attack, progress_seconds=0.05)
    trainer.start(8.0)
    stats = trainer.stats
    assert attacks["copies"] > 0 and attacks["junk replies"] > 0, f"the attack found nothing to copy: {attacks}"
    assert stats.transitions_received == stats.counters["pushed"] > 0, "a replayed message was trained"
    assert stats.messages_rejected >= 1
    assert stats.restarts == [], f"an actor thread or process died of the junk: {stats.restarts}"
    assert_nothing_left(trainer, connection, run_name, trainer.started_pids)


@pytest.mark.timeout(120)
def test_junk_events_and_a_wrong_typed_counter_neither_crash_the_trainer_nor_stop_the_actors(
        redis_url, connection, run_name):
    """Issue 24, item 4, with real processes: events that are no event and a counter that is no integer,
    written while the run trains, are refused; transitions keep arriving and the run ends clean."""
    events, stats_key = f"rqrl:{run_name}:seed:events", f"rqrl:{run_name}:seed:stats"
    received_at_attack: list[int] = []

    def attack(trainer):
        if not received_at_attack and trainer.stats.transitions_received > 0:
            connection.rpush(events, b"not json", b"[1]", b'{"kind": 3}')
            connection.hset(stats_key, "pushed", "abc")
            received_at_attack.append(trainer.stats.transitions_received)

    trainer = Trainer(cartpole_agent(), config(redis_url, run_name), make_cartpole, on_progress=attack,
                      progress_seconds=0.1)
    trainer.start(8.0)
    assert received_at_attack, "the run never received a transition to attack after"
    assert trainer.stats.transitions_received > received_at_attack[0] + 100, "transitions stopped after the junk"
    assert trainer.stats.restarts == []
    assert_nothing_left(trainer, connection, run_name, trainer.started_pids)


@pytest.mark.timeout(150)
def test_rewritten_settings_start_no_process_and_train_nothing(redis_url, connection, run_name):
    """Issue 24, item 3, with real processes: a Redis writer rewrites seed:settings as it appears (gamma 1.0,
    epsilon 1.0, n_step 10), then the actor process dies: each replacement refuses the unsigned settings and
    exits, so no transition made under them reaches the trainer."""
    trainer = Trainer(cartpole_agent(), config(redis_url, run_name), make_cartpole)
    thread = threading.Thread(target=trainer.start, args=(90.0,), daemon=True)
    thread.start()

    try:
        wait_until(lambda: pushed(connection, run_name) > 20, 60, message="transitions to flow")
        connection.set(f"rqrl:{run_name}:seed:settings", json.dumps(
            {**Config().process_settings(), "actor_processes": 1, "n_actions": 2, "gamma": 1.0, "epsilon": 1.0,
             "n_step": 10}))
        actor = trainer.processes["actor-0"]
        os.kill(actor.pid, signal.SIGKILL)
        wait_until(lambda: sum("actor-0" in line for line in trainer.stats.restarts) >= 3, 60,
                   message=lambda: f"replacements of actor-0 to refuse the settings: {trainer.stats.restarts}")
        received = trainer.stats.transitions_received
        time.sleep(2.0)  # the point: no replacement ever runs, so nothing more arrives
        assert trainer.stats.transitions_received == received
        with pytest.raises(SignatureError, match="unsigned"):  # what each replacement met when it read them
            SeedRun.attach(connection, RunKeys(run_name), TEST_SECRET).settings()
    finally:
        trainer.stop()
        thread.join(30)
    assert not thread.is_alive()
    restarts = trainer.stats.restarts
    assert any("actor-0" in line and "exited with code 1" in line for line in restarts), restarts
    assert_nothing_left(trainer, connection, run_name, trainer.started_pids)
