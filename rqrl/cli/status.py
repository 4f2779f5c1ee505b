"""One screen for every run on a Redis (``rqrl status``): its learner's heartbeat and figures, its jobs,
the workers on its queue and what each runs, and its recent failures. Reads only; changes nothing."""

from __future__ import annotations

import collections
import datetime
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import redis
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from rqrl.engine.health import heartbeat_age
from rqrl.engine.keys import PREFIX, RunKeys
from rqrl.engine.leases import learner_alive
from rqrl.engine.rq_safety import RolloutJob, failed_registry, rollout_queue, started_registry
from rqrl.engine.run_config import SAMPLER_KIND, SEED_KIND, RunConfig
from rqrl.engine.supervisor import read_sideline_reports
from rqrl.engine.timings import protocol_timings
from rqrl.engine.worker_times import WORKER_TIME_PARTS
from rqrl.errors import RecordError

_Read = TypeVar("_Read")

RECENT_FAILURES = 3


@dataclass(frozen=True, kw_only=True)
class WorkerStatus:
    """One RQ worker on a run's queue."""

    name: str
    state: str
    current_job: str | None
    heartbeat_age: float | None
    """Seconds since its last heartbeat; None if it has none that parses."""

    @property
    def alive(self) -> bool:
        return self.heartbeat_age is not None and self.heartbeat_age <= protocol_timings().liveness


@dataclass(frozen=True, kw_only=True)
class RunStatus:
    """One run as Redis holds it."""

    run_name: str
    queue_name: str
    n_actors: int
    n_groups: int
    learner: dict[str, float] = field(default_factory=dict)
    """What the learner published with its last heartbeat: IMPALA's actors (RedisDistributedActors._learner_facts),
    the garage sampler and the SEED trainer each publish their own figures; only those are shown."""
    learner_deadline: bytes | str | None = None
    """The run's learner deadline as Redis holds it (RunKeys.learner_deadline); None: there is none."""
    extra: dict[str, str] = field(default_factory=dict)
    """The run record's ``extra``: its family's ``kind`` (none: IMPALA's actor groups), and for a SEED run what
    runs its ``actors`` (``processes`` of the trainer's own, or RQ ``jobs``)."""
    stopped: bool = False
    queued_rollouts: int | None = 0
    """Rollouts in the run's out-of-sync queue; None for the families whose learner reads none (sampler, SEED)."""
    jobs_queued: int = 0
    jobs_started: int = 0
    jobs_failed: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    """(job id, last line of its traceback) of its most recent failed jobs."""
    workers: list[WorkerStatus] = field(default_factory=list)
    worker_rates: dict[str, float] = field(default_factory=dict)
    """Each worker's env steps/s on this run, as its job last published it (within the liveness window)."""
    worker_times: dict[str, dict[str, float]] = field(default_factory=dict)
    """Where each worker's time went on this run (``read_worker_times``), where its jobs publish it."""
    problem: str | None = None
    """Why the run's record could not be read (junk a Redis writer left, a key of the wrong type); None: it was."""
    sidelined: dict[str, str] = field(default_factory=dict)
    """Workers that cannot run this run (wrong RQRL_SECRET, env code missing) and hand its jobs back: name -> why."""

    def learner_age(self, now: float) -> float | None:
        """Seconds since the learner's last heartbeat; None if it published none."""
        return now - self.learner["beat"] if "beat" in self.learner else None

    def learner_alive(self, now: float) -> bool:
        """Whether the learner's heartbeat deadline has not passed: ``rqrl health --run``'s answer
        (rqrl.engine.health.learner_is_healthy), so the two never disagree."""
        return learner_alive(self.learner_deadline, now)

    @property
    def local_actors(self) -> bool:
        """Whether the run's actors are processes its learner started itself (a SEED run without queue_name),
        not jobs on RQ workers: no queue, jobs or workers of its own to show."""
        return self.extra.get("kind") == SEED_KIND and self.extra.get("actors") == "processes"


def read_status(connection: redis.Redis, run_name: str | None = None) -> list[RunStatus]:
    """The status of ``run_name``, or of every run on this Redis, sorted by name."""
    if run_name is not None:
        names = [RunKeys(run_name).run_name]
    else:
        names = sorted({_text(key).split(":")[1] for key in connection.scan_iter(match=f"{PREFIX}:*:config")})
    runs = []
    for name in names:
        try:
            status = _read_run(connection, RunKeys(name))
        except (RecordError, ValueError, TypeError, KeyError, redis.ResponseError) as error:  # hides no other run
            status = RunStatus(run_name=name, queue_name="?", n_actors=0, n_groups=0, problem=str(error))
        if status is not None:
            runs.append(status)
    return runs


def _read_run(connection: redis.Redis, keys: RunKeys) -> RunStatus | None:
    with connection.pipeline(transaction=False) as pipe:
        pipe.get(keys.config)  # GET: a record of the wrong type is a problem to show, not a run to hide
        pipe.mget([keys.learner_deadline])  # as `rqrl health --run` reads it: one of the wrong type reads as none
        raw_config, (deadline,) = pipe.execute()
    if raw_config is None:
        return None
    config = RunConfig.from_json(raw_config)
    learner: dict[str, float] = {}
    for name, value in connection.hgetall(keys.learner).items():
        try:
            learner[_text(name)] = float(value)
        except ValueError:
            continue
    status = RunStatus(
        run_name=keys.run_name, queue_name=config.queue_name, n_actors=config.n_actors,
        n_groups=len(config.actor_groups), learner=learner, learner_deadline=deadline, extra=dict(config.extra),
        stopped=bool(connection.exists(keys.stopped)), queued_rollouts=None)
    if status.local_actors:  # no jobs, no workers: the queue in its record is a default no worker serves for it
        return status
    queue_name = config.queue_name
    published = read_published(connection, keys)
    queued, started, failed = ([job_id for job_id in job_ids if job_id.startswith(keys.job_id_prefix)]
                               for job_ids in (rollout_queue(queue_name, connection).get_job_ids(),
                                               started_registry(queue_name, connection).get_job_ids(cleanup=False),
                                               failed_registry(queue_name, connection).get_job_ids(cleanup=False)))
    recent = failed[-RECENT_FAILURES:]
    return replace(
        status, queued_rollouts=None if "kind" in config.extra else int(connection.llen(keys.trajectories)),
        jobs_queued=len(queued), jobs_started=len(started), jobs_failed=len(failed),
        failures=[(job_id, _failure(connection, job_id)) for job_id in recent],
        workers=read_workers(connection, queue_name), worker_rates=worker_rates(published),
        worker_times=worker_times(published),
        sidelined={name: report["error"] for name, report in read_sideline_reports(connection, keys).items()})


def _time_shares(shares: dict[str, float] | None) -> str:
    """`` (step 85%, encode 8%, push 7%, room 0%, weights 0%)``: where a worker's time went, largest first."""
    if not shares:
        return ""
    ordered = sorted(shares.items(), key=lambda item: -item[1])
    return " (" + ", ".join(f"{part} {100 * share:.0f}%" for part, share in ordered) + ")"


def read_workers(connection: redis.Redis, queue_name: str) -> list[WorkerStatus]:
    """The workers registered on ``queue_name``, from each one's hash (state, current job, heartbeat)."""
    worker_keys = sorted(_text(key) for key in connection.smembers(WORKERS_BY_QUEUE_KEY % queue_name))
    fields = ("state", "current_job", "last_heartbeat")
    with connection.pipeline(transaction=False) as pipe:
        for key in worker_keys:
            for name in fields:  # HGET, not HMGET: the learner's ACL user (docs/redis-security.md) has only HGET
                pipe.hget(key, name)
        values = pipe.execute()
    rows = [values[index:index + len(fields)] for index in range(0, len(values), len(fields))]
    now = datetime.datetime.now(datetime.UTC)
    workers = []
    for key, (state, current_job, heartbeat) in zip(worker_keys, rows, strict=True):
        age: float | None = heartbeat_age(heartbeat, now)
        age = None if age == float("inf") else age
        workers.append(WorkerStatus(name=key.removeprefix("rq:worker:"), state=_text(state) if state else "?",
                                    current_job=_text(current_job) if current_job else None, heartbeat_age=age))
    return workers


def read_worker_rates(connection: redis.Redis, keys: RunKeys, now: float | None = None) -> dict[str, float]:
    """Worker name -> env steps/s on the run, as published by its job (rqrl.maze.jobs) within the liveness window
    (ProtocolTimings.liveness); entries that do not parse are left out."""
    return worker_rates(read_published(connection, keys, now))


def read_worker_times(connection: redis.Redis, keys: RunKeys, now: float | None = None,
                      since: float | None = None) -> dict[str, dict[str, float]]:
    """Worker name -> the share of its time each part of its rollout loop took (WORKER_TIME_PARTS: weights, step,
    encode, push, room), over its last published window, for workers whose jobs publish them (a Maze actor
    group's); within the liveness window, as ``read_worker_rates``, and published at ``since`` (a time.time()) or
    later if given."""
    return worker_times(read_published(connection, keys, now, since))


def read_published(connection: redis.Redis, keys: RunKeys, now: float | None = None,
                   since: float | None = None) -> dict[str, dict[str, Any]]:
    """Worker name -> what its job last published in ``worker_rates`` (its steps/s, and its time shares where it
    publishes them), for entries published within the liveness window (and at ``since`` or later); one read, so a
    worker's rate and shares come from the same window. Entries that do not parse are left out."""
    now = time.time() if now is None else now
    liveness = protocol_timings().liveness
    found = {}
    for name, raw in connection.hgetall(keys.worker_rates).items():
        try:
            published = json.loads(raw)
            at = float(published["at"])
        except (ValueError, TypeError, KeyError, UnicodeDecodeError):
            continue
        if now - at <= liveness and (since is None or at >= since):
            found[_text(name)] = published
    return found


def worker_rates(published: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Worker name -> steps/s of ``read_published``'s entries (those without a number are left out)."""
    return _parsed(published, lambda entry: float(entry["steps_per_second"]))


def worker_times(published: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Worker name -> time shares of ``read_published``'s entries (those without all parts are left out)."""
    return _parsed(published, lambda entry: {part: float(entry["time"][part]) for part in WORKER_TIME_PARTS})


def _parsed(published: dict[str, dict[str, Any]], read: Callable[[dict[str, Any]], _Read]) -> dict[str, _Read]:
    found = {}
    for name, entry in published.items():
        try:
            found[name] = read(entry)
        except (ValueError, TypeError, KeyError):
            continue
    return found


def _failure(connection: redis.Redis, job_id: str) -> str:
    """The last line of a failed job's traceback, read as a RolloutJob with JSON."""
    try:
        result = RolloutJob.fetch(job_id, connection=connection).latest_result()
    except Exception as error:  # a job that vanished or does not parse: say so, never fail the screen
        return f"(cannot read it: {type(error).__name__})"
    lines = (result.exc_string or "").strip().splitlines() if result is not None else []
    return lines[-1] if lines else "(no traceback)"


def printable(text: str) -> str:
    """``text`` with control characters (terminal escape codes a Redis writer put in a worker's name, say) shown
    as escapes, never sent to the terminal.

    >>> print(printable("w1\\x1b[2J"))
    w1\\x1b[2J
    """
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def format_status(runs: list[RunStatus], now: float | None = None) -> str:
    """``rqrl status``'s screen."""
    now = time.time() if now is None else now
    if not runs:
        return "no rqrl runs on this Redis"
    blocks = []
    for run in runs:
        if run.problem is not None:
            blocks.append(f"run {printable(run.run_name)}: its record in Redis cannot be read "
                          f"({printable(run.problem)})")
            continue
        if run.local_actors:
            lines = [f"run {run.run_name}: SEED trainer, {run.n_actors} actors in {run.n_groups} actor process(es)"
                     + (", STOPPING" if run.stopped else ""), "  learner   " + _learner_line(run, now),
                     f"  workers   none on a queue: the trainer runs its {run.n_groups} actor process(es) itself"]
            blocks.append("\n".join(lines))
            continue
        lines = [f"run {run.run_name}: queue {run.queue_name}, {run.n_actors} actors in {run.n_groups} job(s)"
                 + (", STOPPING" if run.stopped else "")]
        lines.append("  learner   " + _learner_line(run, now))
        lines.append(f"  jobs      queued {run.jobs_queued}, started {run.jobs_started}, failed {run.jobs_failed}"
                     + _jobs_note(run))
        alive = [worker for worker in run.workers if worker.alive]
        lines.append(f"  workers   {len(alive)} alive of {len(run.workers)} registered on queue {run.queue_name}")
        keys = RunKeys(run.run_name)
        for worker in run.workers:
            job = worker.current_job
            group = keys.group_of_job(job) if job else None
            doing = (f"group {group} of this run ({job})" if group is not None else f"{job}" if job else "idle")
            age = f"{worker.heartbeat_age:.0f} s ago" if worker.heartbeat_age is not None else "never"
            rate = run.worker_rates.get(worker.name)
            lines.append(f"    {printable(worker.name)}  {printable(worker.state)}  {printable(doing)}  "
                         f"heartbeat {age}"
                         + (f"  {rate:,.0f} steps/s" if rate is not None else "")
                         + _time_shares(run.worker_times.get(worker.name))
                         + ("" if worker.alive else "  (no recent heartbeat)")
                         + ("  SIDELINED (see below)" if worker.name in run.sidelined else ""))
        for name, reason in sorted(run.sidelined.items()):
            lines.append(f"  sidelined {printable(name)} hands this run's jobs back: {printable(reason)}")
        for job_id, line in run.failures:
            lines.append(f"  failed    {printable(job_id)}: {printable(line)}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _jobs_note(run: RunStatus) -> str:
    """What follows the job counts: the rollouts waiting in the run's queue where its learner reads one."""
    if run.queued_rollouts is not None:
        return f"; rollouts waiting for the learner {run.queued_rollouts}"
    if run.extra.get("kind") == SAMPLER_KIND:
        return " (a sampler's jobs run only during its obtain_* calls)"
    return ""


def _learner_line(run: RunStatus, now: float) -> str:
    """Whether the learner is alive (as ``rqrl health --run`` says), its last heartbeat, and the figures it
    published with it: only those, never a 0 for one it does not publish."""
    age = run.learner_age(now)
    heartbeat = f", heartbeat {age:.1f} s ago" if age is not None else ""
    if run.learner_alive(now):
        deadline = _number(run.learner_deadline)
        state = "alive" + (heartbeat or ("" if deadline is None else f", heartbeat deadline in {deadline - now:.0f} s"))
    elif run.learner_deadline is not None:
        state = "GONE (past its learner_timeout: jobs stop)" + heartbeat
    elif age is None:
        return "no heartbeat yet"
    else:
        state = "GONE (its heartbeat deadline is no longer in Redis)" + heartbeat
    figures = _learner_figures(run.learner)
    return state + "; " + ("; ".join(figures) if figures else "no figures published")


def _number(value: bytes | str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _learner_figures(learner: dict[str, float]) -> list[str]:
    """The learner line's groups of figures, each figure only where the learner published what it needs (IMPALA
    publishes all but train steps, episodes and the sampler call; the sampler and the SEED trainer fewer)."""
    get = collections.defaultdict(float, learner)  # every part is formatted; those whose figures are absent are dropped
    per_second = "" if "steps_per_second_10s" in learner else " steps/s"
    groups: list[list[tuple[tuple[str, ...], str]]] = [
        [(("env_steps",), f"env steps {get['env_steps']:,.0f}"),
         (("steps_per_second_10s",), f"{get['steps_per_second_10s']:,.0f} steps/s (10 s)"),
         (("steps_per_second_60s",), f"{get['steps_per_second_60s']:,.0f}{per_second} (60 s)")],
        [(("policy_version",), f"policy version {get['policy_version']:.0f}"),
         (("sampler_version",), f"sampler call {get['sampler_version']:.0f}"),
         (("lag_mean", "lag_max"), f"lag {get['lag_mean']:.1f} mean / {get['lag_max']:.0f} max")],
        [(("train_steps",), f"train steps {get['train_steps']:,.0f}"),
         (("episodes",), f"episodes {get['episodes']:,.0f}")],
        [(("queue_size", "queue_bound"), f"queue {get['queue_size']:.0f}/{get['queue_bound']:.0f}")],
        [(("records_rejected",), f"records rejected {get['records_rejected']:.0f}")],
    ]
    shown = (", ".join(text for names, text in group if all(name in learner for name in names)) for group in groups)
    return [text for text in shown if text]
