"""``rqrl train``: IMPALA (``rqrl train`` or ``rqrl train impala``), PPO (``rqrl train ppo``) and DQN
(``rqrl train dqn``), each with its own flags and true defaults, built from the algorithm's config dataclass.
``--resume RUN_DIR`` takes the run's recorded settings (config.json); flags given with it override them and
say so, and the settings that shape the networks cannot change. ``--config FILE`` takes the settings of a JSON file
with config.json's keys (rqrl.cli.config_file), for a new run; flags given with it override them."""

from __future__ import annotations

import dataclasses
import logging
import os
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from rqrl.algorithms.common import TrainResult

_Command = TypeVar("_Command", bound=Callable[..., Any])

INTERRUPTED_EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}
"""Exit codes of a run cut short by a signal (128 + the signal's number, the shells' convention); a run ended
by `rqrl stop` exits with 0, like one that ran to its end."""
SUMMARY = {
    "impala": "IMPALA (V-trace) on Maze-style distributed actors: the default of `rqrl train`.",
    "ppo": "PPO on garage's sampler (MultiprocessingSampler over Redis).",
    "dqn": "Rainbow-style DQN on the SEED trainer (central inference, transitions over Redis).",
}


def config_options(config_class: type[DataclassInstance]) -> Callable[[_Command], _Command]:
    """Decorator adding one click option per dataclass field, with the field's help and default."""
    hints = typing.get_type_hints(config_class)

    from rqrl.algorithms.common import Tracking

    shared = {spec.name for spec in dataclasses.fields(Tracking)}  # a base class's fields come first: list them last
    ordered = sorted(dataclasses.fields(config_class), key=lambda spec: spec.name in shared)

    def decorate(command: _Command) -> _Command:
        for spec in reversed(ordered):
            hint = hints[spec.name]
            optional = type(None) in typing.get_args(hint)
            base = next((arg for arg in typing.get_args(hint) if arg is not type(None)), hint)
            flag = "--" + spec.name.replace("_", "-")
            help_text = spec.metadata.get("help", "")
            if base is bool:
                option = click.option(f"{flag}/--no-{flag[2:]}", spec.name, default=spec.default, show_default=True,
                                      help=help_text)
            else:
                option = click.option(flag, spec.name, type=base, default=spec.default, help=help_text,
                                      show_default=not optional or spec.default is not None)
            command = option(command)
        return command

    return decorate


def common_options(command: _Command) -> _Command:
    """The flags every algorithm's command has besides its config's."""
    command = click.option("--env", "env_alias", default=None, help="Alias of --env-id.")(command)
    command = click.option("--config", "config_file", default=None, type=click.Path(exists=True, dir_okay=False),
                           help="JSON file of settings with the keys of a run's config.json (a recorded "
                                "config.json repeats that run in a new folder); flags given override it.")(command)
    return click.option("--log-level", default="WARNING", show_default=True,
                        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), help="Logging level.")(command)


def _refuse_algo(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        raise click.UsageError(f"--algo is gone: the algorithm is a subcommand, `rqrl train {value} ...` (`rqrl train "
                               f"{value} --help` lists its flags)", ctx)


def given_options(ctx: click.Context, options: dict[str, Any]) -> set[str]:
    """The options the user typed (or set by environment), not left at their defaults."""
    return {name for name in options if ctx.get_parameter_source(name) not in (
        click.core.ParameterSource.DEFAULT, None)}


def config_class(algo: str) -> type[Any]:
    from rqrl.algorithms import dqn, impala, ppo

    return {"impala": impala.ImpalaConfig, "ppo": ppo.PpoConfig, "dqn": dqn.DqnConfig}[algo]


def resume_options(chosen: str | None, options: dict[str, Any], given: set[str]) -> tuple[str, dict[str, Any]]:
    """The algorithm and settings of a resumed run: its config.json, overridden by the flags given (each said on
    stderr). UsageError for another algorithm, a flag the run's algorithm has not, or a network-shaping change."""
    from rqrl.algorithms.common import FROZEN_ON_RESUME, NOT_RESUMED, recorded_settings
    from rqrl.errors import ConfigError

    resume = options["resume"]
    try:
        recorded = recorded_settings(resume)
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    algo = recorded["algo"]
    if chosen is not None and chosen != algo:
        raise click.UsageError(f"{resume} is a {algo} run: resume it with `rqrl train {algo} --resume {resume}`")
    fields = {spec.name for spec in dataclasses.fields(config_class(algo))}
    foreign = sorted(name for name in given if name not in fields)
    if foreign:
        flags = ", ".join("--" + name.replace("_", "-") for name in foreign)
        raise click.UsageError(f"{flags}: no flag of {algo}, the algorithm of {resume}")
    settings = {name: value for name, value in recorded.items() if name in fields and name not in NOT_RESUMED}
    for name in sorted(given):
        flag, before = "--" + name.replace("_", "-"), recorded.get(name)
        if name in FROZEN_ON_RESUME[algo] and name in recorded and options[name] != before:
            raise click.UsageError(f"{flag} cannot change when a run resumes (it shapes the networks in the "
                                   f"checkpoint): {resume} was trained with {before!r}; leave {flag} out")
        if name in settings and options[name] != before:
            click.echo(f"resuming with {flag} {options[name]!r} (recorded: {before!r})", err=True)
    settings.update({name: options[name] for name in given | {"resume"} if name in fields})
    return algo, settings


def file_options(chosen: str | None, path: str, options: dict[str, Any], given: set[str]) -> tuple[str, dict[str, Any]]:
    """The algorithm and settings of a run from the config file ``path`` (its ``algo``, else ``chosen``, else
    IMPALA), overridden by the flags given. UsageError for another algorithm's file or flags."""
    from rqrl.cli.config_file import file_algorithm, file_settings, read_settings

    if options.get("resume"):
        raise click.UsageError("--config with --resume: a resumed run takes its own config.json; give flags to "
                               "override its settings")
    data = read_settings(path)
    algo = file_algorithm(path, data, chosen)
    fields = {spec.name for spec in dataclasses.fields(config_class(algo))}
    foreign = sorted(name for name in given if name not in fields)
    if foreign:
        flags = ", ".join("--" + name.replace("_", "-") for name in foreign)
        raise click.UsageError(f"{flags}: no flag of {algo}, the algorithm of --config {path}")
    settings = file_settings(path, data, algo, config_class(algo))
    settings.update({name: options[name] for name in given if name in fields})
    return algo, settings


learner_called = False
"""Whether ``run_training`` called a learner in this process: a Ctrl-C before it wrote no run folder."""


def run_training(chosen: str | None, options: dict[str, Any], env_alias: str | None, log_level: str,
                 config_file: str | None = None) -> None:
    """Train ``chosen`` (None: IMPALA, or a resumed run's or config file's algorithm) with the command's options."""
    from rqrl.algorithms import dqn, impala, ppo
    from rqrl.cli.commands import redis_server_from_env, secret_from_env
    from rqrl.engine.process import terminate_like_ctrl_c
    from rqrl.errors import RqrlError

    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.captureWarnings(True)  # warnings as log records: they never break into the progress bar
    given = given_options(click.get_current_context(), options)
    if env_alias:
        options["env_id"], given = env_alias, given | {"env_id"}
    if config_file is not None:
        algo, settings = file_options(chosen, config_file, options, given)
    elif options.get("resume") is not None:
        if not options["resume"]:
            raise click.UsageError("--resume needs a run folder or checkpoint file, got ''")
        algo, settings = resume_options(chosen, options, given)
    else:
        algo, settings = chosen or "impala", options
    if settings.get("redis_url") is None:
        settings["redis_url"] = os.environ.get("REDIS_URL")
    check_workers_can_join_run(settings, recorded="workers" not in given and config_file is None)
    trainers: dict[str, Callable[..., TrainResult]] = {"impala": impala.train, "ppo": ppo.train, "dqn": dqn.train}
    train = trainers[algo]
    try:
        config = config_class(algo)(**settings)  # its checks refuse bad settings before anything starts
    except RqrlError as error:
        raise click.ClickException(str(error)) from error
    terminate_like_ctrl_c()  # `docker stop`, `docker compose stop` and Kubernetes send SIGTERM
    global learner_called
    learner_called = True  # from here a Ctrl-C is the learner's to tell of (rqrl.cli.commands: _before_the_run)
    try:
        result = train(config, secret=secret_from_env(), redis_server=redis_server_from_env())
    except RqrlError as error:
        raise click.ClickException(str(error)) from error
    report(result)


def check_workers_can_join_run(settings: dict[str, Any], recorded: bool = False) -> None:
    """ClickException at once for --workers 0 without a Redis URL (flag or REDIS_URL): the run's embedded Redis
    would be one no external worker can join, and the run would fail only after waiting for workers. ``recorded``:
    the 0 is a resumed run's (its config.json keeps --workers, not the Redis URL), which the user did not type."""
    from rqrl.engine.options import check_workers_can_join
    from rqrl.errors import ConfigError

    try:
        check_workers_can_join(settings.get("workers"), embedded=not settings.get("redis_url"))
    except ConfigError as error:
        if recorded and settings.get("resume"):
            raise click.ClickException(
                f"the run {settings['resume']} was recorded with --workers 0 (external workers only), and no Redis "
                f"URL is given (its config.json does not keep one): give the Redis its workers use (--redis-url or "
                f"REDIS_URL, with RQRL_SECRET), or --workers N for N local workers") from error
        raise click.ClickException(str(error)) from error


def report(result: TrainResult) -> None:
    """The run's last lines: how it ended, its figures, and its folder; signals' exit codes."""
    state = ("solved" if result.solved else f"interrupted ({result.stopped_by})" if result.interrupted
             else f"{result.budget} budget reached")
    mean = f"{result.mean_return:.1f}" if result.mean_return is not None else "n/a"
    click.echo(f"{state}: {result.env_steps:,} env steps, {result.updates:,} updates in {result.seconds:.1f} s "
               f"({result.env_steps / max(result.seconds, 1e-9):,.0f} steps/s); mean return of the last 100 "
               f"episodes {mean} over {result.episodes:,} episodes")
    if result.bottleneck_detail:
        click.echo(result.bottleneck_detail)
    click.echo(f"run folder: {result.run_dir}" if result.run_dir.is_dir()
               else "no run folder: the run stopped before it started")
    if result.stopped_by in INTERRUPTED_EXIT_CODES:
        raise SystemExit(INTERRUPTED_EXIT_CODES[result.stopped_by])


def algorithm_command(algo: str) -> click.Command:
    """``rqrl train ALGO``: the algorithm's own flags and defaults."""

    @click.command(name=algo, help=f"{SUMMARY[algo]}\n\nWrites RUN_DIR/RUN_NAME (weights, checkpoint, metrics.csv, "
                                   f"TensorBoard events, learning_curve.png). With --resume, the run's recorded "
                                   f"settings are taken, with --config FILE a file's; flags given override them.")
    @config_options(config_class(algo))
    @common_options
    def command(env_alias: str | None, log_level: str, config_file: str | None, **options: Any) -> None:
        run_training(algo, options, env_alias, log_level, config_file)

    return command


def option_value(args: list[str], flag: str) -> str | None:
    """The value ``args`` give ``flag`` (``--flag VALUE`` or ``--flag=VALUE``; the last one wins, as click's), else
    None."""
    value = None
    for index, arg in enumerate(args):
        if arg == "--":
            break
        if arg == flag and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


def positional_args(args: list[str], valued: set[str]) -> list[str]:
    """The arguments of ``args`` that are no option nor an option's value (``valued``: the options that take one):
    where a subcommand's name would be, so `--run-name ppo` names no algorithm."""
    positional, value_next = [], False
    for arg in args:
        if value_next:
            value_next = False
        elif arg == "--":
            break
        elif arg.startswith("-"):
            value_next = arg in valued  # `--flag=VALUE` carries its value
        else:
            positional.append(arg)
    return positional


def recorded_algorithm(args: list[str], valued: set[str]) -> str | None:
    """The algorithm a bare ``rqrl train`` runs: the one recorded in the config.json of the run ``--resume`` names,
    else the ``algo`` of the ``--config`` file; None where ``args`` name an algorithm themselves, or where no
    algorithm is recorded (the commands then refuse or default as before, each in one line)."""
    from rqrl.algorithms.common import recorded_settings
    from rqrl.cli.config_file import read_settings
    from rqrl.errors import ConfigError

    if any(arg in SUMMARY for arg in positional_args(args, valued)):  # `--resume runs/x dqn`: dqn's own command
        return None
    resume, config_file = option_value(args, "--resume"), option_value(args, "--config")
    try:
        algo = (recorded_settings(resume)["algo"] if resume else
                read_settings(config_file).get("algo") if config_file else None)
    except (ConfigError, click.UsageError):
        return None
    return algo if algo in SUMMARY else None


class TrainGroup(click.Group):
    """``rqrl train``'s group. ``rqrl train --resume RUN_DIR [flags]`` runs the command of the run's recorded
    algorithm, ``rqrl train ALGO --resume RUN_DIR [flags]`` (and ``--config FILE`` that of the file's ``algo``): the
    group's options are IMPALA's, so click would refuse PPO's and DQN's flags (``--num-samples``, ``--seconds``)
    before the run's algorithm is known."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        valued = {name for param in self.params if isinstance(param, click.Option) and not param.is_flag
                  and not param.count for name in (*param.opts, *param.secondary_opts)}
        algo = recorded_algorithm(args, valued)
        return super().parse_args(ctx, args if algo is None else [algo, *args])


def train_group() -> click.Group:
    """``rqrl train``: IMPALA with its flags, or an algorithm's subcommand."""
    from rqrl.algorithms.impala import ImpalaConfig

    @click.group(name="train", cls=TrainGroup, invoke_without_command=True, help=(
        "Train until the env is solved or the budget ends: IMPALA by default (the flags below), `rqrl train ppo` "
        "or `rqrl train dqn` for the others (each with its own --help). `rqrl train --resume RUN_DIR` continues "
        "any run with its recorded algorithm and settings, and takes that algorithm's flags to override them; "
        "`rqrl train --config FILE` starts a new run with a file's (a run's config.json repeats that run)."))
    @config_options(ImpalaConfig)
    @common_options
    @click.option("--algo", hidden=True, expose_value=False, callback=_refuse_algo)
    @click.pass_context
    def group(ctx: click.Context, /, env_alias: str | None, log_level: str, config_file: str | None,
              **options: Any) -> None:
        if ctx.invoked_subcommand is None:
            run_training(None, options, env_alias, log_level, config_file)
            return
        typed = (given_options(ctx, options) | ({"env"} if env_alias else set())
                 | ({"config"} if config_file else set()))
        if typed:
            flags = ", ".join("--" + name.replace("_", "-") for name in sorted(typed))
            raise click.UsageError(f"{flags} before `{ctx.invoked_subcommand}`: an algorithm's flags go after its "
                                   f"name, `rqrl train {ctx.invoked_subcommand} {flags.split(', ')[0]} ...`")

    for algo in SUMMARY:
        group.add_command(algorithm_command(algo))
    return group
