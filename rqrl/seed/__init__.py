"""The SEED trainer on rqrl: actors that ask central inference servers for actions, transitions over Redis to
one learner, and its Rainbow-style DQN agent.

>>> from rqrl.seed import Config, Trainer
"""

from __future__ import annotations

import typing

from rqrl.engine import lazy as _lazy

if typing.TYPE_CHECKING:
    from rqrl.seed.actor import Actor
    from rqrl.seed.config import Config
    from rqrl.seed.trainer import Trainer, TrainerStats

_LAZY_EXPORTS = {"Actor": "rqrl.seed.actor", "Config": "rqrl.seed.config", "Trainer": "rqrl.seed.trainer",
                 "TrainerStats": "rqrl.seed.trainer"}

__getattr__, __dir__ = _lazy.lazy_exports(__name__, globals(), _LAZY_EXPORTS)

__all__ = ["Actor", "Config", "Trainer", "TrainerStats"]
