"""rqrl status's screen, from a RunStatus (tests/e2e/test_train.py reads one from a live run)."""

from __future__ import annotations

import json
from dataclasses import replace

import fakeredis

from rqrl.cli.status import (
    RunStatus,
    WorkerStatus,
    format_status,
    read_worker_rates,
)
from rqrl.engine.keys import RunKeys
from rqrl.engine.run_config import SAMPLER_KIND, SEED_KIND


def test_the_screen_shows_learner_jobs_workers_and_failures():
    run = RunStatus(
        run_name="r1", queue_name="rqrl", n_actors=4, n_groups=2, learner_deadline=b"400.000",
        learner={"beat": 100.0, "learner_timeout": 300.0, "env_steps": 12345, "steps_per_second_10s": 1500.4,
                 "steps_per_second_60s": 1400, "policy_version": 42, "lag_mean": 1.25, "lag_max": 3,
                 "queue_size": 2, "queue_bound": 8, "records_rejected": 0},
        jobs_queued=1, jobs_started=1, jobs_failed=1, queued_rollouts=2,
        failures=[("rqrl_r1_g1_r9", "ValueError: bad env")],
        workers=[WorkerStatus(name="w1", state="busy", current_job="rqrl_r1_g0_r17", heartbeat_age=1.5),
                 WorkerStatus(name="w2", state="idle", current_job=None, heartbeat_age=600.0),
                 WorkerStatus(name="w3", state="busy", current_job="rqrl_r1_g1_r0_a1b2", heartbeat_age=1.0)],
        worker_rates={"w1": 20512.6},
        worker_times={"w1": {"weights": 0.001, "step": 0.85, "encode": 0.08, "push": 0.06, "room": 0.009}},
        sidelined={"w3": "this worker cannot verify run 'r1''s signed payload"},
    )
    screen = format_status([run], now=101.5)
    assert screen.splitlines() == [
        "run r1: queue rqrl, 4 actors in 2 job(s)",
        "  learner   alive, heartbeat 1.5 s ago; env steps 12,345, 1,500 steps/s (10 s), 1,400 (60 s); policy "
        "version 42, lag 1.2 mean / 3 max; queue 2/8; records rejected 0",
        "  jobs      queued 1, started 1, failed 1; rollouts waiting for the learner 2",
        "  workers   2 alive of 3 registered on queue rqrl",
        "    w1  busy  group 0 of this run (rqrl_r1_g0_r17)  heartbeat 2 s ago  20,513 steps/s (step 85%, encode 8%, "
        "push 6%, room 1%, weights 0%)",
        "    w2  idle  idle  heartbeat 600 s ago  (no recent heartbeat)",
        "    w3  busy  group 1 of this run (rqrl_r1_g1_r0_a1b2)  heartbeat 1 s ago  SIDELINED (see below)",
        "  sidelined w3 hands this run's jobs back: this worker cannot verify run 'r1''s signed payload",
        "  failed    rqrl_r1_g1_r9: ValueError: bad env",
    ]


def test_a_learner_past_its_timeout_shows_as_gone():
    run = RunStatus(run_name="r2", queue_name="rqrl", n_actors=1, n_groups=1, stopped=True,
                    learner={"beat": 0.0, "learner_timeout": 10.0}, learner_deadline=b"10.000")
    screen = format_status([run], now=60.0)
    assert "STOPPING" in screen.splitlines()[0]
    assert "GONE (past its learner_timeout" in screen


def test_the_learner_is_alive_while_its_deadline_holds_as_rqrl_health_says():
    """A sampler beats no heartbeat while its learner trains between calls, and published no figures before: the
    screen said "no heartbeat published yet" while `rqrl health` said alive. The deadline decides, as for health."""
    def learner_line(**fields) -> str:
        run = RunStatus(run_name="r", queue_name="rqrl", n_actors=1, n_groups=1, **fields)
        return format_status([run], now=100.0).splitlines()[1]

    assert learner_line(learner_deadline=b"400.000") == (
        "  learner   alive, heartbeat deadline in 300 s; no figures published")
    assert learner_line(learner_deadline=b"400.000", learner={"beat": 40.0}) == (
        "  learner   alive, heartbeat 60.0 s ago; no figures published")
    assert learner_line(learner_deadline=b"junk") == "  learner   alive; no figures published"  # health: alive too
    assert learner_line(learner_deadline=b"99.000", learner={"beat": 40.0, "env_steps": 5.0}) == (
        "  learner   GONE (past its learner_timeout: jobs stop), heartbeat 60.0 s ago; env steps 5")
    assert learner_line(learner={"beat": 99.0}) == (
        "  learner   GONE (its heartbeat deadline is no longer in Redis), heartbeat 1.0 s ago; no figures published")
    assert learner_line() == "  learner   no heartbeat yet"


def test_a_sampler_shows_only_the_figures_it_published():
    """PPO's sampler publishes no lag, queue or policy version: the screen made up 0 for each."""
    run = RunStatus(run_name="ppoh", queue_name="rqrl", n_actors=8, n_groups=1, learner_deadline=b"400.000",
                    extra={"kind": SAMPLER_KIND}, queued_rollouts=None,
                    learner={"beat": 99.5, "learner_timeout": 300.0, "env_steps": 40960.0, "sampler_version": 11.0,
                             "records_rejected": 0.0, "steps_per_second_10s": 5012.3, "steps_per_second_60s": 4900.0})
    assert format_status([run], now=100.0).splitlines()[1:3] == [
        "  learner   alive, heartbeat 0.5 s ago; env steps 40,960, 5,012 steps/s (10 s), 4,900 (60 s); sampler call "
        "11; records rejected 0",
        "  jobs      queued 0, started 0, failed 0 (a sampler's jobs run only during its obtain_* calls)",
    ]
    first = replace(run, learner={"beat": 99.5, "env_steps": 0.0, "sampler_version": 0.0})  # no rate yet
    assert format_status([first], now=100.0).splitlines()[1] == (
        "  learner   alive, heartbeat 0.5 s ago; env steps 0; sampler call 0")


def test_a_seed_run_with_its_own_actor_processes_says_so_instead_of_zero_workers():
    run = RunStatus(run_name="dqn1", queue_name="rqrl", n_actors=6, n_groups=2, learner_deadline=b"160.000",
                    extra={"kind": SEED_KIND, "actors": "processes"}, queued_rollouts=None,
                    learner={"beat": 99.8, "learner_timeout": 60.0, "policy_version": 12.0, "env_steps": 70000.0,
                             "steps_per_second_10s": 701.0, "steps_per_second_60s": 698.4, "train_steps": 1500.0,
                             "episodes": 320.0, "records_rejected": 0.0})
    assert format_status([run], now=100.0).splitlines() == [
        "run dqn1: SEED trainer, 6 actors in 2 actor process(es)",
        "  learner   alive, heartbeat 0.2 s ago; env steps 70,000, 701 steps/s (10 s), 698 (60 s); policy version 12; "
        "train steps 1,500, episodes 320; records rejected 0",
        "  workers   none on a queue: the trainer runs its 2 actor process(es) itself",
    ]
    jobs = replace(run, extra={"kind": SEED_KIND, "actors": "jobs"}, queue_name="gpu-box")  # its actors are RQ jobs
    assert format_status([jobs], now=100.0).splitlines()[2:4] == [
        "  jobs      queued 0, started 0, failed 0", "  workers   0 alive of 0 registered on queue gpu-box"]


def test_no_runs():
    assert format_status([]) == "no rqrl runs on this Redis"


def test_worker_rates_older_than_liveness_or_malformed_are_left_out():
    connection = fakeredis.FakeRedis()
    keys = RunKeys("r1")
    connection.hset(keys.worker_rates, mapping={
        "fresh": json.dumps({"steps_per_second": 1234.5, "at": 1000.0}),
        "stale": json.dumps({"steps_per_second": 99.0, "at": 900.0}),
        "junk": "not json", "no-rate": json.dumps({"at": 1000.0}), "text-rate": json.dumps({"steps_per_second": "x",
                                                                                          "at": 1000.0})})
    # with the tests' timings (RQRL_TIME_SCALE=0.1) the liveness window is 2 s: 1 s old is fresh, 100 s stale
    assert read_worker_rates(connection, keys, now=1001.0) == {"fresh": 1234.5}
