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
    def unacknowledged(self) -> str:
        """Rollouts the learner popped but has not finished with: re-delivered if it dies."""
        return self._key("unacknowledged")

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
    def stopped(self) -> str:
        """Set when the learner stops the run; jobs finish and enqueue no continuation."""
        return self._key("stopped")

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
        return int(group[1:]) if group.startswith("g") and group[1:].isdigit() else None

    def job_id(self, group_id: int, rollout_id: int) -> str:
        """RQ job id of one actor group's slice starting at ``rollout_id``."""
        return f"{PREFIX}_{self.run_name}_g{group_id}_r{rollout_id}"

    @property
    def job_id_prefix(self) -> str:
        """Prefix shared by all RQ job ids of this run."""
        return f"{PREFIX}_{self.run_name}_"
