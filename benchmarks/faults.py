"""Worker faults during a learner's run: what is delivered, lost or doubled, and how long actors stall.

Each scenario starts a private redis-server (``EmbeddedRedis``), ``--workers`` external
``rqrl worker`` processes and a ``RedisDistributedActors`` run on them (CartPole-v1, a
Linear(4,64)-Tanh-Linear(64,2) policy, 32-step rollouts, 8 actors, one actor per job, batches of
4, ``min_job_seconds=0.2``). The learner collects continuously and re-broadcasts its weights after
every collect, while a fault thread hurts the workers every ``--period`` seconds:

* ``kill-half``: SIGKILL half of the live workers (a lost machine; no clean-up), start as many
  replacements 3 s later;
* ``kill-one``: SIGKILL one random worker and start a replacement at once;
* ``stop-gracefully``: SIGTERM one random worker (RQ's warm shutdown: it finishes its job) and
  start a replacement at once;
* ``restart-learner``: the learner dies while training on the batch it just received (its
  connection closed, no ``stop()``: the run's keys, jobs and that batch stay in Redis) and a new
  learner resumes the run with ``resume=True``. The dead learner's last batch is not counted as
  delivered, since it was never trained on: it must come again from the new learner.

Faults are injected during ``--seconds``; the learner then collects for ``--settle`` more seconds
without new faults, so that the groups hit by the last fault can come back before the counts are
made. Per scenario it reports faults (workers signalled), rollouts delivered, duplicates (an
``(actor_id, rollout_id)`` delivered twice), gaps (rollout ids missing inside an actor's delivered
range, i.e. started but never delivered: "lost"), the longest stall of any actor (the most seconds
between consecutive deliveries of one actor, counting from its first delivery to the end of the
run), the groups the learner's reaper re-ran, records rejected, and env steps per second.

Run from the repository root::

    python benchmarks/faults.py --seconds 60 --period 10 --workers 4
"""

from __future__ import annotations

import argparse
import collections
import functools
import logging
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium
import redis
import torch

import rqrl
from rqrl import MissingStatsError, RedisDistributedActors, RolloutEvents, RqrlError
from rqrl.engine.server import EmbeddedRedis

log = logging.getLogger("faults")

REPO_ROOT = Path(__file__).resolve().parents[1]
ENV_ID = "CartPole-v1"
SCENARIOS = ("kill-half", "kill-one", "stop-gracefully", "restart-learner")
N_ACTORS = 8
N_ROLLOUT_STEPS = 32
BATCH_SIZE = 4
QUEUE_FACTOR = 2.0
ACTORS_PER_JOB = 1
MIN_JOB_SECONDS = 0.2
KILL_HALF_RESTART_DELAY = 3.0
QUEUE_NAME = "rqrl"
MARKER_VARIABLE = "RQRL_FAULTS_MARKER"

# module level, so workers can import it by name from the cloudpickled reference
make_env = functools.partial(gymnasium.make, ENV_ID)


def make_policy() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))


# ---- worker processes --------------------------------------------------------------------


class WorkerPool:
    """``rqrl worker`` subprocesses on one Redis; thread-safe; ``stop_all`` always leaves none running.

    Every worker's environment carries ``MARKER_VARIABLE=marker`` so that leftovers (of this pool,
    or anything they started) can be found in /proc afterwards.
    """

    def __init__(self, redis_url: str, marker: str, log_dir: Path):
        self.redis_url = redis_url
        self.marker = marker
        self.log_dir = log_dir
        self._lock = threading.Lock()
        self._live: dict[str, subprocess.Popen] = {}
        self._signalled: list[tuple[str, subprocess.Popen]] = []
        self._started = 0
        self.unexpected_exits: list[str] = []

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env.pop("REDIS_URL", None)
        env[MARKER_VARIABLE] = self.marker
        return env

    def start(self) -> str:
        with self._lock:
            name = f"faults-{self.marker[:6]}-w{self._started}"
            self._started += 1
            command = [sys.executable, "-m", "rqrl", "worker", "--redis-url", self.redis_url, "--name", name,
                       "--log-level", "WARNING"]
            with open(self.log_dir / f"{name}.log", "wb") as stderr:
                self._live[name] = subprocess.Popen(command, cwd=REPO_ROOT, env=self._env(), stdin=subprocess.DEVNULL,
                                                    stdout=subprocess.DEVNULL, stderr=stderr)
            return name

    def live_names(self) -> list[str]:
        """Workers started and not signalled by us; logs any that exited on their own."""
        with self._lock:
            for name, process in list(self._live.items()):
                if process.poll() is not None:
                    del self._live[name]
                    self.unexpected_exits.append(f"{name} (exit code {process.returncode})")
                    log.warning("    worker %s exited on its own with code %s: %s", name, process.returncode,
                                self.log_tail(name))
            return sorted(self._live)

    def signal(self, name: str, signum: int) -> None:
        with self._lock:
            process = self._live.pop(name)
            process.send_signal(signum)
            self._signalled.append((name, process))

    def log_tail(self, name: str, chars: int = 600) -> str:
        try:
            return (self.log_dir / f"{name}.log").read_text(errors="replace")[-chars:].strip()
        except OSError:
            return ""

    def stop_all(self, timeout: float = 15.0) -> None:
        """SIGTERM every worker still running, then SIGKILL whatever is left after ``timeout``."""
        with self._lock:
            processes = [*self._live.values(), *(process for _, process in self._signalled)]
            self._live.clear()
        for process in processes:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + timeout
        for process in processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("    worker pid %d ignored SIGTERM for %.0f s: SIGKILL", process.pid, timeout)
                process.kill()
                process.wait(timeout=5)


def processes_with_marker(marker: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds MARKER_VARIABLE=marker."""
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_registered(connection: redis.Redis, pool: WorkerPool, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while connection.scard(f"rq:workers:{QUEUE_NAME}") < count:
        if len(pool.live_names()) < count:
            raise RuntimeError(f"a worker exited at start: {pool.unexpected_exits}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} workers did not register within {timeout:.0f} s")
        time.sleep(0.05)


# ---- faults ------------------------------------------------------------------------------


class FaultInjector(threading.Thread):
    """Hurts the pool every ``period`` seconds until ``inject_until``; starts replacements until stopped."""

    def __init__(self, scenario: str, pool: WorkerPool, period: float, inject_until: float, rng: random.Random):
        super().__init__(name=f"faults-{scenario}", daemon=True)
        self.scenario, self.pool, self.period, self.inject_until, self.rng = scenario, pool, period, inject_until, rng
        self.stop_event = threading.Event()
        self.restart_learner = threading.Event()  # the learner loop restarts the learner when set
        self.faults = 0
        self.replacements = 0
        self.error: BaseException | None = None
        self._restarts: list[float] = []

    def run(self) -> None:
        try:
            next_fault = time.monotonic() + self.period
            while not self.stop_event.wait(0.05):
                now = time.monotonic()
                due = [at for at in self._restarts if at <= now]
                if due:
                    self._restarts = [at for at in self._restarts if at > now]
                    self._replace(len(due))
                if now >= next_fault and now < self.inject_until:
                    next_fault += self.period
                    self._inject()
        except BaseException as error:  # reported by the learner loop
            self.error = error
            log.exception("fault thread failed")

    def _replace(self, count: int) -> None:
        names = [self.pool.start() for _ in range(count)]
        self.replacements += count
        log.info("    started replacement worker(s) %s", ", ".join(names))

    def _inject(self) -> None:
        if self.scenario == "restart-learner":
            self.restart_learner.set()
            self.faults += 1
            log.info("    the learner dies")
            return
        live = self.pool.live_names()
        if not live:
            log.warning("    no live worker to hurt")
            return
        if self.scenario == "kill-half":
            victims = self.rng.sample(live, max(1, len(live) // 2))
            for name in victims:
                self.pool.signal(name, signal.SIGKILL)
            self._restarts.extend([time.monotonic() + KILL_HALF_RESTART_DELAY] * len(victims))
            self.faults += len(victims)
            log.info("    SIGKILL %s (%d of %d live); replacements in %.0f s", ", ".join(victims), len(victims),
                     len(live), KILL_HALF_RESTART_DELAY)
        else:
            victim = self.rng.choice(live)
            signum = signal.SIGKILL if self.scenario == "kill-one" else signal.SIGTERM
            self.pool.signal(victim, signum)
            self.faults += 1
            log.info("    %s %s", signal.Signals(signum).name, victim)
            self._replace(1)


# ---- one scenario ------------------------------------------------------------------------


@dataclass
class Result:
    scenario: str
    faults: int = 0
    replacements: int = 0
    rollouts: int = 0
    duplicates: int = 0
    gaps: int = 0
    longest_stall: float = 0.0
    stall_actor: int | None = None
    groups_rerun: int = 0
    records_rejected: int = 0
    steps: int = 0
    seconds: float = 0.0
    collects: int = 0
    actors_delivering: int = 0
    workers_alive_rqrl: int | None = None
    workers_alive_real: int | None = None
    unexpected_exits: list[str] = field(default_factory=list)
    error: str | None = None
    leftover_pids: list[int] = field(default_factory=list)
    learner_pause: float = 0.0
    episodes_cut: int = 0

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else float("nan")


def analyse(result: Result, delivered: list[tuple[int, int]], times: dict[int, list[float]], ended: float) -> None:
    """Duplicates, gaps and stalls from what the learner received."""
    counts = collections.Counter(delivered)
    result.rollouts = len(delivered)
    result.duplicates = sum(count - 1 for count in counts.values() if count > 1)
    per_actor: dict[int, set[int]] = collections.defaultdict(set)
    for actor, rollout in delivered:
        per_actor[actor].add(rollout)
    result.gaps = sum(max(ids) + 1 - len(ids) for ids in per_actor.values())
    result.actors_delivering = len(per_actor)
    for actor in range(N_ACTORS):
        stamps = times.get(actor, [])
        if not stamps:
            continue
        intervals = [later - earlier for earlier, later in zip(stamps, stamps[1:], strict=False)]
        stall = max([*intervals, ended - stamps[-1]])
        if stall > result.longest_stall:
            result.longest_stall, result.stall_actor = stall, actor


def run_scenario(scenario: str, args: argparse.Namespace, rng: random.Random) -> Result:
    result = Result(scenario)
    marker = uuid.uuid4().hex
    log_dir = Path(tempfile.mkdtemp(prefix="rqrl-faults-"))
    server = EmbeddedRedis().start()
    pool = WorkerPool(server.url, marker, log_dir)
    injector: FaultInjector | None = None
    connection = redis.Redis.from_url(server.url)
    try:
        for _ in range(args.workers):
            pool.start()
        wait_registered(connection, pool, args.workers)
        log.info("%s: %d workers registered; collecting for %g s with faults every %g s, then %g s without",
                 scenario, args.workers, args.seconds, args.period, args.settle)
        policy = make_policy()
        actors = make_actors(server.url, scenario, policy)
        retired: list[RedisDistributedActors] = []  # learners that died (restart-learner)
        delivered: list[tuple[int, int]] = []
        times: dict[int, list[float]] = collections.defaultdict(list)
        actors.start()
        try:
            actors.broadcast_updated_policy(policy.state_dict())

            def receive(record: rqrl.BatchedRecord, at: float) -> None:
                for actor, rollout in zip(record.actor_id.tolist(), record.rollout_id.tolist(), strict=True):
                    delivered.append((actor, rollout))
                    times[actor].append(at)

            # the first batch includes start-up (env construction, first weights): counted, not timed
            receive(actors.collect_outputs("cpu").record, time.monotonic())
            actors.broadcast_updated_policy(policy.state_dict())
            started = time.monotonic()
            injector = FaultInjector(scenario, pool, args.period, started + args.seconds, rng)
            injector.start()
            ends = started + args.seconds + args.settle
            next_report = started + args.report_every
            now = started
            try:
                while now < ends:
                    record = actors.collect_outputs("cpu").record
                    now = time.monotonic()
                    if injector.restart_learner.is_set():  # it dies before training on this batch
                        injector.restart_learner.clear()
                        retired.append(actors)
                        actors = restart_learner(actors, server.url, scenario, policy)
                        record = actors.collect_outputs("cpu").record
                        result.learner_pause = max(result.learner_pause, time.monotonic() - now)
                        now = time.monotonic()
                    receive(record, now)
                    result.steps += int(record.rewards.numel())
                    result.collects += 1
                    actors.broadcast_updated_policy(policy.state_dict())
                    if injector.error is not None:
                        raise RuntimeError(f"fault thread failed: {injector.error!r}")
                    if now >= next_report:
                        next_report += args.report_every
                        log.info("  %s t=%5.1f s: %6d rollouts, %7.0f steps/s, %d live workers, %d faults, "
                                 "%d group re-runs", scenario, now - started, len(delivered),
                                 result.steps / (now - started), len(pool.live_names()), injector.faults,
                                 _stat_sum(actors, RolloutEvents.groups_rerun))
            except RqrlError as error:
                result.error = f"{type(error).__name__}: {error}"
                log.error("  %s: collect_outputs raised %s", scenario, result.error)
            result.seconds = now - started
            injector.stop_event.set()
            injector.join(5)
            analyse(result, delivered, times, now)
            result.groups_rerun = sum(_stat_sum(learner, RolloutEvents.groups_rerun) for learner in [*retired, actors])
            result.episodes_cut = sum(_stat_sum(learner, RolloutEvents.episodes_cut) for learner in [*retired, actors])
            result.records_rejected = sum(learner.records_rejected for learner in [*retired, actors])
            result.workers_alive_rqrl = actors.workers_alive(cached=False)
            result.workers_alive_real = len(pool.live_names())
        finally:
            actors.stop()
        result.faults, result.replacements = injector.faults, injector.replacements
        result.unexpected_exits = list(pool.unexpected_exits)
    finally:
        if injector is not None:
            injector.stop_event.set()
            injector.join(5)
        pool.stop_all()
        connection.close()
        redis_pid = server.process.pid if server.process is not None else None
        server.stop()
        result.leftover_pids = processes_with_marker(marker)
        if redis_pid is not None and _alive(redis_pid):
            result.leftover_pids.append(redis_pid)
        shutil.rmtree(log_dir, ignore_errors=True)
    if result.leftover_pids:
        log.error("  %s: processes left running: %s", scenario, result.leftover_pids)
    log.info("%s done: %d faults, %d rollouts, %d duplicates, %d gaps, longest stall %.1f s, %d group re-runs, "
             "%.0f steps/s; no process left: %s", scenario, result.faults, result.rollouts, result.duplicates,
             result.gaps, result.longest_stall, result.groups_rerun, result.steps_per_second,
             not result.leftover_pids)
    return result


def make_actors(redis_url: str, scenario: str, policy: torch.nn.Module, resume: bool = False) -> RedisDistributedActors:
    return RedisDistributedActors(
        make_env, policy, N_ROLLOUT_STEPS, N_ACTORS, BATCH_SIZE, QUEUE_FACTOR,
        list(range(N_ACTORS)), [1_000 + actor for actor in range(N_ACTORS)], redis_url=redis_url,
        run_name=f"faults-{scenario}", actors_per_job=ACTORS_PER_JOB, min_job_seconds=MIN_JOB_SECONDS,
        resume=resume, secret=os.environ["RQRL_SECRET"],
    )


def restart_learner(dead: RedisDistributedActors, redis_url: str, scenario: str,
                    policy: torch.nn.Module) -> RedisDistributedActors:
    """The learner process dies (no stop(): its run stays in Redis) and a new one resumes the run."""
    dead.connection.close()
    resumed = make_actors(redis_url, scenario, policy, resume=True)
    resumed.start()
    resumed.broadcast_updated_policy(policy.state_dict())
    return resumed


def _stat_sum(actors: RedisDistributedActors, event) -> int:
    try:
        return int(actors.get_stats_value(event, name="sum"))
    except MissingStatsError:
        return 0


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ---- report ------------------------------------------------------------------------------


def print_tables(args: argparse.Namespace, results: list[Result]) -> None:
    print()
    print(f"## Worker faults: {ENV_ID}, {N_ACTORS} actors x {N_ROLLOUT_STEPS}-step rollouts, batches of {BATCH_SIZE}, "
          f"{ACTORS_PER_JOB} actor per job, {args.workers} external workers; faults every {args.period:g} s for "
          f"{args.seconds:g} s, then {args.settle:g} s without")
    print()
    print(f"machine: {os.cpu_count()} logical CPUs, torch {torch.__version__}, gymnasium {gymnasium.__version__}, "
          f"rqrl {rqrl.__version__}")
    print()
    print("| scenario | faults | rollouts | duplicates | gaps | lost | longest actor stall s | groups re-run "
          "| episodes cut | learner pause s | steps/s |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in results:
        pause = f"{r.learner_pause:.2f}" if r.scenario == "restart-learner" else "n/a"
        print(f"| {r.scenario} | {r.faults} | {r.rollouts:,} | {r.duplicates} | {r.gaps} | {r.gaps} | "
              f"{r.longest_stall:.1f} | {r.groups_rerun} | {r.episodes_cut} | {pause} | {r.steps_per_second:,.0f} |")
    print()
    print("faults: workers signalled (SIGKILL, or SIGTERM for stop-gracefully), or learners restarted. lost = gaps: "
          "rollout ids missing inside an actor's delivered range. Stall: the most seconds between consecutive "
          "deliveries of one actor to the learner (from its first delivery to the end of the run). Learner pause: "
          "the longest time from a learner's death to the new learner's first batch. Episodes cut: episodes a re-run "
          "cut without a truncated mark, flagged by continues_previous=False on the re-run's first rollout.")
    print()
    print("| scenario | seconds | collects | replacements | records rejected | actors delivering | stalled actor "
          "| workers alive at end (rqrl / real) | unexpected worker exits | error | processes left |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|---|---|---|")
    for r in results:
        print(f"| {r.scenario} | {r.seconds:.1f} | {r.collects:,} | {r.replacements} | {r.records_rejected} | "
              f"{r.actors_delivering}/{N_ACTORS} | {r.stall_actor if r.stall_actor is not None else 'n/a'} | "
              f"{r.workers_alive_rqrl} / {r.workers_alive_real} | {', '.join(r.unexpected_exits) or 'none'} | "
              f"{r.error or 'none'} | {', '.join(map(str, r.leftover_pids)) or 'none'} |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS),
                        help="scenarios to run, in this order")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of faults per scenario")
    parser.add_argument("--period", type=float, default=10.0, help="seconds between faults")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds of collecting without new faults after --seconds (0: none)")
    parser.add_argument("--workers", type=int, default=4, help="external rqrl worker processes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the choice of victims")
    parser.add_argument("--report-every", type=float, default=5.0, help="seconds between progress lines")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.period <= 0 or args.settle < 0 or args.workers < 1 or args.report_every <= 0:
        parser.error("expected --seconds, --period, --report-every > 0, --settle >= 0 and --workers >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("RQRL_SECRET", secrets.token_hex(32))  # the learner's and the workers' shared secret
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    results = [run_scenario(scenario, args, rng) for scenario in args.scenarios]
    print_tables(args, results)
    return 1 if any(r.leftover_pids or r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
