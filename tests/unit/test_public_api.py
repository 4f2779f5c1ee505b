"""The public surface is what rqrl.__all__ declares, and every error is an RqrlError."""

from __future__ import annotations

import inspect
import types

import rqrl
import rqrl.errors
from rqrl.errors import RqrlError


def test_every_name_in_all_exists():
    missing = [name for name in rqrl.__all__ if not hasattr(rqrl, name)]
    assert missing == []
    assert len(rqrl.__all__) == len(set(rqrl.__all__))


def test_every_public_class_and_function_is_in_all():
    for name in dir(rqrl):  # load every lazy export (rqrl.__getattr__), so vars() holds them all
        getattr(rqrl, name)
    exported = {
        name for name, value in vars(rqrl).items()
        if not name.startswith("_") and (inspect.isclass(value) or inspect.isfunction(value))
    }
    assert exported, "rqrl exports no classes or functions at all"
    assert sorted(exported - set(rqrl.__all__)) == []


TYPE_ALIASES = {"Policy"}  # unions of classes, for annotations (isinstance works on them too)


def test_all_names_are_classes_functions_type_aliases_or_the_version():
    for name in rqrl.__all__:
        value = getattr(rqrl, name)
        if name in TYPE_ALIASES:
            assert isinstance(value, types.UnionType) and all(inspect.isclass(arg) for arg in value.__args__), name
        else:
            assert inspect.isclass(value) or inspect.isfunction(value) or name == "__version__", name
    assert isinstance(rqrl.__version__, str) and rqrl.__version__


def error_classes() -> list[type]:
    return [value for value in vars(rqrl.errors).values()
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == "rqrl.errors"]


def test_every_error_subclasses_rqrl_error():
    classes = error_classes()
    assert len(classes) >= 9
    for cls in classes:
        assert issubclass(cls, RqrlError), cls.__name__


def test_every_error_is_exported():
    assert sorted(cls.__name__ for cls in error_classes() if cls.__name__ not in rqrl.__all__) == []
    for cls in error_classes():
        assert getattr(rqrl, cls.__name__) is cls


def test_error_tree_as_documented():
    assert issubclass(rqrl.ConfigError, ValueError)
    assert issubclass(rqrl.CollectTimeoutError, TimeoutError)
    assert issubclass(rqrl.NoWorkersError, rqrl.CollectTimeoutError)
    assert issubclass(rqrl.ServerError, RuntimeError)
    assert issubclass(rqrl.RedisServerNotFoundError, rqrl.ServerError)


def test_every_error_class_is_drawn_in_the_documented_tree():
    tree = rqrl.errors.__doc__
    assert sorted(cls.__name__ for cls in error_classes() if cls.__name__ not in tree) == []


def test_vector_env_and_policy_types_are_exported():
    from rqrl.engine.policy import Policy, StatefulActorPolicy
    from rqrl.maze.vector_env import EnvProcessDiedError, SubprocVectorEnv, VectorEnvError

    assert rqrl.SubprocVectorEnv is SubprocVectorEnv
    assert rqrl.Policy is Policy and rqrl.StatefulActorPolicy is StatefulActorPolicy
    assert rqrl.VectorEnvError is VectorEnvError and rqrl.EnvProcessDiedError is EnvProcessDiedError
    assert issubclass(rqrl.EnvProcessDiedError, rqrl.VectorEnvError)
    assert issubclass(rqrl.VectorEnvError, rqrl.EnvError)
    assert {"SubprocVectorEnv", "VectorEnvError", "EnvProcessDiedError", "Policy", "StatefulActorPolicy"} <= set(
        rqrl.__all__)


def test_serial_actors_are_exported():
    assert "SerialDistributedActors" in rqrl.__all__
    assert issubclass(rqrl.SerialDistributedActors, rqrl.DistributedActors)


def test_actor_failed_error_carries_the_remote_traceback():
    error = rqrl.ActorFailedError("env raised", job_id="rqrl_r_g0_r3", actor_ids=[0, 1],
                                  remote_traceback="Traceback ...\nRuntimeError: boom")
    assert isinstance(error, RqrlError)
    assert error.job_id == "rqrl_r_g0_r3" and error.actor_ids == [0, 1]
    assert "RuntimeError: boom" in str(error) and "job rqrl_r_g0_r3" in str(error)


def test_garage_sampler_foundations_are_exported():
    from rqrl.garage.episodes import EnvSpec, EpisodeBatch, StepType
    from rqrl.garage.worker import EnvUpdate, ExistingEnvUpdate, NewEnvUpdate, SetTaskUpdate, WorkerFactory

    exported = {"StepType": StepType, "EpisodeBatch": EpisodeBatch, "EnvSpec": EnvSpec, "WorkerFactory": WorkerFactory,
                "EnvUpdate": EnvUpdate, "NewEnvUpdate": NewEnvUpdate, "SetTaskUpdate": SetTaskUpdate,
                "ExistingEnvUpdate": ExistingEnvUpdate}
    for name, value in exported.items():
        assert name in rqrl.__all__ and getattr(rqrl, name) is value, name
    assert all(issubclass(getattr(rqrl, name), rqrl.EnvUpdate)
               for name in ("NewEnvUpdate", "SetTaskUpdate", "ExistingEnvUpdate"))
