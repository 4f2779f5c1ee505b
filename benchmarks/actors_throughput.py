"""Env steps per second that ``SubprocDistributedActors.collect_outputs`` delivers, next to a reference.

The *rqrl* side runs CartPole-v1 actors through the full engine: a private redis-server, ``W``
local RQ workers (each stepping ``--actors-per-worker`` actors as one ``ActorGroup`` in one job),
the bounded out-of-sync queue, and the learner's ``collect_outputs("cpu")``. Throughput is the
number of env steps in the batches collect_outputs returned during a fixed wall-clock window.

The *reference* is not rqrl's code: ``W`` plain processes, each a gymnasium ``SyncVectorEnv`` of
``--actors-per-worker`` envs stepped with one batched forward of the same MLP per step and numpy
sampling from the softmax, with no transport, no records and no bookkeeping: what the env and the
policy alone cost on this machine (issue 10's yardstick).

The *loop* column runs rqrl's own rollout loop (``ActorGroup.run`` with the same policy, rollout
length and actors per process, one torch thread) in ``W`` plain processes with no Redis, no RQ, no
encoding and no learner: rqrl / loop is what the transport costs, loop / reference what the
rollout loop's own bookkeeping costs.

Rounds interleave the three sides (rotating which goes first) so that machine noise hits all of
them. The goal is rqrl >= 0.9 x reference; this script only reports what it measures.

``--alternate PAIRS`` measures rqrl and the reference instead in pairs of short alternating windows, both
kept alive and the idle side stopped (SIGSTOP): on a machine whose speed drifts within seconds, the paired
ratios resolve what separate runs do not. It also counts the reference's autoreset steps (see
``_reference_process``).

Run from the repository root::

    python benchmarks/actors_throughput.py --seconds 10 --rounds 3 --workers 2 --actors-per-worker 8 32
    python benchmarks/actors_throughput.py --env Acrobot-v1 --seconds 10 --rounds 3
    python benchmarks/actors_throughput.py --seconds 2 --alternate 16 --workers 2 --actors-per-worker 8 32
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import multiprocessing
import os
import platform
import signal
import statistics
import time
from dataclasses import dataclass

import gymnasium
import numpy as np
import torch
from rq import Worker

import rqrl
from rqrl.engine.policy import make_act_function
from rqrl.maze.actors import SubprocDistributedActors
from rqrl.maze.rollout import ActorGroup

log = logging.getLogger("actors_throughput")

ENV_ID = "CartPole-v1"  # --env sets it before anything forks
AGENT_SEED_OFFSET = 1_000
START_TIMEOUT_SECONDS = 120.0


def make_env() -> gymnasium.Env:
    """Module-level env factory (picklable, importable by forked workers)."""
    return gymnasium.make(ENV_ID)


def policy_sizes() -> tuple[int, int]:
    """Observation size and number of actions of ENV_ID (a Box observation and a Discrete action space)."""
    env = make_env()
    sizes = int(np.prod(env.observation_space.shape)), int(env.action_space.n)
    env.close()
    return sizes


def make_policy() -> torch.nn.Module:
    """The benchmark policy: an obs-64-64-actions tanh MLP giving logits (4-64-64-2 on CartPole-v1), the same
    initial weights everywhere."""
    obs_size, n_actions = policy_sizes()
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(obs_size, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, n_actions)).eval()


def env_seeds(n_actors: int) -> list[int]:
    return list(range(n_actors))


def agent_seeds(n_actors: int) -> list[int]:
    return [AGENT_SEED_OFFSET + actor_id for actor_id in range(n_actors)]


@dataclass(frozen=True)
class Measurement:
    """Steps counted over ``seconds`` of wall time, CPU use by role, and rqrl-only diagnostics."""

    steps: int
    seconds: float
    cpu_seconds: dict[str, float] | None = None
    collects: int = 0
    jobs_finished: int | None = None
    mean_queue_before: float | None = None
    autoreset_steps: int | None = None  # the reference's steps spent on resets alone (see _reference_process)

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else float("nan")

    def steps_per_cpu_second(self, *roles: str) -> float | None:
        """Steps per CPU second spent by ``roles``: throughput with machine contention divided out."""
        if self.cpu_seconds is None:
            return None
        spent = sum(self.cpu_seconds.get(role, 0.0) for role in roles)
        return self.steps / spent if spent > 0 else None

    def cores(self, role: str) -> float | None:
        """CPU seconds that ``role`` used per wall-clock second of the window (1.0 = one busy core)."""
        if self.cpu_seconds is None or role not in self.cpu_seconds:
            return None
        return self.cpu_seconds[role] / self.seconds


# ---- CPU accounting (Linux /proc; reported as n/a elsewhere) -----------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read_stat(pid: int) -> tuple[str, int, float] | None:
    """(command name, parent pid, user+system CPU seconds) of a process, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            data = file.read()
    except OSError:
        return None
    name = data[data.index("(") + 1 : data.rindex(")")]
    fields = data[data.rindex(")") + 2 :].split()  # fields[0] is the state (field 3 of proc(5))
    return name, int(fields[1]), (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _system_busy_seconds() -> float:
    """CPU seconds all CPUs of the machine spent busy (not idle, not iowait) since boot."""
    with open("/proc/stat") as file:
        fields = [int(value) for value in file.readline().split()[1:]]
    guest = fields[8:10]  # guest time is already counted in user time
    return (sum(fields) - fields[3] - fields[4] - sum(guest)) / _CLOCK_TICKS


def cpu_snapshot() -> dict[str, float] | None:
    """CPU seconds so far of this process ("learner"), its children ("redis" or "workers"), and of the
    whole machine ("machine"); ``other`` = machine - ours is load this benchmark did not cause."""
    if not os.path.isfile("/proc/stat"):
        return None
    times = os.times()
    snapshot = {"learner": times.user + times.system, "workers": 0.0, "redis": 0.0,
                "machine": _system_busy_seconds()}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _read_stat(int(entry))
        if stat is None or stat[1] != me:
            continue
        name, _, seconds = stat
        snapshot["redis" if name.startswith("redis-server") else "workers"] += seconds
    return snapshot


def cpu_used(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    used = {role: max(0.0, after[role] - before.get(role, 0.0)) for role in after}
    used["other"] = max(0.0, used.pop("machine") - used["learner"] - used["workers"] - used["redis"])
    return used


def wait_for_quiet_machine(max_seconds: float, threshold_cores: float = 0.15, sample_seconds: float = 0.5) -> float:
    """Wait (up to ``max_seconds``) until other processes use less than ``threshold_cores``; returns their
    last measured load. Other load on a small machine would otherwise be measured as rqrl's (or the
    ceiling's) slowness."""
    deadline = time.monotonic() + max_seconds
    load = 0.0
    while True:
        before = cpu_snapshot()
        if before is None:
            return 0.0
        time.sleep(sample_seconds)
        used = cpu_used(before, cpu_snapshot())
        load = used["other"] / sample_seconds if used else 0.0
        if load < threshold_cores or time.monotonic() >= deadline:
            return load
        log.info("    waiting for the machine to quieten: other processes use %.2f cores", load)


# ---- rqrl --------------------------------------------------------------------------------


def _jobs_finished(connection) -> int | None:  # noqa: ANN001 - a redis.Redis
    """Jobs finished so far by all RQ workers on this (private) Redis, from RQ's worker hashes."""
    try:
        return sum(worker.successful_job_count for worker in Worker.all(connection=connection))
    except Exception:  # diagnostics only: never fail the benchmark over it
        log.debug("could not read RQ worker job counts", exc_info=True)
        return None


def measure_rqrl(workers: int, actors_per_worker: int, n_rollout_steps: int, seconds: float, warmup: float,
                 queue_factor: float) -> Measurement:
    """Steps/s delivered by collect_outputs with ``workers`` local workers of one actor group each."""
    n_actors = workers * actors_per_worker
    policy = make_policy()
    actors = SubprocDistributedActors(
        make_env, policy, n_rollout_steps, n_actors, n_actors, queue_factor, "fork",
        env_seeds(n_actors), agent_seeds(n_actors), n_workers=workers, actors_per_job=actors_per_worker,
    )
    with actors:
        actors.broadcast_updated_policy(policy.state_dict())
        # the first batch includes worker start-up (fork, context load, env construction): not warm-up
        actors.collect_outputs("cpu")
        warm_until = time.perf_counter() + warmup
        while time.perf_counter() < warm_until:
            actors.collect_outputs("cpu")
        jobs_before = _jobs_finished(actors.connection)
        measured = _collect_for(actors, seconds)
        jobs_after = _jobs_finished(actors.connection)
    jobs = jobs_after - jobs_before if jobs_before is not None and jobs_after is not None else None
    return dataclasses.replace(measured, jobs_finished=jobs)


def _collect_for(actors: SubprocDistributedActors, seconds: float) -> Measurement:
    """Steps of the batches collect_outputs returns over at least ``seconds``, with CPU use and queue lengths."""
    steps = collects = 0
    queue_sizes: list[int] = []
    cpu_before, started = cpu_snapshot(), time.perf_counter()
    while True:
        out = actors.collect_outputs("cpu")
        steps += int(out.record.rewards.numel())
        collects += 1
        queue_sizes.append(out.queue_size_before)
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            break
    return Measurement(steps, elapsed, cpu_used(cpu_before, cpu_snapshot()), collects, None,
                       statistics.fmean(queue_sizes))


# ---- plain processes: rqrl's loop, and the reference ----------------------------------------


class Counts:
    """Steps (and the reference's autoreset steps) of plain processes, one shared slot per process: each process is
    the only writer of its slot, so nobody takes a lock (a lock held by a process stopped with SIGSTOP would
    block the reader) and counting each step costs the reference next to nothing."""

    def __init__(self, context, processes: int):  # noqa: ANN001 - a multiprocessing context
        self.steps = context.Array("q", processes, lock=False)
        self.autoresets = context.Array("q", processes, lock=False)

    def total(self) -> tuple[int, int]:
        """(steps, autoreset steps) of all processes so far."""
        return sum(self.steps), sum(self.autoresets)


def _loop_process(actor_ids: list[int], n_rollout_steps: int, counts: Counts, slot: int, stop) -> None:  # noqa: ANN001
    """Step one actor group forever (like one rqrl worker's job), adding finished steps to its slot of ``counts``."""
    torch.set_num_threads(1)
    policy = make_policy()
    all_env_seeds, all_agent_seeds = env_seeds(max(actor_ids) + 1), agent_seeds(max(actor_ids) + 1)
    group = ActorGroup(make_env, actor_ids, [all_env_seeds[a] for a in actor_ids],
                       [all_agent_seeds[a] for a in actor_ids], n_rollout_steps)
    act = make_act_function(policy, group.action_space)
    steps_per_rollout = n_rollout_steps * len(actor_ids)
    rollout_id = 0
    try:
        while not stop.is_set():
            group.run(act, rollout_id, policy_version=1, cut_at_end=False)
            rollout_id += 1
            counts.steps[slot] += steps_per_rollout
    finally:
        group.close()


def _reference_process(actor_ids: list[int], n_rollout_steps: int, counts: Counts, slot: int,
                       stop) -> None:  # noqa: ANN001
    """The yardstick: a SyncVectorEnv stepped with one batched forward per step and numpy sampling, counted per
    step (short windows then count no partial rollout). gymnasium's default autoreset (next step) spends the step
    after an episode's end on the reset alone: no env.step, no transition, yet a step of the count; those steps
    are counted apart too."""
    torch.set_num_threads(1)
    policy = make_policy()
    envs = gymnasium.vector.SyncVectorEnv([make_env for _ in actor_ids])
    rng = np.random.default_rng(actor_ids[0])
    obs, _ = envs.reset(seed=[env_seeds(max(actor_ids) + 1)[a] for a in actor_ids])
    try:
        while not stop.is_set():
            for _ in range(n_rollout_steps):
                with torch.inference_mode():
                    logits = policy(torch.from_numpy(obs)).numpy()
                probs = np.exp(logits - logits.max(axis=1, keepdims=True))
                probs /= probs.sum(axis=1, keepdims=True)
                actions = (probs.cumsum(axis=1) < rng.random((len(probs), 1))).sum(axis=1)
                obs, _, terminated, truncated, _ = envs.step(np.minimum(actions, probs.shape[1] - 1))
                counts.steps[slot] += len(actor_ids)
                counts.autoresets[slot] += int(np.count_nonzero(terminated | truncated))
    finally:
        envs.close()


PROCESS_TARGETS = {"loop": _loop_process, "reference": _reference_process}


def _wait_for_count(counts: Counts, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while counts.total()[0] == 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"benchmark processes produced no rollout within {timeout:.0f} s")
        time.sleep(0.005)


def _start_processes(kind: str, workers: int, actors_per_worker: int, n_rollout_steps: int, counts: Counts,
                     stop) -> list[multiprocessing.process.BaseProcess]:  # noqa: ANN001
    """``workers`` forked processes running PROCESS_TARGETS[kind], each on its own actors and slot of ``counts``."""
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=PROCESS_TARGETS[kind], name=f"{kind}-{index}", daemon=True, args=(
        list(range(index * actors_per_worker, (index + 1) * actors_per_worker)), n_rollout_steps, counts, index,
        stop)) for index in range(workers)]
    for process in processes:
        process.start()
    return processes


def stop_processes(processes: list[multiprocessing.process.BaseProcess], stop) -> None:  # noqa: ANN001
    """Let stopped (SIGSTOP) processes go on, tell them to finish, and make sure they do."""
    _signal_all([process.pid for process in processes if process.pid is not None], signal.SIGCONT)
    stop.set()
    for process in processes:
        process.join(10)
        if process.is_alive():
            process.terminate()
            process.join(5)


def measure_processes(kind: str, workers: int, actors_per_worker: int, n_rollout_steps: int, seconds: float,
                      warmup: float) -> Measurement:
    """Steps/s of ``workers`` plain processes running PROCESS_TARGETS[kind] without Redis."""
    context = multiprocessing.get_context("fork")
    counts, stop = Counts(context, workers), context.Event()
    processes = _start_processes(kind, workers, actors_per_worker, n_rollout_steps, counts, stop)
    try:
        _wait_for_count(counts, START_TIMEOUT_SECONDS)
        time.sleep(warmup)
        cpu_before = cpu_snapshot()
        (count_before, _), started = counts.total(), time.perf_counter()
        time.sleep(seconds)
        (count_after, _), elapsed = counts.total(), time.perf_counter() - started
        cpu = cpu_used(cpu_before, cpu_snapshot())
    finally:
        stop_processes(processes, stop)
    if any(process.exitcode != 0 for process in processes):
        raise RuntimeError(f"{kind} process exit codes {[process.exitcode for process in processes]}")
    return Measurement(count_after - count_before, elapsed, cpu)


# ---- rqrl and the reference side by side, in alternating windows ---------------------------


def _signal_all(pids: list[int], signal_number: int) -> None:
    """Send ``signal_number`` to every process of ``pids`` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, signal_number)
        except ProcessLookupError:
            pass


LEASE_MARGIN_SECONDS = 3.5
"""The longest --alternate may keep rqrl's workers stopped: their 5 s lease, less the 1.25 s between its renewals
and some slack. The order of the sides swaps every pair, so the workers stay stopped through two reference
windows in a row (with 2 s windows, leases expired and groups were re-run every few pairs)."""
SETTLE_SECONDS = 0.3


def _count_window(counts: Counts, resume: list[int], pause: list[int], seconds: float) -> Measurement:
    """Pause ``pause``, resume ``resume``, let them settle, then count (steps, autoreset steps) for ``seconds``."""
    _signal_all(pause, signal.SIGSTOP)
    _signal_all(resume, signal.SIGCONT)
    time.sleep(SETTLE_SECONDS)
    cpu_before = cpu_snapshot()
    (steps_before, resets_before), started = counts.total(), time.perf_counter()
    time.sleep(seconds)
    (steps, resets), elapsed = counts.total(), time.perf_counter() - started
    return Measurement(steps - steps_before, elapsed, cpu_used(cpu_before, cpu_snapshot()),
                       autoreset_steps=resets - resets_before)


def measure_alternating(workers: int, actors_per_worker: int, n_rollout_steps: int, seconds: float, rounds: int,
                        warmup: float, queue_factor: float) -> list[dict[str, Measurement]]:
    """rqrl and the reference, both started once and kept alive, measured in ``rounds`` pairs of short windows:
    while one side runs, the other's processes are stopped (SIGSTOP), so each pair sees the same machine within
    seconds. On a VM whose speed drifts by 15-25% within seconds, paired ratios of this kind are what resolve a
    few per cent; separate runs of each side do not.

    The rqrl side counts the steps of the batches ``collect_outputs`` returned in its window (the learner collects
    only then)."""
    n_actors = workers * actors_per_worker
    context = multiprocessing.get_context("fork")
    counts, stop = Counts(context, workers), context.Event()
    reference = _start_processes("reference", workers, actors_per_worker, n_rollout_steps, counts, stop)
    reference_pids = [process.pid for process in reference if process.pid is not None]
    policy = make_policy()
    actors = SubprocDistributedActors(
        make_env, policy, n_rollout_steps, n_actors, n_actors, queue_factor, "fork",
        env_seeds(n_actors), agent_seeds(n_actors), n_workers=workers, actors_per_job=actors_per_worker,
    )
    try:
        _wait_for_count(counts, START_TIMEOUT_SECONDS)
        _signal_all(reference_pids, signal.SIGSTOP)
        with actors:
            actors.broadcast_updated_policy(policy.state_dict())
            actors.collect_outputs("cpu")  # worker start-up is not part of any window
            warm_until = time.perf_counter() + warmup
            while time.perf_counter() < warm_until:
                actors.collect_outputs("cpu")
            worker_pids = [process.pid for process in actors.local_workers.processes if process.pid is not None]
            try:
                return [_measure_pair(actors, counts, reference_pids, worker_pids, seconds, round_index, rounds)
                        for round_index in range(rounds)]
            finally:  # stopped workers would sit out their SIGTERM until the stop timeout
                _signal_all(worker_pids, signal.SIGCONT)
    finally:
        stop_processes(reference, stop)


def _measure_pair(actors: SubprocDistributedActors, counts: Counts, reference_pids: list[int],
                  worker_pids: list[int], seconds: float, round_index: int, rounds: int) -> dict[str, Measurement]:
    """One window of each side, rqrl first in even rounds."""
    measured: dict[str, Measurement] = {}
    for kind in (("rqrl", "reference") if round_index % 2 == 0 else ("reference", "rqrl")):
        if kind == "reference":
            measured[kind] = _count_window(counts, reference_pids, worker_pids, seconds)
        else:
            measured[kind] = _collect_window(actors, reference_pids, worker_pids, seconds)
    log.info("    round %d/%d: rqrl %.0f, reference %.0f steps/s", round_index + 1, rounds,
             measured["rqrl"].steps_per_second, measured["reference"].steps_per_second)
    return measured


def _collect_window(actors: SubprocDistributedActors, reference_pids: list[int], worker_pids: list[int],
                    seconds: float) -> Measurement:
    """Resume rqrl's workers (reference paused), collect while they settle, then count collected steps."""
    _signal_all(reference_pids, signal.SIGSTOP)
    _signal_all(worker_pids, signal.SIGCONT)
    settle_until = time.perf_counter() + SETTLE_SECONDS
    while time.perf_counter() < settle_until:
        actors.collect_outputs("cpu")
    measured = _collect_for(actors, seconds)
    _signal_all(worker_pids, signal.SIGSTOP)
    return measured


def print_alternating(args: argparse.Namespace, results: dict[tuple[int, int], list[dict[str, Measurement]]]) -> None:
    obs_size, n_actions = policy_sizes()
    print()
    print(f"## rqrl collect_outputs vs. the reference in alternating windows: {ENV_ID}, {args.rollout_steps}-step "
          f"rollouts, {obs_size}-64-64-{n_actions} tanh MLP, {args.alternate} pairs of {args.seconds:g} s windows")
    print()
    print("| workers | envs per worker | rqrl steps/s | reference steps/s | rqrl / reference (median of pairs) "
          "| pairs at or above 0.9 | reference's autoreset steps | rqrl / reference's env.step calls "
          "| rqrl workers CPU | learner CPU | redis CPU | reference CPU |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for (workers, envs), rounds in results.items():
        ratios = [m["rqrl"].steps_per_second / m["reference"].steps_per_second for m in rounds]
        resets = [(m["reference"].autoreset_steps or 0) / max(1, m["reference"].steps) for m in rounds]
        stepped = [m["rqrl"].steps / max(1, m["reference"].steps - (m["reference"].autoreset_steps or 0))
                   * m["reference"].seconds / m["rqrl"].seconds for m in rounds]

        def cores(kind: str, role: str, rounds: list[dict[str, Measurement]] = rounds) -> str:
            values = [m[kind].cores(role) for m in rounds]
            return "n/a" if None in values else f"{statistics.median(v for v in values if v is not None):.2f}"

        print(f"| {workers} | {envs} | {_median(rounds, lambda m: m['rqrl'].steps_per_second):,.0f} | "
              f"{_median(rounds, lambda m: m['reference'].steps_per_second):,.0f} | {statistics.median(ratios):.2f} | "
              f"{sum(ratio >= 0.9 for ratio in ratios)}/{len(ratios)} | {statistics.median(resets):.1%} | "
              f"{statistics.median(stepped):.2f} | {cores('rqrl', 'workers')} | "
              f"{cores('rqrl', 'learner')} | {cores('rqrl', 'redis')} | {cores('reference', 'workers')} |")
    print()
    print("The reference's autoreset steps are steps gymnasium's SyncVectorEnv spends on resets alone (its default "
          "next-step autoreset): counted as steps, though no env.step ran and no transition came of them; rqrl "
          "resets inside the step that ended the episode. The column after them compares rqrl's steps with the "
          "reference's env.step calls.")
    print()
    print("Per pair, rqrl / reference: " + "; ".join(
        f"{workers}x{envs}: " + ", ".join(f"{m['rqrl'].steps_per_second / m['reference'].steps_per_second:.2f}"
                                          for m in rounds)
        for (workers, envs), rounds in results.items()))


# ---- report ------------------------------------------------------------------------------

KINDS = ("rqrl", "reference", "loop")
Rounds = dict[tuple[int, int], list[dict[str, Measurement]]]  # (workers, actors per worker) -> per-round results


def _fmt(value: float | int | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _median(rounds: list[dict[str, Measurement]], value) -> float:  # noqa: ANN001 - a function of one round
    return statistics.median(value(measured) for measured in rounds)


def print_tables(args: argparse.Namespace, results: Rounds) -> None:
    print()
    obs_size, n_actions = policy_sizes()
    print(f"## rqrl collect_outputs vs. the reference: {ENV_ID}, {args.rollout_steps}-step rollouts, "
          f"{obs_size}-64-64-{n_actions} tanh MLP, {args.seconds:g} s window, {args.rounds} round(s)")
    print()
    print(f"machine: {os.cpu_count()} logical CPUs, {platform.python_implementation()} {platform.python_version()}, "
          f"torch {torch.__version__}, gymnasium {gymnasium.__version__}, rqrl {rqrl.__version__}")
    print()
    print("| workers | envs per worker | rqrl steps/s | reference steps/s | rqrl / reference | loop steps/s "
          "| rqrl / loop | loop / reference |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|")
    for (workers, envs), rounds in results.items():
        rate = {kind: _median(rounds, lambda m, kind=kind: m[kind].steps_per_second) for kind in KINDS}

        def ratio(top: str, bottom: str, rounds: list[dict[str, Measurement]] = rounds) -> float:
            return _median(rounds, lambda m: m[top].steps_per_second / m[bottom].steps_per_second)

        print(f"| {workers} | {envs} | {rate['rqrl']:,.0f} | {rate['reference']:,.0f} | "
              f"{ratio('rqrl', 'reference'):.2f} | {rate['loop']:,.0f} | {ratio('rqrl', 'loop'):.2f} | "
              f"{ratio('loop', 'reference'):.2f} |")
    print()
    print("Medians over rounds; each ratio is the median of the per-round (paired) ratios.")
    print()
    print("Per round. CPU columns are cores used during the window (CPU s per wall s); 'other' is load on the "
          "machine that this benchmark did not cause (non-zero means the numbers are disturbed). collects / RQ "
          "jobs finished / mean out-of-sync queue length before a collect "
          f"(bound = {args.queue_factor:g} x batch_size) are rqrl's.")
    print()
    print("| workers | envs | round | rqrl steps/s | reference steps/s | loop steps/s | rqrl workers CPU | learner CPU "
          "| redis CPU | reference CPU | other CPU (rqrl / reference / loop) | collects | RQ jobs finished "
          "| mean queue |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for (workers, envs), rounds in results.items():
        for index, m in enumerate(rounds, start=1):
            r = m["rqrl"]
            others = " / ".join(_fmt(m[kind].cores("other"), ".2f") for kind in KINDS)
            print(f"| {workers} | {envs} | {index} | {r.steps_per_second:,.0f} | "
                  f"{m['reference'].steps_per_second:,.0f} | {m['loop'].steps_per_second:,.0f} | "
                  f"{_fmt(r.cores('workers'), '.2f')} | {_fmt(r.cores('learner'), '.2f')} | "
                  f"{_fmt(r.cores('redis'), '.2f')} | {_fmt(m['reference'].cores('workers'), '.2f')} | {others} | "
                  f"{r.collects} | {_fmt(r.jobs_finished, 'd')} | {_fmt(r.mean_queue_before, '.1f')} |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--env", default=ENV_ID, help="gymnasium env id (Box observations, Discrete actions)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement window per configuration")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds, each measuring rqrl, the reference and the loop for every configuration")
    parser.add_argument("--workers", type=int, nargs="+", default=[2], help="worker (process) counts to measure")
    parser.add_argument("--actors-per-worker", type=int, nargs="+", default=[8, 32],
                        help="envs (actors) stepped together by each worker")
    parser.add_argument("--rollout-steps", type=int, default=128, help="n_rollout_steps")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds after the first output")
    parser.add_argument("--queue-factor", type=float, default=2.0, help="queue_out_of_sync_factor")
    parser.add_argument("--alternate", type=int, default=0, metavar="PAIRS",
                        help="instead of separate runs, measure rqrl and the reference in PAIRS pairs of alternating "
                             "--seconds windows, each side kept alive and paused (SIGSTOP) while the other runs; no "
                             "loop column")
    parser.add_argument("--quiet-wait", type=float, default=10.0,
                        help="before each measurement, wait up to this many seconds for other load to stop (0: off)")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.warmup < 0 or args.rounds < 1 or args.rollout_steps < 1:
        parser.error("expected --seconds > 0, --warmup >= 0, and --rounds, --rollout-steps >= 1")
    if any(workers < 1 for workers in args.workers) or any(envs < 1 for envs in args.actors_per_worker):
        parser.error("expected --workers >= 1 and --actors-per-worker >= 1")
    if args.alternate < 0 or (args.alternate and 2 * args.seconds + SETTLE_SECONDS > LEASE_MARGIN_SECONDS):
        parser.error(f"expected --alternate >= 0, and with it --seconds <= "
                     f"{(LEASE_MARGIN_SECONDS - SETTLE_SECONDS) / 2:g} (rqrl's workers are stopped through two "
                     f"reference windows in a row; their lease is 5 s)")
    return args


def measure(kind: str, workers: int, envs: int, args: argparse.Namespace) -> Measurement:
    if kind == "rqrl":
        return measure_rqrl(workers, envs, args.rollout_steps, args.seconds, args.warmup, args.queue_factor)
    return measure_processes(kind, workers, envs, args.rollout_steps, args.seconds, args.warmup)


def main(argv: list[str] | None = None) -> None:
    global ENV_ID
    args = parse_args(argv)
    ENV_ID = args.env
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)
    configurations = [(workers, envs) for workers in args.workers for envs in args.actors_per_worker]
    if args.alternate:
        alternating = {}
        for workers, envs in configurations:
            log.info("%d worker(s) x %d envs: %d pairs of %g s windows, rqrl and the reference alternating", workers,
                     envs, args.alternate, args.seconds)
            alternating[(workers, envs)] = measure_alternating(workers, envs, args.rollout_steps, args.seconds,
                                                               args.alternate, args.warmup, args.queue_factor)
        print_alternating(args, alternating)
        return
    results: Rounds = {configuration: [] for configuration in configurations}
    for round_index in range(args.rounds):
        for workers, envs in configurations:
            measured: dict[str, Measurement] = {}
            shift = round_index % len(KINDS)
            for kind in KINDS[shift:] + KINDS[:shift]:
                if args.quiet_wait > 0:
                    load = wait_for_quiet_machine(args.quiet_wait)
                    if load >= 0.15:
                        log.warning("    other processes still use %.2f cores; measuring anyway", load)
                log.info("round %d/%d, %d worker(s) x %d envs: measuring %s for %g s (+ %g s warm-up)",
                         round_index + 1, args.rounds, workers, envs, kind, args.seconds, args.warmup)
                measured[kind] = result = measure(kind, workers, envs, args)
                log.info("    %s: %.0f steps/s (%d steps in %.2f s)", kind, result.steps_per_second, result.steps,
                         result.seconds)
            results[(workers, envs)].append(measured)
    print_tables(args, results)


if __name__ == "__main__":
    main()
