"""Command line: ``rqrl worker`` serves rollout jobs, ``rqrl demo`` collects CartPole rollouts,
``rqrl dashboard`` runs rq-dashboard for rqrl's JSON jobs."""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from rqrl.connection import redact_url
from rqrl.keys import DEFAULT_QUEUE

if TYPE_CHECKING:
    import torch
    from _typeshed import DataclassInstance

    from rqrl.actors import RedisDistributedActors
    from rqrl.progress import Progress

_Command = TypeVar("_Command", bound=Callable[..., Any])

REDIS_URL_HELP = "Redis to connect to, e.g. redis://host:6379/0 (env: REDIS_URL)."
INTERRUPTED_EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}
"""Exit codes of a run cut short by a signal (128 + the signal's number, the shells' convention); a run ended
by `rqrl stop` exits with 0, like one that ran to its end."""


def secret_from_env() -> str | None:
    """The learner's and workers' shared secret, RQRL_SECRET (an env var, never a flag: flags show in `ps`)."""
    from rqrl.codec import secret_from_environment

    return secret_from_environment()


def redis_server_from_env() -> str | None:
    """The redis-server binary for an embedded Redis that RQRL_REDIS_SERVER names, if set."""
    return os.environ.get("RQRL_REDIS_SERVER") or None


class _RqrlGroup(click.Group):
    """rqrl's commands, with ``train`` built on first use: its flags come from the algorithms' configs, which
    import torch, and every other command (and ``rqrl --help``) starts without torch."""

    lazy_commands = {"train": "Train IMPALA (V-trace) on distributed actors, PPO on the garage sampler (--algo "
                              "ppo), or DQN on the SEED trainer (--algo dqn)..."}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "train" and cmd_name not in self.commands:
            _train_command()  # registers itself on this group
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's command list, with the lazy commands' one-line help given here instead of built."""
        names = [name for name in self.list_commands(ctx)
                 if name in self.commands and not self.commands[name].hidden or name in self.lazy_commands]
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        shown = {**{name: click.Command(name, help=text) for name, text in self.lazy_commands.items()}, **self.commands}
        rows = [(name, shown[name].get_short_help_str(limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_RqrlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rqrl")
def main() -> None:
    """rqrl: distributed reinforcement-learning rollouts on Redis and RQ."""


@main.command()
@click.option("--redis-url", envvar="REDIS_URL", required=True, help=REDIS_URL_HELP)
@click.option("--queue", "queues", multiple=True, default=[DEFAULT_QUEUE], show_default=True,
              help="RQ queue(s) to serve, in priority order (env: RQRL_QUEUE).", envvar="RQRL_QUEUE")
@click.option("--name", default=None, help="Worker name shown in rq-dashboard (default: host.pid.random).")
@click.option("--burst", is_flag=True, help="Exit when the queues are empty instead of waiting for jobs.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), help="Logging level.")
def worker(redis_url: str, queues: tuple[str, ...], name: str | None, burst: bool, log_level: str) -> None:
    """Run an RQ worker that keeps envs and policies warm between rollout jobs.

    Needs RQRL_SECRET, the learner's shared secret (the env var, never a flag: flags show in `ps`).
    """
    import redis

    from rqrl.worker import run_worker

    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not secret_from_env():
        raise click.ClickException(
            "RQRL_SECRET is not set: workers only unpickle env factories and policies signed with the learner's "
            "shared secret; set RQRL_SECRET to the same value for the learner and every worker"
        )
    try:
        redis.Redis.from_url(redis_url).ping()
    except (redis.RedisError, ValueError) as error:
        raise click.ClickException(
            f"cannot reach Redis at {redact_url(redis_url)}: {error}; check --redis-url"
        ) from error
    run_worker(redis_url, list(queues), name=name, burst=burst, logging_level=log_level)


@main.command()
@click.argument("run_name")
@click.option("--redis-url", envvar="REDIS_URL", required=True, help=REDIS_URL_HELP)
@click.option("--wait", default=60.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to wait for the run's learner to write its checkpoint and remove the run's keys.")
def stop(run_name: str, redis_url: str, wait: float) -> None:
    """End run RUN_NAME from anywhere: its learner stops as on Ctrl-C (checkpoint, summary, keys removed) and
    exits with 0, and its jobs end, freeing their workers.

    A run whose learner is gone (no heartbeat within its learner_timeout) is cleaned up here instead: its jobs
    are stopped and its keys removed; `rqrl train --resume` can still continue it from its run folder.
    """
    import redis

    from rqrl.errors import RqrlError
    from rqrl.keys import RunKeys
    from rqrl.leases import learner_gone
    from rqrl.rq_safety import rollout_queue
    from rqrl.run_config import RunConfig
    from rqrl.run_store import RunStore

    try:
        keys = RunKeys(run_name)
        connection = redis.Redis.from_url(redis_url)
        raw_config, deadline, seed_settings = connection.mget([keys.config, keys.learner_deadline,
                                                               keys.seed("settings")])
        if raw_config is None and seed_settings is not None:  # a SEED trainer's run (rqrl train --algo dqn)
            _stop_seed_run(connection, keys, run_name, wait)
            return
        if raw_config is None:
            raise click.ClickException(f"no run {run_name!r} in the Redis at {redact_url(redis_url)} (already "
                                       f"stopped, or another Redis or database?)")
        config = RunConfig.from_json(raw_config)
        connection.set(keys.stopped, 1)
        if deadline is None or learner_gone(deadline):
            RunStore(connection, keys, b"").stop(rollout_queue(config.queue_name, connection), wait)
            click.echo(f"run {run_name}: no live learner; stopped its jobs and removed its keys")
            return
        click.echo(f"run {run_name}: stop requested; waiting up to {wait:g} s for its learner to finish")
        deadline_at = time.monotonic() + wait
        while connection.exists(keys.config):
            if time.monotonic() > deadline_at:
                raise click.ClickException(f"run {run_name}: its learner has not finished within {wait:g} s; it "
                                           f"stops at its next collect (raise --wait to wait longer)")
            time.sleep(0.2)
    except (redis.RedisError, RqrlError) as error:
        raise click.ClickException(f"cannot stop run {run_name!r}: {error}") from error
    click.echo(f"run {run_name}: stopped by its learner (checkpoint written, keys removed)")


def _stop_seed_run(connection: Any, keys: Any, run_name: str, wait: float) -> None:
    """Set a SEED run's stop flag and wait for its trainer to end the run (its jobs end with the flag)."""
    connection.set(keys.seed("stopped"), 1)
    click.echo(f"run {run_name} (SEED trainer): stop requested; waiting up to {wait:g} s for its trainer to finish")
    deadline_at = time.monotonic() + wait
    while connection.exists(keys.seed("settings")):
        if time.monotonic() > deadline_at:
            raise click.ClickException(
                f"run {run_name}: its trainer has not finished within {wait:g} s (raise --wait). Its actor and "
                f"server jobs have stopped; if the trainer is gone, the run's keys rqrl:{run_name}:* stay until "
                f"deleted")
        time.sleep(0.2)
    click.echo(f"run {run_name}: stopped by its trainer (checkpoint written, keys removed)")


@main.command()
@click.option("--redis-url", envvar="REDIS_URL", required=True, help=REDIS_URL_HELP)
@click.option("-b", "--bind", default="127.0.0.1", show_default=True,
              help="Address to listen on. 0.0.0.0 opens it to the network: set --username and --password, and put "
                   "TLS in front (the compose file binds 0.0.0.0 inside its container and publishes the port on "
                   "127.0.0.1 only).")
@click.option("-p", "--port", default=9181, show_default=True, type=click.IntRange(1, 65535), help="Port to listen on.")
@click.option("--url-prefix", default="", help="URL prefix, e.g. behind a reverse proxy.")
@click.option("--username", envvar="RQ_DASHBOARD_USERNAME", default=None,
              help="HTTP Basic Auth user (env: RQ_DASHBOARD_USERNAME); no login unless set.")
@click.option("--password", envvar="RQ_DASHBOARD_PASSWORD", default=None,
              help="HTTP Basic Auth password; prefer the env var RQ_DASHBOARD_PASSWORD (flags show in `ps`).")
@click.option("--delete/--no-delete", "allow_delete", default=False, show_default=True,
              help="Show the buttons that delete jobs and empty or compact queues and registries.")
@click.option("--poll-interval", default=None, type=click.IntRange(min=1),
              help="Milliseconds between the pages' refreshes (rq-dashboard's default: 2500).")
@click.option("--debug", is_flag=True, help="Flask's debug mode (never on a network: it runs code on request).")
def dashboard(redis_url: str, bind: str, port: int, url_prefix: str, username: str | None, password: str | None,
              allow_delete: bool, poll_interval: int | None, debug: bool) -> None:
    """Run rq-dashboard set up for rqrl: JSON jobs read through rqrl's classes (never pickle), the Jobs tab on
    the rqrl queue, and a page that says a job is gone instead of an error (rqrl keeps finished jobs for 0 s,
    failed ones for 24 h, and a run's jobs until its learner stops). Needs `pip install 'rqrl[dashboard]'`.
    """
    try:
        import rq_dashboard.cli
        import rq_dashboard.web
    except ImportError as error:
        raise click.ClickException("rq-dashboard is not installed: pip install 'rqrl[dashboard]'") from error
    from rqrl.rq_safety import secure_rq_dashboard

    if bind not in ("127.0.0.1", "localhost", "::1") and not (username and password):
        logging.getLogger(__name__).warning(
            "rqrl dashboard listens on %s without a login: anyone who reaches it sees the jobs%s; set --username "
            "and RQ_DASHBOARD_PASSWORD", bind, " and can delete them" if allow_delete else "")
    secure_rq_dashboard(rq_dashboard.web)  # JSON and rqrl's job class on every page and action: no pickle
    arguments = ["--json", "--redis-url", redis_url, "--bind", bind, "--port", str(port), "--url-prefix", url_prefix]
    if username:
        arguments += ["--username", username]
    if password:
        arguments += ["--password", password]
    if not allow_delete:
        arguments.append("--disable-delete")
    if poll_interval is not None:
        arguments += ["--poll-interval", str(poll_interval)]
    if debug:
        arguments.append("--debug")
    rq_dashboard.cli.run.main(args=arguments, prog_name="rqrl dashboard", auto_envvar_prefix="RQ_DASHBOARD")


@main.command()
@click.option("--redis-url", envvar="REDIS_URL", required=True, help=REDIS_URL_HELP)
@click.option("--worker", "worker_prefix", is_flag=False, flag_value="", default=None,
              help="Check that a worker of this host (default names: rqrl.HOSTNAME.*; or give a name prefix) sent "
                   "a heartbeat in the last 20 s.")
@click.option("--run", "run_name", default=None, help="Check that run RUN's learner is alive (its heartbeat "
                                                       "deadline, --learner-timeout, has not passed).")
def health(redis_url: str, worker_prefix: str | None, run_name: str | None) -> None:
    """Exit 0 if what is checked is healthy, else print why and exit 1: a container's HEALTHCHECK."""
    import redis

    from rqrl.errors import RqrlError
    from rqrl.health import host_worker_prefix, learner_is_healthy, worker_is_healthy

    if worker_prefix is None and run_name is None:
        raise click.UsageError("give --worker, --run RUN or both")
    try:
        connection = redis.Redis.from_url(redis_url)
        checks = []
        if worker_prefix is not None:
            checks.append(worker_is_healthy(connection, worker_prefix or host_worker_prefix()))
        if run_name is not None:
            checks.append(learner_is_healthy(connection, run_name))
    except (redis.RedisError, RqrlError) as error:
        raise click.ClickException(f"cannot check health: {error}") from error
    for healthy, reason in checks:
        click.echo(("healthy: " if healthy else "unhealthy: ") + reason)
    if not all(healthy for healthy, _ in checks):
        raise SystemExit(1)


@main.command()
@click.option("--redis-url", envvar="REDIS_URL", required=True, help=REDIS_URL_HELP)
@click.option("--run", "run_name", default=None, help="Show only this run (default: every run on the Redis).")
@click.option("--watch", is_flag=False, flag_value=2.0, default=None, type=click.FloatRange(min=0.5),
              help="Refresh every WATCH seconds (default 2) until Ctrl-C.")
def status(redis_url: str, run_name: str | None, watch: float | None) -> None:
    """Show every run on a Redis: learner heartbeat, steps/s over 10 s and 60 s, policy version and lag, queue
    depth against its bound, jobs queued, started and failed, recent failures, and the workers on the run's
    queue with what each runs."""
    import redis

    from rqrl.errors import RqrlError
    from rqrl.status import format_status, read_status

    connection = redis.Redis.from_url(redis_url)
    terminal = sys.stdout.isatty()
    try:
        while True:
            try:
                screen = format_status(read_status(connection, run_name))
            except (redis.RedisError, RqrlError) as error:
                raise click.ClickException(f"cannot read the status: {error}") from error
            if watch is not None and terminal:
                click.clear()
            click.echo(screen)
            if watch is None:
                return
            if not terminal:
                click.echo(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}")
            time.sleep(watch)
    except KeyboardInterrupt:
        return


def _config_options(config_class: type[DataclassInstance], exclude: frozenset[str] = frozenset(),
                    prefix: str = "") -> Callable[[_Command], _Command]:
    """Decorator adding one click option per dataclass field (but ``exclude``), with ``prefix`` + its help text."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(config_class)

    def decorate(command: _Command) -> _Command:
        for spec in reversed(dataclasses.fields(config_class)):
            if spec.name in exclude:
                continue
            hint = hints[spec.name]
            optional = type(None) in typing.get_args(hint)
            base = next((arg for arg in typing.get_args(hint) if arg is not type(None)), hint)
            flag = "--" + spec.name.replace("_", "-")
            help_text = prefix + spec.metadata.get("help", "")
            if base is bool:
                option = click.option(f"{flag}/--no-{flag[2:]}", spec.name, default=spec.default, show_default=True,
                                      help=help_text)
            else:
                option = click.option(flag, spec.name, type=base, default=spec.default, help=help_text,
                                      show_default=not optional or spec.default is not None)
            command = option(command)
        return command

    return decorate


def _train_command() -> click.Command:
    import dataclasses

    from rqrl.algorithms.dqn import DqnConfig
    from rqrl.algorithms.impala import ImpalaConfig
    from rqrl.algorithms.ppo import PpoConfig

    impala_fields = frozenset(spec.name for spec in dataclasses.fields(ImpalaConfig))
    ppo_fields = frozenset(spec.name for spec in dataclasses.fields(PpoConfig))
    dqn_fields = frozenset(spec.name for spec in dataclasses.fields(DqnConfig))

    @main.command(name="train")
    @click.option("--algo", type=click.Choice(["impala", "ppo", "dqn"]), default="impala", show_default=True,
                  help="impala: V-trace on distributed actors; ppo: PPO on the garage sampler; dqn: Rainbow-style DQN "
                       "on the SEED trainer (flags marked [ppo] or [dqn] are their own; shared flags left out take "
                       "PpoConfig's or DqnConfig's defaults, not the ones shown).")
    @_config_options(ImpalaConfig)
    @_config_options(PpoConfig, exclude=impala_fields, prefix="[ppo] ")
    @_config_options(DqnConfig, exclude=impala_fields | ppo_fields, prefix="[dqn] ")
    @click.option("--env", "env_alias", default=None, help="Alias of --env-id.")
    @click.option("--log-level", default="WARNING", show_default=True,
                  type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), help="Logging level.")
    def train(algo: str, env_alias: str | None, log_level: str, **options: Any) -> None:
        """Train IMPALA (V-trace) on distributed actors, PPO on the garage sampler (--algo ppo), or DQN on the SEED
        trainer (--algo dqn), until the env is solved or the budget ends.

        Writes into RUN_DIR/RUN_NAME: final and best weights, a checkpoint for --resume, metrics.csv,
        TensorBoard events and learning_curve.png.
        """
        from rqrl.algorithms import dqn, impala, ppo
        from rqrl.errors import RqrlError
        from rqrl.process import terminate_like_ctrl_c

        logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        context = click.get_current_context()
        given = {name for name in options if context.get_parameter_source(name) != click.core.ParameterSource.DEFAULT}
        own = {"ppo": ppo_fields, "dqn": dqn_fields}.get(algo, impala_fields)
        other = (impala_fields | ppo_fields | dqn_fields) - own
        if given & other:
            flags = ", ".join("--" + name.replace("_", "-") for name in sorted(given & other))
            raise click.UsageError(f"{flags} do(es) not apply to --algo {algo}")
        # PPO and DQN take only the flags given: the defaults shown are IMPALA's
        options = {name: value for name, value in options.items()
                   if name in own and (algo == "impala" or name in given)}
        logging.captureWarnings(True)  # warnings as log records: they never break into the progress bar
        if env_alias:
            options["env_id"] = env_alias
        if options.get("redis_url") is None:
            options["redis_url"] = os.environ.get("REDIS_URL")
        terminate_like_ctrl_c()  # `docker stop`, `docker compose stop` and Kubernetes send SIGTERM
        try:
            if algo == "ppo":
                result = ppo.train(ppo.PpoConfig(**options), secret=secret_from_env(),
                                   redis_server=redis_server_from_env())
            elif algo == "dqn":
                result = dqn.train(dqn.DqnConfig(**options), secret=secret_from_env(),
                                   redis_server=redis_server_from_env())
            else:
                result = impala.train(impala.ImpalaConfig(**options), secret=secret_from_env(),
                                      redis_server=redis_server_from_env())
        except RqrlError as error:
            raise click.ClickException(str(error)) from error
        state = ("solved" if result.solved else f"interrupted ({result.stopped_by})" if result.interrupted
                 else f"{result.budget} budget reached")
        mean = f"{result.mean_return:.1f}" if result.mean_return is not None else "n/a"
        click.echo(f"{state}: {result.env_steps:,} env steps, {result.updates:,} updates in {result.seconds:.1f} s "
                   f"({result.env_steps / max(result.seconds, 1e-9):,.0f} steps/s); mean return of the last 100 "
                   f"episodes {mean} over {result.episodes:,} episodes")
        if result.bottleneck_detail:
            click.echo(result.bottleneck_detail)
        click.echo(f"run folder: {result.run_dir}")
        if result.stopped_by in INTERRUPTED_EXIT_CODES:
            raise SystemExit(INTERRUPTED_EXIT_CODES[result.stopped_by])

    return train


@main.command()
@click.argument("run_dir", required=False, type=click.Path(exists=True, file_okay=False))
@click.option("--checkpoint", type=click.Path(exists=True, dir_okay=False),
              help="A weights file (best/final/checkpoint .safetensors) instead of RUN_DIR's best weights.")
@click.option("--episodes", default=10, show_default=True, help="Episodes to run.")
@click.option("--seed", default=0, show_default=True, help="Seed of the first episode's reset.")
@click.option("--sample", is_flag=True, help="Sample actions instead of taking the most likely one.")
def evaluate(run_dir: str | None, checkpoint: str | None, episodes: int, seed: int, sample: bool) -> None:
    """Run episodes with a trained policy and print the mean and std of the returns."""
    import numpy as np

    from rqrl.algorithms.impala import evaluate as run_episodes
    from rqrl.algorithms.impala import load_policy
    from rqrl.errors import RqrlError

    sources = [source for source in (run_dir, checkpoint) if source is not None]
    if len(sources) != 1:
        raise click.UsageError("give either RUN_DIR or --checkpoint")
    try:
        from rqrl.algorithms.dqn import is_dqn_weights, load_q_model

        model, metadata = load_q_model(sources[0]) if is_dqn_weights(sources[0]) else load_policy(sources[0])
    except (RqrlError, KeyError) as error:
        raise click.ClickException(f"cannot load a policy from {sources[0]}: {error}") from error
    returns = run_episodes(model, metadata["env_id"], episodes, seed, greedy=not sample)
    click.echo(f"{metadata['env_id']}: {episodes} episodes, return {np.mean(returns):.1f} +- {np.std(returns):.1f} "
               f"(min {np.min(returns):.1f}, max {np.max(returns):.1f})")



def _demo_policy(obs_size: int, n_actions: int) -> torch.nn.Sequential:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(obs_size, 64), torch.nn.Tanh(), torch.nn.Linear(64, n_actions))


@main.command()
@click.option("--env", "env_id", default="CartPole-v1", show_default=True, help="Gymnasium env id.")
@click.option("--actors", default=8, show_default=True, help="Number of actors (envs).")
@click.option("--workers", default=None, type=int,
              help="Local worker processes (default: one per core with an embedded Redis, 0 with --redis-url).")
@click.option("--rollout-steps", default=128, show_default=True, help="Steps per rollout.")
@click.option("--batch-size", default=8, show_default=True, help="Rollouts per collect_outputs batch.")
@click.option("--seconds", default=20.0, show_default=True, help="How long to collect.")
@click.option("--redis-url", envvar="REDIS_URL", default=None,
              help="Redis to use (env: REDIS_URL); default: an embedded private redis-server.")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Show progress on stderr: a live bar on a terminal, else a plain line every --progress-seconds; "
                   "the final summary always prints.")
@click.option("--progress-seconds", default=10.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds between two progress lines when stderr is not a terminal.")
def demo(env_id: str, actors: int, workers: int | None, rollout_steps: int, batch_size: int, seconds: float,
         redis_url: str | None, progress: bool, progress_seconds: float) -> None:
    """Collect rollouts with a random-init policy and print throughput and episode stats."""
    import gymnasium

    from rqrl.actors import RedisDistributedActors
    from rqrl.errors import RqrlError
    from rqrl.process import terminate_like_ctrl_c
    from rqrl.progress import Progress

    logging.basicConfig(level=logging.WARNING)
    logging.captureWarnings(True)
    env_factory = functools.partial(gymnasium.make, env_id)
    probe = env_factory()
    observation_space, action_space = probe.observation_space, probe.action_space
    probe.close()
    if not (isinstance(observation_space, gymnasium.spaces.Box) and len(observation_space.shape) == 1
            and isinstance(action_space, gymnasium.spaces.Discrete)):
        raise click.ClickException(
            f"the demo's policy needs a flat Box observation space and a Discrete action space, and {env_id} has "
            f"{observation_space} and {action_space}; pick an env such as CartPole-v1 or Acrobot-v1"
        )
    policy = _demo_policy(int(observation_space.shape[0]), int(action_space.n))
    click.echo(f"rqrl demo: {env_id}, {actors} actors, {rollout_steps}-step rollouts, batches of {batch_size}")
    terminate_like_ctrl_c()
    try:
        with RedisDistributedActors(env_factory, policy, rollout_steps, actors, batch_size, 2.0,
                                    redis_url=redis_url, n_local_workers=workers, start_method="forkserver",
                                    secret=secret_from_env(), redis_server=redis_server_from_env()) as run:
            run.broadcast_updated_policy(policy.state_dict())
            click.echo(f"run {run.run_name}: {run.n_local_workers} local worker(s), Redis {redact_url(run.redis_url)}")
            stopped_by = _collect_with_progress(run, seconds, Progress(f"demo {env_id}", enabled=progress,
                                                                       interval=progress_seconds))
    except RqrlError as error:
        raise click.ClickException(str(error)) from error
    if stopped_by is not None:
        raise SystemExit(INTERRUPTED_EXIT_CODES[stopped_by])


def _collect_with_progress(run: RedisDistributedActors, seconds: float, progress: Progress) -> str | None:
    """Collect for ``seconds`` showing progress, then print a summary; returns what cut it short (SIGINT, SIGTERM)."""
    from rqrl.process import Terminated

    started = time.monotonic()
    total_steps = 0
    returns: list[float] = []
    stopped_by = None
    with progress:
        try:
            while time.monotonic() - started < seconds:
                record, size_before, _, _ = run.collect_outputs("cpu")
                total_steps += record.rewards.numel()
                returns.extend(record.episode_returns.tolist())
                lags = (run.policy_version - record.policy_version).float()
                recent = returns[-100:]
                progress.update(total_steps, mean_return=sum(recent) / len(recent) if recent else None,
                                lag=float(lags.mean()), lag_max=float(lags.max()), queue=size_before,
                                queue_bound=run.queue_capacity, workers=run.workers_alive())
        except KeyboardInterrupt as error:
            stopped_by = "SIGTERM" if isinstance(error, Terminated) else "SIGINT"
    stats = run.get_epoch_stats_aggregator().reduce()
    elapsed = time.monotonic() - started
    state = f"interrupted ({stopped_by})" if stopped_by else "done"
    click.echo(f"{state}: {total_steps:,} env steps in {elapsed:.1f} s = {total_steps / elapsed:,.0f} steps/s; "
               f"episodes {int(stats.get('episode_return', {}).get('count', 0))}, "
               f"policy lag max {stats.get('policy_lag', {}).get('max', 0):.0f}")
    return stopped_by


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
