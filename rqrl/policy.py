"""The small protocol a policy follows to act in rollouts, and the adapter for plain modules.

A policy is either an object with ``act(obs, generator) -> PolicyStep`` (any action space), or a
``torch.nn.Module`` whose ``forward(obs)`` returns logits ``[B, n]`` for a Discrete action space;
rqrl samples from those logits with the actor's seeded generator. The actors broadcast its
weights, so what they take (``Policy``) also has ``state_dict()`` and ``load_state_dict()``, as
every ``torch.nn.Module`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, runtime_checkable

import gymnasium
import torch

from rqrl.errors import ConfigError, PolicyError
from rqrl.observations import TensorObs


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


def make_act_function(policy: ActingPolicy, action_space: gymnasium.Space[Any]) -> ActFunction:
    """Return the function rollouts call to act; raise PolicyError if ``policy`` fits no protocol."""
    if isinstance(policy, ActorPolicy):
        return policy.act
    if isinstance(policy, torch.nn.Module):
        if not isinstance(action_space, gymnasium.spaces.Discrete):
            raise PolicyError(
                f"a plain torch.nn.Module policy is read as categorical logits, which needs a Discrete "
                f"action space, got {action_space}; give the policy an act(obs, generator) method "
                f"returning rqrl.PolicyStep instead"
            )

        def act(obs: TensorObs, generator: torch.Generator) -> PolicyStep:
            logits = policy(obs)
            if logits.shape[-1] != action_space.n:
                raise PolicyError(
                    f"policy returned logits of shape {tuple(logits.shape)}, expected [B, {action_space.n}] "
                    f"for action space {action_space}"
                )
            return categorical_step(logits, generator)

        return act
    raise PolicyError(
        f"expected a torch.nn.Module or an object with act(obs, generator), got {type(policy).__name__}"
    )


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
