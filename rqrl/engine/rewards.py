"""Rewards must be finite numbers: one NaN or inf trained on turns every weight NaN, so each family refuses the
rollout, episode or transition that holds one, naming the env and the step."""

from __future__ import annotations

import math
from typing import Any

from rqrl.errors import EnvError

NON_FINITE_REWARD_FIX = ("rewards must be finite numbers (None reads as nan): fix the env or wrap it to clip or "
                         "replace them")


def reward_error(owner: str, reward: Any, step: int, span: str) -> EnvError:
    """The error for ``owner``'s env returning ``reward`` at ``step`` of ``span`` ("the rollout", "its episode")."""
    return EnvError(f"{owner}'s env returned reward {reward} at step {step} of {span}; {NON_FINITE_REWARD_FIX}")


def finite_reward(reward: Any, owner: str, step: int, span: str) -> float:
    """``reward`` as a float; EnvError (``reward_error``) if it is no finite number."""
    try:
        value = float(reward)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise reward_error(owner, reward, step, span)
    return value
