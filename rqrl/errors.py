"""The rqrl exception tree; every error a user can meet derives from RqrlError.

    ```text
    RqrlError
    ├── ConfigError (also ValueError)      bad constructor or CLI arguments
    │   ├── MissingExtraError              ... or an optional package (an rqrl extra) is not installed
    │   └── RunFolderError                 ... or a run folder holds another run, or another learner writes it
    ├── ServerError (also RuntimeError)    the embedded redis-server did not start or is not running
    │   └── RedisServerNotFoundError       ... because there is no usable redis-server binary
    ├── PolicyError                        a policy that does not follow the protocol
    ├── EnvError                           an env that breaks its contract (NaN reward, ...)
    │   └── VectorEnvError                 an env of a SubprocVectorEnv raised (its traceback kept)
    │       └── EnvProcessDiedError        ... or its process died
    ├── SignatureError                     an unsigned or tampered pickled payload
    ├── ForbiddenJobError                  a job that names a function rqrl does not run
    ├── RecordError                        a queue entry that cannot be decoded
    ├── MissingStatsError (also KeyError)  a statistic with no values yet
    ├── ActorFailedError                   an env or policy raised on a worker
    │   └── WorkersRefusedError            every live worker refused the run (secret, env code)
    ├── WorkerUnfitError                   this worker cannot run a run's jobs (workers only)
    ├── CollectTimeoutError                nothing arrived within the timeout
    │   └── NoWorkersError                 ... because no worker is alive
    ├── RunStoppedError                    the run was stopped while waiting
    │   └── RunTakenOverError              ... or another learner resumed it
    ├── ProcessesDiedError                 a trainer's actor processes, threads or servers kept dying at start
    ├── LeaseLostError                     another job took over a job's actor group (workers only)
    ├── CheckpointError                    a checkpoint or weights file is missing, corrupted or foreign
    ├── RedisUnavailableError              Redis stayed unreachable past the outage deadline
    │   └── RedisOutOfMemoryError          ... or stayed full (maxmemory reached) as long
    └── RedisRefusedError                  Redis refused the login or a command (password, ACL, TLS)
    ```
"""

from __future__ import annotations


class RqrlError(Exception):
    """Base class of every error raised by rqrl."""


class ConfigError(RqrlError, ValueError):
    """An argument is out of range or inconsistent; the message names it and the fix."""


class MissingExtraError(ConfigError):
    """What was asked for needs an optional package that is not installed; ``extra`` names the rqrl extra that
    installs it, and the message says how (``pip install "rqrl[EXTRA]"``)."""

    def __init__(self, message: str, *, extra: str):
        super().__init__(f'{message}: pip install "rqrl[{extra}]"')
        self.extra = extra


class RunFolderError(ConfigError):
    """A learner's run folder holds another run (a new run would write over it), or another learner on this machine
    writes it now; the message says how to resume the run or name this one."""


class ServerError(RqrlError, RuntimeError):
    """The embedded redis-server did not start, or was used before start()."""


class RedisServerNotFoundError(ServerError):
    """No redis-server binary to start an embedded Redis."""


class PolicyError(RqrlError):
    """The policy does not follow the protocol rqrl expects."""


class EnvError(RqrlError):
    """An env broke its contract on a worker, e.g. returned a reward that is not a finite number."""


class VectorEnvError(EnvError):
    """An env raised in its subprocess (or its process is gone); names the env and keeps its traceback."""

    def __init__(self, message: str, *, env_index: int | None, remote_traceback: str | None = None):
        if remote_traceback:
            message = f"{message}\n--- traceback in the process of env {env_index} ---\n{remote_traceback}"
        super().__init__(message)
        self.env_index = env_index
        self.remote_traceback = remote_traceback


class EnvProcessDiedError(VectorEnvError):
    """An env's subprocess exited (killed, crashed) while the caller talked to it."""

    def __init__(self, env_index: int, exitcode: int | None):
        super().__init__(
            f"the process of env {env_index} died (exit code {exitcode}); close() this SubprocVectorEnv "
            "and build a new one",
            env_index=env_index,
        )
        self.exitcode = exitcode


class SignatureError(RqrlError):
    """A pickled payload (env factory, policy) is unsigned, tampered, or signed with another secret."""


class ForbiddenJobError(RqrlError):
    """An RQ job names a function or callback that rqrl workers refuse to run."""


class RecordError(RqrlError):
    """A trajectory record could not be decoded or does not belong to this run."""


class MissingStatsError(RqrlError, KeyError):
    """get_stats_value asked for an event that has no values yet."""


class ActorFailedError(RqrlError):
    """An env or policy raised on a worker; carries the job id and the remote traceback."""

    def __init__(self, message: str, *, job_id: str, actor_ids: list[int], remote_traceback: str):
        super().__init__(f"{message}\n--- traceback on the worker (job {job_id}) ---\n{remote_traceback}")
        self.job_id = job_id
        self.actor_ids = actor_ids
        self.remote_traceback = remote_traceback


class WorkersRefusedError(ActorFailedError):
    """Every live worker on the run's queue refused its jobs (a wrong RQRL_SECRET, env code that does not
    import there): with no worker able to run it, the run cannot go on."""


class WorkerUnfitError(RqrlError):
    """This worker cannot run a run's jobs: it cannot verify the run's signed payload (no or another
    RQRL_SECRET), or cannot import the env or policy code. The job is handed back and the worker sidelined
    for that run; other workers go on with it."""


class CollectTimeoutError(RqrlError, TimeoutError):
    """collect_outputs waited longer than its timeout for rollouts."""


class NoWorkersError(CollectTimeoutError):
    """collect_outputs is waiting but no worker is connected to the queue."""


class RunStoppedError(RqrlError):
    """The run was stopped (or never started) while an operation waited on it."""


class RunTakenOverError(RunStoppedError):
    """Another learner resumed this learner's run (``resume=True``, ``rqrl train --resume``): this one stops and
    leaves the run's keys and jobs to it."""


class ProcessesDiedError(RqrlError):
    """The SEED trainer's actor or server processes (or jobs), or one of its actor threads, kept dying before the
    first transition arrived: the run cannot start, and the message names which, how it ended, and the usual
    causes."""


class RedisUnavailableError(RqrlError):
    """Redis could not be reached for longer than the configured outage deadline."""


class RedisOutOfMemoryError(RedisUnavailableError):
    """Redis refused writes for memory (its maxmemory reached) for longer than the outage deadline; until then
    rqrl's clients wait for memory as they wait through an outage."""


class RedisRefusedError(RqrlError):
    """Redis answered but refused: a wrong password, an ACL rule, an untrusted TLS certificate, a read-only
    server. Waiting does not help; the message names the fix."""


class LeaseLostError(RqrlError):
    """Another job took over this job's actor group (the reaper judged this one dead or hung)."""


class CheckpointError(RqrlError):
    """A checkpoint or weights file is missing, corrupted or does not fit the model, or a run file (a checkpoint,
    weights, metrics.csv, summary.json) cannot be written: a full or read-only disk."""
