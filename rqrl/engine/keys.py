"""The only place Redis key names are built: ``rqrl:{run}:{kind}[:{id}]``.

Every key a run owns starts with ``rqrl:{run}:`` so several runs share one Redis and
``stop()`` can delete a run's keys by that prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rqrl.errors import ConfigError

PREFIX = "rqrl"
_RUN_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")

DEFAULT_QUEUE = "rqrl"  # the RQ queue rqrl jobs go to unless a run names another


def check_run_name(run_name: str) -> str:
    """Return ``run_name`` if it is safe inside key names and job ids, else raise ConfigError."""
    if not isinstance(run_name, str) or not _RUN_NAME.fullmatch(run_name):
        raise ConfigError(
            f"expected a run name of 1-64 letters, digits or '-', got {run_name!r}"
        )
    return run_name


@dataclass(frozen=True)
class RunKeys:
    """Key names of one run."""

    run_name: str

    def __post_init__(self) -> None:
        check_run_name(self.run_name)

    def _key(self, *parts: object) -> str:
        return ":".join((PREFIX, self.run_name, *map(str, parts)))

    @property
    def pattern(self) -> str:
        """Glob matching every key of this run (for cleanup)."""
        return self._key("*")

    @property
    def config(self) -> str:
        """JSON run config: rollout length, seeds, queue bound, ..."""
        return self._key("config")

    @property
    def env_factory(self) -> str:
        """Cloudpickled env factory, stored once per run."""
        return self._key("env_factory")

    @property
    def policy(self) -> str:
        """Cloudpickled policy architecture, stored once per run."""
        return self._key("policy")

    @property
    def latest_version(self) -> str:
        """Integer: the newest published weights version."""
        return self._key("weights", "latest")

    def weights(self, version: int) -> str:
        """Write-once safetensors blob of one weights version."""
        return self._key("weights", version)

    @property
    def weights_prefix(self) -> str:
        """``weights(v)`` less the version: the weights fetch script appends the version it reads."""
        return self._key("weights", "")

    @property
    def trajectories(self) -> str:
        """The bounded out-of-sync queue of encoded rollout records."""
        return self._key("trajectories")

    @property
    def doorbell(self) -> str:
        """A one-entry list that says a rollout may wait: set by pushes, cleared by pops, so the learner
        blocks on it instead of on the queue (whose BLMOVE would carry a whole rollout back)."""
        return self._key("doorbell")

    @property
    def unacknowledged(self) -> str:
        """Rollouts the learner popped but has not finished with: re-delivered if it dies."""
        return self._key("unacknowledged")

    @property
    def scratch(self) -> str:
        """A list the pop's screening script copies one entry to, to measure it (emptied before the script ends)."""
        return self._key("scratch")

    @property
    def acknowledged(self) -> str:
        """Integer: rollouts ever acknowledged, i.e. the absolute index of the unacknowledged list's head."""
        return self._key("acknowledged")

    @property
    def pushed_rollouts(self) -> str:
        """Hash actor id -> highest rollout id pushed: makes pushes idempotent."""
        return self._key("pushed")

    @property
    def pushed_by(self) -> str:
        """Hash actor id -> token of the job run that pushed its highest rollout (tells retries from re-runs)."""
        return self._key("pushed_by")

    @property
    def errors(self) -> str:
        """List of JSON error reports from failed jobs."""
        return self._key("errors")

    @property
    def worker_rates(self) -> str:
        """Hash worker name -> JSON {"steps_per_second", "at"}: each worker's own throughput on this run, which
        its job publishes with its heartbeat (``rqrl status``)."""
        return self._key("worker_rates")

    @property
    def sidelined(self) -> str:
        """Hash worker name -> JSON report of a worker that cannot run this run (a wrong RQRL_SECRET, env code
        that does not import there): it hands the run's jobs back instead of running them."""
        return self._key("sidelined")

    @property
    def stopped(self) -> str:
        """Set when the learner stops the run; jobs finish and enqueue no continuation."""
        return self._key("stopped")

    @property
    def learner_deadline(self) -> str:
        """Unix time until which the learner counts as alive (it moves it on as it runs); past it, jobs stop."""
        return self._key("learner_deadline")

    @property
    def learner_token(self) -> str:
        """The token of the learner that holds the run: a resuming learner writes its own, and the one it took the
        run from stops at its next heartbeat or publish (``RunStore``, ``WeightStore``)."""
        return self._key("learner_token")

    @property
    def learner(self) -> str:
        """Hash the learner rewrites with each heartbeat: its counters and windowed throughput (``rqrl status``)."""
        return self._key("learner")

    def lease(self, group_id: int) -> str:
        """Job id of the live job running an actor group, with a short TTL (see leases.py)."""
        return self._key("lease", group_id)

    def progress(self, group_id: int) -> str:
        """Next rollout id of an actor group: where a re-run continues."""
        return self._key("progress", group_id)

    def seed(self, name: str) -> str:
        """A key of the SEED trainer (rqrl.seed): settings, model, environment, requests, reply:{client}, ..."""
        return self._key("seed", name)

    def group_of_job(self, job_id: str) -> int | None:
        """The actor group of one of this run's job ids, else None."""
        if not job_id.startswith(self.job_id_prefix):
            return None
        group = job_id[len(self.job_id_prefix):].split("_")[0]
        return int(group[1:]) if group[:1] in ("g", "s") and group[1:].isdigit() else None

    def job_id(self, group_id: int, rollout_id: int, again: str | None = None) -> str:
        """RQ job id of one actor group's slice starting at ``rollout_id``; ``again`` tells apart a job handed
        back before it ran a rollout from the job it replaces (same group, same start)."""
        return f"{PREFIX}_{self.run_name}_g{group_id}_r{rollout_id}" + (f"_a{again}" if again else "")

    def sampler_job_id(self, group_id: int, version: int, token: str) -> str:
        """RQ job id of one sampler group's job for one obtain_* call (``token`` tells continuations apart)."""
        return f"{PREFIX}_{self.run_name}_s{group_id}_v{version}_{token}"

    # ---- garage sampler (rqrl.garage.store) ----

    @property
    def sampler_version(self) -> str:
        """Integer: the sampler's current call (version); episodes of any other are stale."""
        return self._key("version")

    def sampler_call(self, version: int) -> str:
        """JSON of one obtain_* call: mode, count, and each logical worker's agent and env update chains."""
        return self._key("call", version)

    def sampler_update(self, version: int, role: str, scope: int) -> str:
        """One agent or env update of a call (``scope`` -1: the one for every worker, else a worker's own)."""
        return self._key("update", version, role, "all" if scope < 0 else scope)

    def sampler_episodes(self, version: int) -> str:
        """List of signed episode buffers pushed for one call."""
        return self._key("episodes", version)

    def sampler_have(self, version: int) -> str:
        """Hash ``worker:episode`` -> 1 of one call: makes episode pushes idempotent."""
        return self._key("have", version)

    def sampler_next(self, version: int) -> str:
        """Hash of one call: worker -> next episode index, ``worker:steps`` -> steps pushed (a re-run's start)."""
        return self._key("next", version)

    def sampler_done(self, version: int) -> str:
        """Set once the sampler has what one call needs: jobs stop."""
        return self._key("done", version)

    @property
    def sampler_stale(self) -> str:
        """Integer: episodes refused, or dropped unfinished, because their call was over (read and reset by the
        sampler)."""
        return self._key("stale")

    @property
    def job_id_prefix(self) -> str:
        """Prefix shared by all RQ job ids of this run."""
        return f"{PREFIX}_{self.run_name}_"
