"""A Rainbow-style DQN agent: double DQN, n-step returns, prioritized replay, a target network, an
optional C51 distributional head and an optional dueling head. The SEED trainer (``rqrl.seed``) feeds it.

Network contract (what ``network()`` builds), with ``A = action_space_size``:

==================  ==========================  ===============================================
distributional      dueling=False               dueling=True
==================  ==========================  ===============================================
False               ``(B, A)`` Q-values         ``(B, 1 + A)``: value, then advantages
True                ``(B, A, n_atoms)`` probs   ``(B, 1 + A, n_atoms)`` logits: value, advantages
==================  ==========================  ===============================================

The dueling head combines ``V + A - mean(A)`` (per atom, then a softmax, when distributional). Transitions
carry their own bootstrap discount (``gamma**k``, 0 after a termination; see rqrl.seed.nstep), which is how
the source's n-step discount bug is avoided: the agent never assumes a fixed n.

>>> config = AgentConfig(state_shape=(4,), action_space_size=2, use_distributional=False)
>>> agent = Agent(config, lambda: torch.nn.Linear(4, 2))
>>> agent.buffer_size()
0
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from rqrl.engine.devices import check_device
from rqrl.errors import ConfigError
from rqrl.seed.frame_store import TransitionFrames
from rqrl.seed.nstep import TransitionBatch
from rqrl.seed.replay import ReplayBuffer

STATE_DTYPES = ("float32", "uint8")
"""The replay's choices of AgentConfig.state_dtype."""


@dataclass
class AgentConfig:
    """The agent's settings; attributes may also be set after construction (``validate()`` runs again in Agent)."""

    state_shape: tuple[int, ...] = ()
    """Shape of one observation (required)."""
    state_dtype: str = "float32"
    """How the replay stores observations: "float32", or "uint8" for images (a quarter of the memory; actors send
    uint8 observations as they are, and the networks get them as float32 all the same)."""
    action_space_size: int = 0
    """Number of discrete actions (required)."""
    replay_capacity: int = 10000
    """Transitions the replay holds."""
    batch_size: int = 32
    """Transitions per train step."""
    target_update_steps: int = 20
    """Train steps between hard copies of the online network into the target network."""
    discount_factor: float = 0.99
    """Per-step discount gamma (transitions bootstrap with gamma**k for their k rewards)."""
    use_double: bool = True
    """Double DQN: the online network picks the next action, the target network values it."""
    use_distributional: bool = True
    """C51: the network outputs a distribution over n_atoms returns in [v_min, v_max]."""
    n_atoms: int = 51
    """Atoms of the distributional head."""
    v_min: float = -1
    """Smallest return of the distributional support."""
    v_max: float = 1
    """Largest return of the distributional support."""
    use_prioritized_experience_replay: bool = True
    """Sample transitions by priority (|TD error|, or the cross-entropy when distributional)."""
    alpha: float = 0.6
    """Priority exponent."""
    beta_start: float = 0.4
    """Importance-weight exponent at beta_t_start train steps."""
    beta_end: float = 1.0
    """Importance-weight exponent from beta_t_end train steps on (linear in between)."""
    beta_t_start: int = 0
    """Train step where beta starts annealing."""
    beta_t_end: int = 10000
    """Train step where beta reaches beta_end."""
    gradient_norm: float = 20
    """Gradient norm clip; <= 0: no clipping."""
    huber_loss: bool = False
    """Huber instead of squared TD loss (non-distributional only)."""
    network_device: torch.device | str = "cpu"
    """Device of the learner's online and target networks."""
    replay_device: torch.device | str = "cpu"
    """Where the replay lives; rqrl keeps it in host memory, so only cpu is accepted."""
    dueling: bool = False
    """Dueling head: the network outputs a value and advantages (see the module docstring)."""
    seed: int | None = field(default=None)
    """Seed of the replay's sampling (None: fresh entropy)."""

    def __post_init__(self) -> None:
        if self.state_shape or self.action_space_size:
            self.validate()

    def validate(self) -> None:
        """ConfigError naming the first bad field."""
        if not (isinstance(self.state_shape, (tuple, list)) and len(self.state_shape) >= 1
                and all(isinstance(size, int) and size >= 1 for size in self.state_shape)):
            raise ConfigError(f"expected state_shape to be a tuple of positive ints such as (4,), got "
                              f"{self.state_shape!r}")
        self.state_shape = tuple(self.state_shape)
        if self.state_dtype not in STATE_DTYPES:
            raise ConfigError(f"expected state_dtype to be one of {', '.join(STATE_DTYPES)}, got {self.state_dtype!r}")
        for name in ("action_space_size", "replay_capacity", "batch_size", "target_update_steps", "n_atoms"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ConfigError(f"expected {name} >= 1, got {value!r}")
        if self.use_distributional and self.n_atoms < 2:
            raise ConfigError(f"expected n_atoms >= 2 with use_distributional, got {self.n_atoms}")
        if not 0 <= self.discount_factor <= 1:
            raise ConfigError(f"expected 0 <= discount_factor <= 1, got {self.discount_factor!r}")
        if not self.v_min < self.v_max:
            raise ConfigError(f"expected v_min < v_max, got v_min={self.v_min!r}, v_max={self.v_max!r}")
        if not self.alpha >= 0:
            raise ConfigError(f"expected alpha >= 0, got {self.alpha!r}")
        if not self.beta_t_end >= self.beta_t_start:
            raise ConfigError(f"expected beta_t_end >= beta_t_start ({self.beta_t_start}), got {self.beta_t_end}")
        if torch.device(self.replay_device).type != "cpu":
            raise ConfigError(f"replay_device={self.replay_device!r}: rqrl keeps the replay in host memory and moves "
                              f"each sampled batch to network_device; use replay_device='cpu'")
        check_device("network_device", self.network_device)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able fields (devices as strings)."""
        values = dataclasses.asdict(self)
        values["network_device"] = str(self.network_device)
        values["replay_device"] = str(self.replay_device)
        values["state_shape"] = list(self.state_shape)
        return values


class QModel(nn.Module):
    """The user's network plus the head: ``forward(obs)`` gives expected Q-values ``(B, A)``, ``dist(obs)``
    the per-action return distributions ``(B, A, n_atoms)`` (distributional only)."""

    def __init__(self, network: nn.Module, config: AgentConfig):
        super().__init__()
        self.network = network
        self.n_actions = config.action_space_size
        self.distributional, self.dueling = config.use_distributional, config.dueling
        self.support: torch.Tensor
        self.register_buffer("support", torch.linspace(float(config.v_min), float(config.v_max), config.n_atoms),
                             persistent=False)

    def dist(self, obs: torch.Tensor) -> torch.Tensor:
        output = self.network(obs)
        if not self.dueling:
            return output
        value, advantages = output[:, :1], output[:, 1:]
        return torch.softmax(value + advantages - advantages.mean(dim=1, keepdim=True), dim=-1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.distributional:
            return (self.dist(obs) * self.support).sum(-1)
        output = self.network(obs)
        if not self.dueling:
            return output
        value, advantages = output[:, :1], output[:, 1:]
        return value + advantages - advantages.mean(dim=1, keepdim=True)


def build_model(config: AgentConfig, network: Callable[[], nn.Module]) -> QModel:
    """A QModel around a fresh ``network()``; what inference servers call with the factories they receive."""
    return QModel(network(), config)


def network_output_shape(config: AgentConfig) -> tuple[int, ...]:
    """What ``network()`` must output per observation (the module docstring's table): ``(A,)``, ``(1 + A,)``
    with a dueling head, each with ``n_atoms`` more when distributional."""
    width = config.action_space_size + (1 if config.dueling else 0)
    return (width, config.n_atoms) if config.use_distributional else (width,)


def check_network(network: nn.Module, config: AgentConfig, device: torch.device) -> None:
    """ConfigError unless ``network`` maps two zero observations of ``state_shape`` to the output the agent's head
    needs: a misfit would surface later as a torch error inside a train step, or not at all. Runs in eval mode and
    leaves the training mode and the RNG as they were."""
    shape = (2, *config.state_shape)
    modes = {module: module.training for module in network.modules()}  # a frozen submodule stays frozen
    network.eval()
    accelerator = device.type != "cpu"
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[device] if accelerator else [],
                                                    device_type=device.type if accelerator else None):
            output = network(torch.zeros(shape, device=device))
    except Exception as error:
        raise ConfigError(f"the network failed on a batch of zero observations of shape {shape} (AgentConfig."
                          f"state_shape={config.state_shape}): {type(error).__name__}: {error}; set state_shape "
                          f"to the shape of the env's observations, and build the network to take them") from error
    finally:
        for module, training in modes.items():
            module.training = training
    expected = network_output_shape(config)
    got = tuple(output.shape) if isinstance(output, torch.Tensor) else None
    if got != (2, *expected):
        shown = f"{type(output).__name__}" if got is None else _batch_shape(got, 2)
        raise ConfigError(f"expected the network to output shape {_batch_shape((2, *expected), 2)} for a batch of B "
                          f"observations of state_shape={config.state_shape}, got {shown} (B=2); {_output_fix(config)}")


def _batch_shape(shape: tuple[int, ...], batch: int) -> str:
    """``shape`` as text, its batch axis written B where it is ``batch``: ``(B, 3)``."""
    parts = ["B" if index == 0 and size == batch else str(size) for index, size in enumerate(shape)]
    return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"


def _output_fix(config: AgentConfig) -> str:
    """How to make the network's output fit, for the error of check_network."""
    atoms = f", n_atoms={config.n_atoms}" if config.use_distributional else ""
    return (f"make the network output that shape, or set the agent's action_space_size={config.action_space_size}, "
            f"use_distributional={config.use_distributional}{atoms} and dueling={config.dueling} to fit the network "
            f"(the table in rqrl.seed.agent's docstring)")


def masked_argmax(q_values: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Argmax over legal actions; a row with no legal action counts every action legal."""
    masks = masks | ~masks.any(dim=1, keepdim=True)
    return q_values.masked_fill(~masks, -torch.inf).argmax(dim=1)


def _adam(parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.Adam(parameters, lr=1e-4)


class Agent:
    """Online and target networks, optimizer and replay; ``observe`` adds transitions, ``train_step`` learns."""

    def __init__(self, config: AgentConfig, network: Callable[[], nn.Module],
                 optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None):
        config.validate()
        self.config = config
        self.network_factory = network
        self.device = torch.device(config.network_device)
        self.model_instance = build_model(config, network).to(self.device)
        check_network(self.model_instance.network, config, self.device)
        self.target = copy.deepcopy(self.model_instance)
        self.target.requires_grad_(False)
        self.optimizer = (optimizer or _adam)(self.model_instance.parameters())
        self.replay = ReplayBuffer(config.replay_capacity, config.state_shape, config.action_space_size,
                                   config.use_prioritized_experience_replay, config.alpha, config.seed,
                                   obs_dtype=np.dtype(config.state_dtype))
        self.train_steps = 0

    def model_factory(self) -> QModel:
        """A fresh model of the same architecture (random weights), on the CPU."""
        return build_model(self.config, self.network_factory)

    def buffer_size(self) -> int:
        return len(self.replay)

    def observe(self, batch: TransitionBatch, errors: np.ndarray | None = None,
                frames: TransitionFrames | None = None) -> None:
        """Add transitions; ``errors`` (NaN: unknown) set their priorities, else they get the largest one;
        ``frames``: their observations as their message's distinct frames, where it carried them."""
        self.replay.add(batch, errors, frames)

    def beta(self) -> float:
        config = self.config
        span = max(1, config.beta_t_end - config.beta_t_start)
        fraction = min(1.0, max(0.0, (self.train_steps - config.beta_t_start) / span))
        return config.beta_start + fraction * (config.beta_end - config.beta_start)

    @torch.no_grad()
    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Expected Q-values ``(B, A)`` of the online network."""
        return self.model_instance(torch.as_tensor(obs, dtype=torch.float32, device=self.device)).cpu().numpy()

    def act(self, obs: np.ndarray, masks: np.ndarray | None = None) -> np.ndarray:
        """Greedy legal actions of a batch."""
        q = torch.as_tensor(self.q_values(obs))
        legal = torch.ones_like(q, dtype=torch.bool) if masks is None else torch.as_tensor(masks, dtype=torch.bool)
        return masked_argmax(q, legal).numpy()

    def train_step(self) -> float:
        """One gradient step on a sampled batch; returns the loss."""
        config = self.config
        batch, indices, weights = self.replay.sample(config.batch_size, self.beta())
        tensors = [torch.as_tensor(array, device=self.device) for array in batch]
        obs, actions, rewards, discounts, next_obs, next_masks = tensors
        obs, next_obs = obs.float(), next_obs.float()  # a uint8 replay's images too: the network takes float32
        weight = torch.as_tensor(weights, device=self.device)
        if config.use_distributional:
            errors = self._distributional_loss(obs, actions, rewards, discounts, next_obs, next_masks)
            loss = (weight * errors).mean()
        else:
            q = self.model_instance(obs).gather(1, actions[:, None]).squeeze(1)
            with torch.no_grad():
                target_q = self.target(next_obs)
                chooser = self.model_instance(next_obs) if config.use_double else target_q
                next_actions = masked_argmax(chooser, next_masks)
                target = rewards + discounts * target_q.gather(1, next_actions[:, None]).squeeze(1)
            errors = (q - target).abs()
            per_sample = (nn.functional.huber_loss(q, target, reduction="none") if config.huber_loss
                          else (q - target) ** 2)
            loss = (weight * per_sample).mean()
        self.optimizer.zero_grad()
        loss.backward()
        if config.gradient_norm > 0:
            nn.utils.clip_grad_norm_(self.model_instance.parameters(), config.gradient_norm)
        self.optimizer.step()
        self.replay.update_priorities(indices, errors.detach().cpu().numpy())
        self.train_steps += 1
        if self.train_steps % config.target_update_steps == 0:
            self.target.load_state_dict(self.model_instance.state_dict())
        return float(loss.item())

    def _distributional_loss(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor,
                             discounts: torch.Tensor, next_obs: torch.Tensor, next_masks: torch.Tensor
                             ) -> torch.Tensor:
        """Per-sample cross-entropy between the projected target distribution and the online one (C51)."""
        config = self.config
        support = self.model_instance.support
        atoms = config.n_atoms
        delta = (config.v_max - config.v_min) / (atoms - 1)
        with torch.no_grad():
            target_dist = self.target.dist(next_obs)
            chooser = self.model_instance(next_obs) if config.use_double else (target_dist * support).sum(-1)
            next_actions = masked_argmax(chooser, next_masks)
            next_dist = target_dist[torch.arange(len(actions)), next_actions]  # (B, atoms)
            returns = (rewards[:, None] + discounts[:, None] * support[None, :]).clamp(config.v_min, config.v_max)
            position = (returns - config.v_min) / delta
            lower, upper = position.floor().long(), position.ceil().long()
            projected = torch.zeros_like(next_dist)
            # when position is an integer lower == upper: give it all the mass
            projected.scatter_add_(1, lower, next_dist * (upper.float() - position + (lower == upper).float()))
            projected.scatter_add_(1, upper, next_dist * (position - lower.float()))
        dist = self.model_instance.dist(obs)[torch.arange(len(actions)), actions]
        return -(projected * dist.clamp_min(1e-8).log()).sum(-1)
