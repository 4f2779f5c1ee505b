"""The small protocol a policy follows to act in rollouts, and the adapter for plain modules.

A policy is either an object with ``act(obs, generator) -> PolicyStep`` (any action space), or a
``torch.nn.Module`` whose ``forward(obs)`` returns logits ``[B, n]`` for a Discrete action space;
rqrl samples from those logits with the actor's seeded generator (in rollouts,
``LogitsActFunction.act_numpy``: one forward, then softmax, sampling and log-probs in numpy from a
seeded ``numpy.random.Generator``, as a few torch kernels per step cost more than a small MLP).
The actors broadcast its weights, so what they take (``Policy``) also has ``state_dict()`` and
``load_state_dict()``, as every ``torch.nn.Module`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeAlias, runtime_checkable

import gymnasium
import numpy as np
import torch

from rqrl.engine.observations import TensorObs
from rqrl.errors import ConfigError, PolicyError


@dataclass(frozen=True)
class PolicyStep:
    """One batched action: ``actions [B, ...]``, ``log_probs [B]`` and optionally ``logits [B, n]``."""

    actions: torch.Tensor
    log_probs: torch.Tensor
    logits: torch.Tensor | None = None


@runtime_checkable
class ActorPolicy(Protocol):
    """A policy that samples actions itself (e.g. for Box action spaces)."""

    def act(self, obs: TensorObs, generator: torch.Generator) -> PolicyStep:
        """Sample actions for a batch of observations using ``generator`` for all randomness."""
        ...


class StatefulActorPolicy(ActorPolicy, Protocol):
    """An ActorPolicy whose weights can be broadcast: ``state_dict()`` and ``load_state_dict()`` as
    ``torch.nn.Module`` has them (a module with an ``act`` method is the usual one)."""

    def state_dict(self) -> Mapping[str, Any]:
        """The weights, by name."""
        ...

    def load_state_dict(self, state_dict: Mapping[str, Any], /) -> object:
        """Replace the weights with ``state_dict``'s."""
        ...


ActingPolicy: TypeAlias = torch.nn.Module | ActorPolicy
"""What ``make_act_function`` turns into an ActFunction: logits from ``forward(obs)``, or ``act``."""

Policy: TypeAlias = torch.nn.Module | StatefulActorPolicy
"""What the actors take: an ActingPolicy whose weights can be broadcast."""

ActFunction = Callable[[TensorObs, torch.Generator], PolicyStep]


def categorical_step(logits: torch.Tensor, generator: torch.Generator) -> PolicyStep:
    """Sample from a batch of categorical logits with an explicit generator (reproducible)."""
    log_probs_all = torch.log_softmax(logits, dim=-1)
    actions = torch.multinomial(log_probs_all.exp(), 1, generator=generator).squeeze(-1)
    log_probs = log_probs_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    return PolicyStep(actions=actions, log_probs=log_probs, logits=logits)


class NumpyStep(NamedTuple):
    """One batched action in numpy: ``actions [B]`` (int64), ``log_probs [B]`` and ``logits [B, n]`` (float32)."""

    actions: np.ndarray
    log_probs: np.ndarray
    logits: np.ndarray


def sample_logits(logits: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Actions ``[B]`` sampled from categorical ``logits [B, n]`` by inverse CDF (one ``rng.random`` draw per row)
    and their log-probs; an action of logit -inf is never drawn.

    >>> actions, log_probs = sample_logits(np.array([[0.0, -np.inf], [-np.inf, 5.0]]), np.random.default_rng(0))
    >>> actions.tolist(), log_probs.tolist()
    ([0, 1], [0.0, 0.0])
    """
    shifted = logits - logits.max(axis=-1, keepdims=True)
    cdf = np.cumsum(np.exp(shifted), axis=-1)
    total = cdf[:, -1]  # >= 1: the largest weight is exp(0)
    # rng.random() <= 1 - 2**-53, so u < total strictly (in float64, where the float32 cdf compares exactly):
    # the first index whose cdf exceeds u exists, and its weight is > 0
    u = rng.random(len(total)) * total
    actions = (cdf <= u[:, None]).sum(axis=-1)
    log_probs = shifted[np.arange(len(actions)), actions] - np.log(total)
    return actions, log_probs


class LogitsActFunction:
    """The ActFunction of a plain module whose ``forward(obs)`` gives categorical logits (Discrete spaces).

    Called as ``act(obs, generator)`` it samples with torch; rollouts call ``act_numpy(obs, rng)``,
    which samples the same distribution in numpy from ``rng`` (a different stream, as reproducible).
    """

    def __init__(self, policy: torch.nn.Module, action_space: gymnasium.spaces.Discrete):
        self.policy = policy
        self.action_space = action_space
        self.n_actions = int(action_space.n)

    def logits(self, obs: TensorObs) -> torch.Tensor:
        """The policy's logits for ``obs``, checked to be ``[B, n]``."""
        logits: torch.Tensor = self.policy(obs)
        if logits.shape[-1] != self.n_actions:
            raise PolicyError(
                f"policy returned logits of shape {tuple(logits.shape)}, expected [B, {self.n_actions}] "
                f"for action space {self.action_space}"
            )
        return logits

    def __call__(self, obs: TensorObs, generator: torch.Generator) -> PolicyStep:
        return categorical_step(self.logits(obs), generator)

    def act_numpy(self, obs: TensorObs, rng: np.random.Generator) -> NumpyStep:
        """One forward, then sampling and log-probs in numpy from ``rng``."""
        logits = self.logits(obs).detach().cpu().numpy()
        actions, log_probs = sample_logits(logits, rng)
        return NumpyStep(actions, log_probs, logits)


def make_act_function(policy: ActingPolicy, action_space: gymnasium.Space[Any]) -> ActFunction:
    """Return the function rollouts call to act (a ``LogitsActFunction`` for a plain module); raise
    PolicyError if ``policy`` fits no protocol."""
    if isinstance(policy, ActorPolicy):
        return policy.act
    if isinstance(policy, torch.nn.Module):
        if not isinstance(action_space, gymnasium.spaces.Discrete):
            raise PolicyError(
                f"a plain torch.nn.Module policy is read as categorical logits, which needs a Discrete "
                f"action space, got {action_space}; give the policy an act(obs, generator) method "
                f"returning rqrl.PolicyStep instead"
            )
        return LogitsActFunction(policy, action_space)
    raise PolicyError(
        f"expected a torch.nn.Module or an object with act(obs, generator), got {type(policy).__name__}"
    )


NON_FINITE_LOG_PROB_FIX = ("expected finite numbers: check the policy (NaN weights after an update, NaN observations, "
                           "sampling an action of probability 0)")
"""What an error about log-probs that are not finite numbers tells the user to look at (every family refuses them)."""


class ActionRange(NamedTuple):
    """The lowest and highest action of each element of a Discrete or MultiDiscrete space, worked out once (an
    actor group checks every step's actions against it)."""

    space: Any
    low: np.ndarray
    high: np.ndarray


def action_range(space: Any) -> ActionRange | None:
    """The integer range of ``space``; None for spaces an env takes any value of (a Box env clips)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return ActionRange(space, np.asarray(space.start), np.asarray(space.start + space.n - 1))
    if isinstance(space, spaces.MultiDiscrete):
        return ActionRange(space, np.asarray(space.start), np.asarray(space.start + space.nvec - 1))
    return None


def actions_out_of_range(space: Any, actions: np.ndarray, bounds: ActionRange | None = None) -> str | None:
    """What is wrong with ``actions`` (one per env, ``[n, ...]``) for a Discrete or MultiDiscrete ``space``, whose
    envs would fail on them with a bare assertion; None when they fit, or for other spaces (a Box env clips, and
    its shape is checked elsewhere). ``bounds``: ``action_range(space)``, if the caller keeps it. One comparison
    over the batch: cheap enough for every step."""
    bounds = action_range(space) if bounds is None else bounds
    if bounds is None or actions.size == 0 or actions.shape[1:] != bounds.low.shape:  # a misfit shape: said elsewhere
        return None
    if not np.issubdtype(actions.dtype, np.integer):
        return f"actions of dtype {actions.dtype}; {space} takes integers"
    outside = (actions < bounds.low) | (actions > bounds.high)
    if not outside.any():
        return None
    return (f"action {actions[outside].flat[0]}, outside {space} (each from {bounds.low.tolist()} to "
            f"{bounds.high.tolist()})")


def non_finite_rows(values: np.ndarray) -> np.ndarray:
    """Per row of ``values`` ``[T, ...]`` (a step's log-probs), whether it holds a number that is not finite: what a
    learner must not train on."""
    return ~np.isfinite(values).reshape(len(values), -1).all(axis=1)


def state_dict_of(policy: Policy) -> dict[str, torch.Tensor]:
    """The policy's state dict; raises PolicyError if it has none (an untyped caller's bare ActorPolicy)."""
    if not hasattr(policy, "state_dict") or not hasattr(policy, "load_state_dict"):
        raise PolicyError(
            f"policy {type(policy).__name__} needs state_dict() and load_state_dict() so weights can be "
            f"broadcast; subclass torch.nn.Module"
        )
    return dict(policy.state_dict())


def as_state_dict(value: object) -> dict[str, torch.Tensor]:
    """``value`` as a plain dict of tensors, or ConfigError naming what it is instead."""
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"expected a state dict (a mapping of parameter names to tensors, e.g. policy.state_dict()), "
            f"got {type(value).__name__} {value!r:.80}"
        )
    not_tensors = sorted(f"{key!r}: {type(item).__name__}" for key, item in value.items()
                         if not isinstance(item, torch.Tensor))
    if not_tensors:
        raise ConfigError(f"expected a state dict of tensors, got non-tensor values {not_tensors[:5]}; broadcast "
                          f"policy.state_dict()")
    return dict(value)


def flatten_state_dict(value: object) -> object:
    """Nested mappings of tensors (Maze's ``TorchActorCritic.state_dict()``: one state dict per network) as one
    flat dict with ``.``-joined keys; anything else unchanged."""
    if not isinstance(value, Mapping) or not any(isinstance(item, Mapping) for item in value.values()):
        return value
    flat: dict[str, object] = {}
    for key, item in value.items():
        nested = flatten_state_dict(item)
        if isinstance(nested, Mapping):
            flat.update({f"{key}.{inner}": tensor for inner, tensor in nested.items()})
        else:
            flat[str(key)] = nested
    return flat


def select_policy_state(expected: Mapping[str, torch.Tensor], value: object) -> dict[str, torch.Tensor]:
    """The policy's part of a broadcast state dict that may carry other modules' keys (a Maze learner broadcasts
    its actor-critic's: policy and critic together).

    The filter: nested mappings are flattened with ``.``; if every key of the policy is there, those keys
    are taken; else, if exactly one prefix ``name.`` holds every key of the policy below it (a module with a
    ``policy`` attribute beside a ``critic``), or exactly one holds the policy's keys and shapes and nothing
    else, those are taken with the prefix stripped (several: PolicyError). Every other key is
    dropped, never shipped to the workers. If neither holds, the state dict is returned whole, for
    check_state_dict to name what is missing.
    """
    given = as_state_dict(flatten_state_dict(value))
    wanted = set(expected)
    if not wanted or wanted == set(given):
        return given
    if wanted <= set(given):
        return {key: given[key] for key in expected}
    prefixes = sorted({key[:index + 1] for key in given for index, char in enumerate(key) if char == "."})
    matching = [prefix for prefix in prefixes if all(prefix + key in given for key in wanted)]
    if len(matching) > 1:  # keep those holding exactly the policy's keys and shapes (a critic may share a name)
        matching = [prefix for prefix in matching
                    if {key[len(prefix):] for key in given if key.startswith(prefix)} == wanted
                    and all(given[prefix + key].shape == expected[key].shape for key in wanted)]
    if len(matching) > 1:
        raise PolicyError(f"the state dict holds the policy's keys below several prefixes {matching}; broadcast "
                          f"the state dict of the policy module alone (e.g. model.policy.state_dict())")
    if matching:
        return {key: given[matching[0] + key] for key in expected}
    return given


def check_state_dict(expected: dict[str, torch.Tensor], given: dict[str, torch.Tensor]) -> None:
    """Refuse a state dict whose keys or shapes differ from the policy's, naming the mismatches."""
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    wrong_shape = sorted(
        f"{key}: expected {tuple(expected[key].shape)}, got {tuple(given[key].shape)}"
        for key in set(expected) & set(given)
        if isinstance(given[key], torch.Tensor) and tuple(expected[key].shape) != tuple(given[key].shape)
    )
    if missing or unexpected or wrong_shape:
        raise PolicyError(
            "state dict does not match the policy: "
            f"missing keys {missing}, unexpected keys {unexpected}, wrong shapes {wrong_shape}; "
            "broadcast the state_dict() of the same architecture the actors were built with"
        )
