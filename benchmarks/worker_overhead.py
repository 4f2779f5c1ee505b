"""Per-job overhead of RQ worker classes with rqrl's jobs: why rqrl uses a non-forking worker.

Compares (a) ``rqrl.engine.worker.RolloutWorker`` (an RQ ``SimpleWorker``: jobs run in the worker process,
so envs, policy and weights stay warm) with (b) RQ's default ``rq.Worker``, which forks a
work-horse process per job; all with ``rq.serializers.JSONSerializer``. Plain ``rq.SimpleWorker``
is measured on trivial jobs as a reference for RQ's own per-job bookkeeping. Every worker runs in its
own subprocess against one private redis-server (``rqrl.engine.server.EmbeddedRedis``).

1. Trivial jobs: ``--jobs`` calls of ``benchmarks._trivial_jobs.noop`` are enqueued first, then one
   worker drains them in burst mode. Time is measured inside the worker process from the start
   of its first job to the end of its last one (interpreter start, imports, registration and
   shutdown are excluded). The forking worker is measured twice: with a bare parent (only rq
   imported) and with torch + rqrl imported in the parent, as a worker serving rqrl jobs would
   have (fork cost grows with the parent's memory).
2. rqrl rollout jobs: one job = one 128-step rollout of 4 CartPole-v1 actors (the run is made with
   two such groups on the one worker and ``min_job_seconds = 1e-6``, so every job finds the other
   group's job waiting, yields after one rollout and enqueues its continuation). Time per job is
   measured at the learner, over ``--rollout-jobs`` consecutive ``collect_outputs`` calls of one
   job's output each. The forking worker runs once with torch + rqrl imported in its parent (its
   best case) and once, for a few jobs only, with a bare parent as ``rq worker -w rq.Worker`` starts
   it (every work-horse then imports torch, gymnasium and rqrl itself). For reference, the last row
   is RolloutWorker with rqrl's default slicing, where a job keeps running in place and no job
   boundary falls between rollouts.

Run from the repository root::

    python benchmarks/worker_overhead.py --jobs 300 --rollout-jobs 40
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("worker_overhead")

REPO_ROOT = Path(__file__).resolve().parent.parent
NOOP_JOB = "benchmarks._trivial_jobs.noop"
ROLLOUT_WORKER = "rqrl.engine.worker.RolloutWorker"
FORKING_WORKER = "rq.Worker"
ROLLOUT_STEPS = 128
ACTORS_PER_JOB = 4
WORKER_START_TIMEOUT = 120.0


@dataclass(frozen=True)
class Row:
    label: str
    jobs: int
    seconds: float

    @property
    def jobs_per_second(self) -> float:
        return self.jobs / self.seconds

    @property
    def ms_per_job(self) -> float:
        return 1000.0 * self.seconds / self.jobs


# ---- the worker subprocess ---------------------------------------------------------------


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker if the benchmark dies (without importing rqrl, which imports torch)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def serve_worker(spec: dict) -> None:
    """Entry point of the worker subprocess: import ``spec["preload"]``, run one worker, print timings."""
    import importlib

    _die_with_parent()
    for module in spec["preload"]:
        importlib.import_module(module)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    import redis
    from rq import Queue
    from rq.serializers import JSONSerializer

    module_name, class_name = spec["worker_class"].rsplit(".", 1)
    base = getattr(importlib.import_module(module_name), class_name)
    timing = {"jobs": 0, "first_start": None, "last_end": None}

    class TimedWorker(base):
        """The worker class under test, noting when its first job started and its last one ended."""

        def execute_job(self, job, queue):  # noqa: ANN001 - RQ's signature
            if timing["first_start"] is None:
                timing["first_start"] = time.perf_counter()
            try:
                return super().execute_job(job, queue)
            finally:
                timing["last_end"] = time.perf_counter()
                timing["jobs"] += 1

    extra = {}
    if spec["worker_class"] == ROLLOUT_WORKER:  # RolloutWorker runs only allowed functions: allow the no-op
        from rqrl.engine.worker import RolloutJob

        class BenchmarkJob(RolloutJob):
            allowed_functions = RolloutJob.allowed_functions | {NOOP_JOB}

        extra["job_class"] = BenchmarkJob
    if spec.get("rollouts"):  # a plain rq.Worker reads no RQRL_SECRET (only the CLI and RolloutWorker do); this
        from rqrl.engine.jobs import configure_secret  # imports neither torch nor gymnasium: a bare parent stays so

        configure_secret(os.environ.get("RQRL_SECRET"))
    connection = redis.Redis.from_url(spec["url"])
    queue = Queue(spec["queue"], connection=connection, serializer=JSONSerializer)
    worker = TimedWorker([queue], connection=connection, serializer=JSONSerializer,
                         name=f"bench-{spec['queue']}-{os.getpid()}", **extra)
    started = time.perf_counter()
    worker.work(burst=spec["burst"], logging_level="WARNING", with_scheduler=False)
    timing["work_seconds"] = time.perf_counter() - started
    print(json.dumps(timing), flush=True)


def start_worker(url: str, queue: str, worker_class: str, preload: list[str], burst: bool,
                 rollouts: bool = False) -> subprocess.Popen:
    spec = {"url": url, "queue": queue, "worker_class": worker_class, "preload": preload, "burst": burst,
            "rollouts": rollouts}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.worker_overhead", "--serve-worker", json.dumps(spec)],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True,
    )


def stop_worker(process: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM (RQ's warm shutdown: the running job finishes), then SIGKILL."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    if process.stdout is not None:
        process.stdout.close()


# ---- 1. trivial jobs ---------------------------------------------------------------------


def measure_noop(url: str, label: str, worker_class: str, preload: list[str], n_jobs: int, timeout: float) -> Row:
    import redis
    from rq import Queue
    from rq.registry import FailedJobRegistry
    from rq.serializers import JSONSerializer

    queue_name = f"noop-{uuid.uuid4().hex[:8]}"
    connection = redis.Redis.from_url(url)
    queue = Queue(queue_name, connection=connection, serializer=JSONSerializer)
    queue.enqueue_many([Queue.prepare_data(NOOP_JOB, result_ttl=0) for _ in range(n_jobs)])
    log.info("%s: %d no-op jobs, burst worker", label, n_jobs)
    process = start_worker(url, queue_name, worker_class, preload, burst=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_worker(process)
        raise RuntimeError(f"{label}: the burst worker did not finish {n_jobs} jobs within {timeout:.0f} s") from None
    if process.returncode != 0:
        raise RuntimeError(f"{label}: the worker exited with code {process.returncode}")
    timing = json.loads(output.strip().splitlines()[-1])
    failed = FailedJobRegistry(queue=queue).count
    if timing["jobs"] != n_jobs or failed or queue.count:
        raise RuntimeError(f"{label}: ran {timing['jobs']} of {n_jobs} jobs, {failed} failed, {queue.count} left")
    row = Row(label, n_jobs, timing["last_end"] - timing["first_start"])
    log.info("    %.0f jobs/s, %.2f ms per job (whole burst run incl. registration and shutdown: %.2f s)",
             row.jobs_per_second, row.ms_per_job, timing["work_seconds"])
    connection.close()
    return row


# ---- 2. rqrl rollout jobs ----------------------------------------------------------------


def measure_rollout_jobs(url: str, label: str, worker_class: str, preload: list[str], n_jobs: int,
                         one_rollout_per_job: bool, warmup_jobs: int = 3) -> Row:
    import torch

    from benchmarks.actors_throughput import make_env, make_policy
    from rqrl.maze.actors import RedisDistributedActors

    torch.set_num_threads(1)
    # one rollout per job: a second group's job always waits, so each job yields after one rollout
    # (a job with nothing waiting keeps its worker, whatever max_job_seconds says)
    slicing = {"min_job_seconds": 1e-6} if one_rollout_per_job else {}
    n_actors = 2 * ACTORS_PER_JOB if one_rollout_per_job else ACTORS_PER_JOB
    policy = make_policy()
    actors = RedisDistributedActors(
        make_env, policy, ROLLOUT_STEPS, n_actors, ACTORS_PER_JOB, 2.0,
        list(range(n_actors)), [1000 + actor for actor in range(n_actors)],
        redis_url=url, queue_name=f"rollouts-{uuid.uuid4().hex[:8]}", n_local_workers=0,
        actors_per_job=ACTORS_PER_JOB, collect_timeout=WORKER_START_TIMEOUT, secret=os.environ["RQRL_SECRET"],
        **slicing,
    )
    log.info("%s: %d rollouts of %d actors x %d steps", label, n_jobs, ACTORS_PER_JOB, ROLLOUT_STEPS)
    process = None
    try:
        with actors:
            actors.broadcast_updated_policy(policy.state_dict())
            process = start_worker(url, actors.config.queue_name, worker_class, preload, burst=False, rollouts=True)
            for _ in range(max(1, warmup_jobs)):  # the first includes the worker's start-up and imports
                actors.collect_outputs("cpu")
            started = time.perf_counter()
            for _ in range(n_jobs):
                actors.collect_outputs("cpu")
            elapsed = time.perf_counter() - started
    finally:
        if process is not None:
            stop_worker(process)
    row = Row(label, n_jobs, elapsed)
    log.info("    %.1f jobs/s, %.1f ms per job", row.jobs_per_second, row.ms_per_job)
    return row


# ---- report ------------------------------------------------------------------------------


def print_table(title: str, rows: list[Row]) -> None:
    print()
    print(title)
    print()
    print("| worker class | jobs/s | ms per job |")
    print("|---|--:|--:|")
    for row in rows:
        print(f"| {row.label} | {row.jobs_per_second:,.1f} | {row.ms_per_job:.2f} |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--jobs", type=int, default=300, help="trivial jobs per worker class")
    parser.add_argument("--rollout-jobs", type=int, default=40, help="timed rollout jobs per worker class (0: skip)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds one burst run may take")
    parser.add_argument("--serve-worker", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.rollout_jobs < 0:
        parser.error("expected --jobs >= 1 and --rollout-jobs >= 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.serve_worker:
        serve_worker(json.loads(args.serve_worker))
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    os.environ.setdefault("RQRL_SECRET", uuid.uuid4().hex)  # learner and worker subprocesses share it
    if str(REPO_ROOT) not in sys.path:  # run as a script: make "benchmarks" importable here too
        sys.path.insert(0, str(REPO_ROOT))
    import rq

    from rqrl.engine.server import EmbeddedRedis

    rqrl_parent = ["torch", "gymnasium", "rqrl.maze.jobs", "benchmarks.actors_throughput"]
    with EmbeddedRedis() as server:
        noop_rows = [
            measure_noop(server.url, "rqrl.engine.worker.RolloutWorker (SimpleWorker, no fork)", ROLLOUT_WORKER,
                         ["benchmarks._trivial_jobs"], args.jobs, args.timeout),
            measure_noop(server.url, "rq.SimpleWorker (no fork; reference for RQ's own per-job cost)",
                         "rq.SimpleWorker", ["benchmarks._trivial_jobs"], args.jobs, args.timeout),
            measure_noop(server.url, "rq.Worker (fork per job), bare parent", FORKING_WORKER,
                         ["benchmarks._trivial_jobs"], args.jobs, args.timeout),
            measure_noop(server.url, "rq.Worker (fork per job), parent with torch + rqrl imported", FORKING_WORKER,
                         ["benchmarks._trivial_jobs", *rqrl_parent], args.jobs, args.timeout),
        ]
        rollout_rows = []
        if args.rollout_jobs:
            rollout_rows = [
                measure_rollout_jobs(server.url, "rqrl.engine.worker.RolloutWorker, one rollout per job",
                                     ROLLOUT_WORKER,
                                     rqrl_parent, args.rollout_jobs, one_rollout_per_job=True),
                measure_rollout_jobs(server.url, "rq.Worker (fork per job), one rollout per job, parent with "
                                     "torch + rqrl imported", FORKING_WORKER, rqrl_parent, args.rollout_jobs,
                                     one_rollout_per_job=True),
                measure_rollout_jobs(server.url, f"rq.Worker (fork per job), one rollout per job, bare parent "
                                     f"(only {min(args.rollout_jobs, 5)} jobs timed)", FORKING_WORKER, [],
                                     min(args.rollout_jobs, 5), one_rollout_per_job=True, warmup_jobs=1),
                measure_rollout_jobs(server.url, "rqrl.engine.worker.RolloutWorker, default slicing (reference)",
                                     ROLLOUT_WORKER, rqrl_parent, args.rollout_jobs, one_rollout_per_job=False),
            ]
    print()
    print(f"## RQ worker overhead (rq {rq.__version__}, JSONSerializer, {os.cpu_count()} logical CPUs)")
    print_table(f"Trivial jobs ({NOOP_JOB}), {args.jobs} jobs drained by one burst worker; time from the first "
                "job's start to the last job's end, inside the worker process:", noop_rows)
    if rollout_rows:
        print_table(f"rqrl rollout jobs: one {ROLLOUT_STEPS}-step rollout of {ACTORS_PER_JOB} CartPole-v1 actors per "
                    f"job, {args.rollout_jobs} jobs timed at the learner (collect_outputs); the reference row has "
                    "no job boundary between rollouts (ms per rollout):", rollout_rows)


if __name__ == "__main__":
    main()
