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

from rqrl.cli.train import INTERRUPTED_EXIT_CODES
from rqrl.engine.connection import check_redis_url, redact_url
from rqrl.engine.keys import DEFAULT_QUEUE

if TYPE_CHECKING:
    import torch

    from rqrl.engine.progress import Progress
    from rqrl.maze.actors import RedisDistributedActors

_Command = TypeVar("_Command", bound=Callable[..., Any])

REDIS_URL_HELP = "Redis to connect to, e.g. redis://host:6379/0 (env: REDIS_URL)."


def secret_from_env() -> str | None:
    """The learner's and workers' shared secret, RQRL_SECRET or the file RQRL_SECRET_FILE names (never a flag:
    flags show in `ps`)."""
    from rqrl.engine.codec import secret_from_environment
    from rqrl.errors import ConfigError

    try:
        return secret_from_environment()
    except ConfigError as error:
        raise click.ClickException(str(error)) from error


def redis_server_from_env() -> str | None:
    """The redis-server binary for an embedded Redis that RQRL_REDIS_SERVER names, if set."""
    return os.environ.get("RQRL_REDIS_SERVER") or None


def _redis_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A --redis-url that is a Redis URL, else a one-line usage error saying what one looks like."""
    from rqrl.errors import ConfigError

    try:
        return None if value is None else check_redis_url(value)
    except ConfigError as error:
        raise click.BadParameter(str(error), ctx, param) from None


class _RqrlGroup(click.Group):
    """rqrl's commands, with ``train`` built on first use: its flags come from the algorithms' configs, which
    import torch, and every other command (and ``rqrl --help``) starts without torch."""

    lazy_commands = {"train": "Train IMPALA (default), PPO (`rqrl train ppo`) or DQN (`rqrl train dqn`) until "
                              "the env is solved..."}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "train" and cmd_name not in self.commands:
            from rqrl.cli.train import train_group

            self.add_command(train_group())
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        """The command; a Ctrl-C that reaches here (one while a command starts, before it handles its own, or in
        a command that does not) exits 130, as a run's does, where click's default says "Aborted!" and exits 1."""
        command = _command_name(ctx)  # read first: click's invoke takes the arguments out of the context
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as interrupt:
            signal_name = "SIGTERM" if type(interrupt).__name__ == "Terminated" else "SIGINT"
            click.echo(f"interrupted ({signal_name}){_before_the_run(command)}", err=True)
            raise SystemExit(INTERRUPTED_EXIT_CODES[signal_name]) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's command list, with the lazy commands' one-line help given here instead of built."""
        names = [name for name in self.list_commands(ctx)
                 if name in self.commands and not self.commands[name].hidden or name in self.lazy_commands]
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        # a lazy command's line is the same whether or not it was built (a built train group's help is longer)
        shown = {**self.commands, **{name: click.Command(name, help=text) for name, text in self.lazy_commands.items()}}
        rows = [(name, shown[name].get_short_help_str(limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _before_the_run(command: str | None) -> str:
    """What an interrupted ``command`` adds to "interrupted (SIGINT)": for ``train`` stopped before it called its
    learner (while it imported torch, say), that no run folder was written; once the learner was called, nothing
    (its folder may be there: the learner's own line says what it wrote)."""
    train = sys.modules.get("rqrl.cli.train")
    if command != "train" or (train is not None and getattr(train, "learner_called", False)):
        return ""
    return " before the run started: nothing written, no run folder"


def _command_name(ctx: click.Context) -> str | None:
    """The subcommand the command line names (click 8.2+ keeps it in ``_protected_args``, older clicks in
    ``protected_args``), even before click has resolved it."""
    names = getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", None) or ctx.args
    return names[0] if names else None


@click.group(cls=_RqrlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rqrl")
def main() -> None:
    """rqrl: distributed reinforcement-learning rollouts on Redis and RQ."""


@main.command()
@click.option("--redis-url", envvar="REDIS_URL", required=True, help=REDIS_URL_HELP, callback=_redis_url)
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

    from rqrl.engine.worker import run_worker

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
@click.option("--redis-url", envvar="REDIS_URL", required=True, help=REDIS_URL_HELP, callback=_redis_url)
@click.option("--wait", default=60.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to wait for the run's learner to write its checkpoint and remove the run's keys.")
def stop(run_name: str, redis_url: str, wait: float) -> None:
    """End run RUN_NAME from anywhere: its learner stops as on Ctrl-C (checkpoint, summary, keys removed) and
    exits with 0, and its jobs end, freeing their workers.

    A run whose learner is gone (no heartbeat within its learner_timeout) is cleaned up here instead: its jobs
    are stopped and its keys removed; `rqrl train --resume` can still continue it from its run folder. So is one
    whose learner's heartbeat deadline passes during --wait; a learner whose heartbeat does not move in --wait
    is said to look dead, with when its deadline passes.
    """
    import redis

    from rqrl.engine.keys import RunKeys
    from rqrl.engine.leases import learner_gone
    from rqrl.engine.run_config import RunConfig
    from rqrl.errors import RqrlError

    try:
        keys = RunKeys(run_name)
        connection = redis.Redis.from_url(redis_url)
        raw_config, deadline = connection.mget([keys.config, keys.learner_deadline])
        if raw_config is None:
            raise click.ClickException(f"no run {run_name!r} in the Redis at {redact_url(redis_url)} (already "
                                       f"stopped, or another Redis or database?)")
        config = RunConfig.from_json(raw_config)
        if deadline is None or learner_gone(deadline):
            _remove_run(connection, keys, config.queue_name, wait)
            return
        connection.set(keys.stopped, 1)
        click.echo(f"run {run_name}: stop requested; waiting up to {wait:g} s for its learner to finish")
        try:
            if not _learner_finished(connection, keys, wait, deadline):
                _remove_run(connection, keys, config.queue_name, wait)  # its deadline passed while we waited
                return
        except redis.exceptions.ConnectionError:
            if not _socket_gone(connection):
                raise
            click.echo(f"run {run_name}: stopped; its learner shut down its own Redis as it ended (it writes its "
                       f"checkpoint and summary as it exits)")
            return
    except redis.exceptions.OutOfMemoryError as error:
        raise click.ClickException(
            f"cannot stop run {run_name!r}: Redis at {redact_url(redis_url)} is at its maxmemory and refused the "
            f"run's stop flag ({error}); raise maxmemory for a moment (redis-cli CONFIG SET maxmemory BYTES) and "
            f"run this again: the learner deletes the run's keys as it stops, which frees the memory") from error
    except (redis.RedisError, RqrlError) as error:
        raise click.ClickException(f"cannot stop run {run_name!r}: {error}") from error
    click.echo(f"run {run_name}: stopped by its learner (checkpoint written, keys removed)")


def _remove_run(connection: Any, keys: Any, queue_name: str, wait: float) -> None:
    """Stop the jobs of a run whose learner is gone and remove its keys, leaving its stop flag for a day."""
    from rqrl.engine.rq_safety import rollout_queue
    from rqrl.engine.run_store import RunStore

    RunStore(connection, keys, b"").stop(rollout_queue(queue_name, connection), wait, leave_stop_flag=True)
    click.echo(f"run {keys.run_name}: no live learner; stopped its jobs and removed its keys (its stop flag stays "
               f"a day: a learner of it that was only slow stops at its next call)")


JUDGED_DEAD_AFTER_SECONDS = 3.0
"""A wait this long with no heartbeat (learners beat about once a second while they collect) is a learner that looks
dead; a shorter one says nothing of it."""


def _learner_finished(connection: Any, keys: Any, wait: float, deadline: bytes | str) -> bool:
    """Wait up to ``wait`` seconds for the run's learner to remove the run's keys as it stops: True once it has,
    False once its heartbeat ``deadline`` (as first read) passes without it (a dead learner: the caller cleans up).
    ClickException past ``wait``, saying whether the learner looks dead: a collecting learner moves its deadline
    about once a second, a dead one never, and then the message says when the deadline passes."""
    from rqrl.engine.leases import learner_gone
    from rqrl.engine.run_store import deadline_text

    name, ends = keys.run_name, time.monotonic() + wait
    while True:
        exists, current = connection.mget([keys.config, keys.learner_deadline])
        if exists is None:
            return True
        if current is None or learner_gone(current):
            return False
        if time.monotonic() > ends:
            break
        time.sleep(0.2)
    if current == deadline and wait >= JUDGED_DEAD_AFTER_SECONDS:
        raise click.ClickException(
            f"run {name}: its learner looks dead: its heartbeat did not move in the {wait:g} s waited (a learner "
            f"beats about once a second while it collects); its heartbeat deadline {deadline_text(current)}, "
            f"after which `rqrl stop {name}` removes the run at once")
    beating = "though its heartbeat goes on" if current != deadline else "(too short a wait to tell a dead one)"
    raise click.ClickException(f"run {name}: its learner has not finished within {wait:g} s {beating}; its stop flag "
                               f"stays set, so it stops at its next collect (raise --wait to wait longer)")


def _socket_gone(connection: Any) -> bool:
    """Whether ``connection`` is to a Unix socket that is gone: an embedded Redis that shut down (a learner's own
    ends with it)."""
    path = connection.connection_pool.connection_kwargs.get("path")
    return bool(path) and not os.path.exists(path)


@main.command()
@click.option("--redis-url", envvar="REDIS_URL", required=True, help=REDIS_URL_HELP, callback=_redis_url)
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
    """Run rq-dashboard set up for rqrl: JSON jobs read through rqrl's classes (never pickle), Redis text shown
    as text under a script policy, the Jobs tab on the rqrl queue, and a page that says a job is gone or
    unreadable instead of an error (rqrl keeps finished jobs for 0 s, failed ones for 24 h, and a run's jobs
    until its learner stops). Needs `pip install 'rqrl[dashboard]'`.
    """
    try:
        import rq_dashboard.cli
        import rq_dashboard.web
    except ImportError as error:
        raise click.ClickException("rq-dashboard is not installed: pip install 'rqrl[dashboard]'") from error
    from rqrl.cli.dashboard import secure_rq_dashboard

    if bind not in ("127.0.0.1", "localhost", "::1") and not (username and password):
        logging.getLogger(__name__).warning(
            "rqrl dashboard listens on %s without a login: anyone who reaches it sees the jobs%s; set --username "
            "and RQ_DASHBOARD_PASSWORD", bind, " and can delete them" if allow_delete else "")
    secure_rq_dashboard(rq_dashboard.web)  # rqrl's job class, JSON, escaped pages and a script policy
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
@click.option("--redis-url", envvar="REDIS_URL", required=True, help=REDIS_URL_HELP, callback=_redis_url)
@click.option("--worker", "worker_prefix", is_flag=False, flag_value="", default=None,
              help="Check that a worker of this host (default names: rqrl.HOSTNAME.*; or give a name prefix) sent "
                   "a heartbeat in the last 20 s.")
@click.option("--run", "run_name", default=None, help="Check that run RUN's learner is alive (its heartbeat "
                                                       "deadline, --learner-timeout, has not passed).")
def health(redis_url: str, worker_prefix: str | None, run_name: str | None) -> None:
    """Exit 0 if what is checked is healthy, else print why and exit 1: a container's HEALTHCHECK."""
    import redis

    from rqrl.engine.health import host_worker_prefix, learner_is_healthy, worker_is_healthy
    from rqrl.errors import RqrlError

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
@click.option("--redis-url", envvar="REDIS_URL", required=True, help=REDIS_URL_HELP, callback=_redis_url)
@click.option("--run", "run_name", default=None, help="Show only this run (default: every run on the Redis).")
@click.option("--watch", is_flag=False, flag_value=2.0, default=None, type=click.FloatRange(min=0.5),
              help="Refresh every WATCH seconds (default 2) until Ctrl-C.")
def status(redis_url: str, run_name: str | None, watch: float | None) -> None:
    """Show every run on a Redis: learner heartbeat, steps/s over 10 s and 60 s, policy version and lag, queue
    depth against its bound, jobs queued, started and failed, recent failures, and the workers on the run's
    queue with what each runs."""
    import redis

    from rqrl.cli.status import format_status, read_status
    from rqrl.errors import RqrlError

    connection = redis.Redis.from_url(redis_url)
    terminal = sys.stdout.isatty()
    try:
        while True:
            try:
                runs = read_status(connection, run_name)
            except (redis.RedisError, RqrlError) as error:
                raise click.ClickException(f"cannot read the status: {error}") from error
            if run_name is not None and not runs and watch is None:
                raise click.ClickException(f"no run {run_name!r} in the Redis at {redact_url(redis_url)} (stopped "
                                           f"already, or another Redis or database?); `rqrl status` lists every run")
            screen = format_status(runs)
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


def _weights_to_evaluate(run_dir: str | None, checkpoint: str | None) -> str:
    """What ``rqrl evaluate`` loads: RUN_DIR (its best weights, else its final ones), a file of RUN_DIR named by
    --checkpoint, or --checkpoint's file."""
    if checkpoint is None:
        if run_dir is None:
            raise click.UsageError("give RUN_DIR (a run folder), --checkpoint FILE (a weights file), or both")
        return run_dir
    if run_dir is None:
        if not os.path.isfile(checkpoint):
            raise click.BadParameter(f"no weights file {checkpoint!r}; with RUN_DIR, name one of its files (best, "
                                     f"final or checkpoint)", param_hint="--checkpoint")
        return checkpoint
    name = checkpoint if checkpoint.endswith(".safetensors") else f"{checkpoint}.safetensors"
    for candidate in (os.path.join(run_dir, name), checkpoint):
        if os.path.isfile(candidate):
            return candidate
    held = sorted(entry.removesuffix(".safetensors") for entry in os.listdir(run_dir) if entry.endswith(".safetensors"))
    raise click.BadParameter(f"{run_dir} holds no {name}; its weights files: {', '.join(held) or 'none'}",
                             param_hint="--checkpoint")


@main.command()
@click.argument("run_dir", required=False, type=click.Path(exists=True, file_okay=False))
@click.option("--checkpoint", default=None,
              help="Another weights file: with RUN_DIR, one of its files by name (best, final or checkpoint, "
                   ".safetensors optional); alone, the path of a weights file.")
@click.option("--episodes", default=10, show_default=True, type=click.IntRange(min=1), help="Episodes to run.")
@click.option("--seed", default=0, show_default=True, help="Seed of the first episode's reset.")
@click.option("--sample", is_flag=True, help="Sample actions instead of taking the most likely one.")
@click.option("--video", is_flag=True, help="Film the episodes too: an mp4 file per episode in --video-dir "
                                            "(gymnasium's RecordVideo; needs `pip install 'rqrl[video]'`).")
@click.option("--video-dir", type=click.Path(file_okay=False), default=None,
              help="Folder of the --video files (default: videos/ in the folder of the weights).")
@click.option("--repeat-action-probability", type=click.FloatRange(0.0, 1.0), default=None,
              help="Atari only: sticky actions' probability (default: the run's, from the config.json beside the "
                   "weights; else ALE v5's 0.25).")
def evaluate(run_dir: str | None, checkpoint: str | None, episodes: int, seed: int, sample: bool, video: bool,
             video_dir: str | None, repeat_action_probability: float | None) -> None:
    """Run episodes with a trained policy (RUN_DIR's best weights, else its final ones) and print which weights
    they were and the mean and std of the returns. Atari runs play with the run's sticky actions (its config.json)
    unless --repeat-action-probability says otherwise."""
    import numpy as np

    from rqrl.algorithms.checkpoint import weights_file
    from rqrl.algorithms.common import recorded_settings
    from rqrl.algorithms.evaluation import check_video_support, load_trained_model
    from rqrl.algorithms.evaluation import evaluate as run_episodes
    from rqrl.errors import RqrlError

    source = _weights_to_evaluate(run_dir, checkpoint)
    try:
        if video:
            check_video_support()  # before loading anything: one line naming the extra
    except RqrlError as error:
        raise click.ClickException(str(error)) from None
    try:
        path = weights_file(source)
        model, metadata = load_trained_model(path)
    except (RqrlError, KeyError) as error:
        raise click.ClickException(f"cannot load a policy from {source}: {error}") from error
    click.echo(f"weights: {path} ({describe_weights(metadata)})")
    folder = (video_dir or path.parent / "videos") if video else None
    try:
        if repeat_action_probability is None and (path.parent / "config.json").is_file():
            repeat_action_probability = recorded_settings(path).get("repeat_action_probability")
        returns = run_episodes(model, metadata["env_id"], episodes, seed, greedy=not sample, video_folder=folder,
                               repeat_action_probability=repeat_action_probability)
    except RqrlError as error:
        raise click.ClickException(str(error)) from error
    click.echo(f"{metadata['env_id']}: {episodes} episodes, return {np.mean(returns):.1f} +- {np.std(returns):.1f} "
               f"(min {np.min(returns):.1f}, max {np.max(returns):.1f})")
    if folder is not None:
        click.echo(f"videos: {folder} ({episodes} mp4 file(s))")


def describe_weights(metadata: dict[str, Any]) -> str:
    """When the weights were written: env steps, updates (or train steps) and the mean training return then."""
    facts = [f"{metadata['env_steps']:,} env steps" if "env_steps" in metadata else "env steps not recorded"]
    for name in ("updates", "train_steps"):
        if isinstance(metadata.get(name), int):
            facts.append(f"{name.replace('_', ' ')} {metadata[name]:,}")
    if isinstance(metadata.get("mean_return"), int | float):
        facts.append(f"mean training return {metadata['mean_return']:.1f}")
    return ", ".join(facts)


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
@click.option("--redis-url", envvar="REDIS_URL", default=None, callback=_redis_url,
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

    from rqrl.algorithms.common import make_env
    from rqrl.engine.process import terminate_like_ctrl_c
    from rqrl.engine.progress import Progress
    from rqrl.errors import RqrlError
    from rqrl.maze.actors import RedisDistributedActors

    logging.basicConfig(level=logging.WARNING)
    logging.captureWarnings(True)
    env_factory = functools.partial(gymnasium.make, env_id)
    try:
        probe = make_env(env_id)  # an unknown id or a missing package in one line, with the fix
    except RqrlError as error:
        raise click.ClickException(str(error)) from error
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
    from rqrl.engine.process import Terminated

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
