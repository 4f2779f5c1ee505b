"""SEED actors: threads that only step envs, asking the inference servers for Q-values, and push n-step
transitions to the learner over a bounded Redis list (they wait while it is full: nothing is dropped).

An ``Actor`` runs ``actor_threads`` such threads in one process and replaces any that dies, reporting the
cause to the trainer. Each thread's env seed and epsilon stream derive from the run seed, the actor's
index, the thread's index and how many times that thread was replaced.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import gymnasium
import numpy as np

from rqrl.engine.compression import holds_images
from rqrl.engine.keys import RunKeys
from rqrl.engine.rewards import finite_reward
from rqrl.engine.screen import MAX_ENTRY_BYTES
from rqrl.engine.unique_frames import as_frames, rebuild_stacks, unique_frames
from rqrl.errors import EnvError, RecordError, RunStoppedError
from rqrl.seed.frame_store import TransitionFrames
from rqrl.seed.inference import ActorInference, InferenceClient
from rqrl.seed.nstep import NStepCollector, Transition, TransitionBatch, obs_array, stack
from rqrl.seed.store import SeedRun, seal, unseal

log = logging.getLogger(__name__)

MAX_RESTART_PAUSE = 5.0
"""Longest pause before a thread that keeps dying is replaced again."""
STABLE_SECONDS = 10.0
"""A thread that ran this long before dying is replaced at once."""
SWITCH_INTERVAL = 0.0005
"""Seconds a thread of an actor process holds the GIL before another may take it (Python's default is 0.005):
a thread woken by its answer waits less for the GIL (measured: 1.3x the env steps/s at 32 threads)."""
TRANSITIONS_PER_MESSAGE = 16
"""An actor thread sends its transitions in messages of this many (or fewer, at an episode's end)."""



class TransitionPush(enum.IntEnum):
    """What the transitions' push script answers."""

    FULL = 0
    """Wait and push again."""
    PUSHED = 1
    DROPPED = 2
    """Full, and dropped (counted in the run's stats)."""
    STOPPED = -1


# KEYS: transitions list, stopped flag, stats hash; ARGV: bound, message, transitions in it, "1" to drop when full;
# returns a TransitionPush. The counters are best effort (pcall): a stats hash some writer broke costs counts, never
# a push
_BOUNDED_PUSH = """
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[1]) then
  if ARGV[4] == '1' then
    redis.pcall('HINCRBY', KEYS[3], 'transitions_dropped', ARGV[3])
    return 2
  end
  redis.pcall('HINCRBY', KEYS[3], 'full_waits', 1)
  return 0
end
redis.call('RPUSH', KEYS[1], ARGV[2])
redis.pcall('HINCRBY', KEYS[3], 'pushed', ARGV[3])
return 1
"""


class TransitionMessage(NamedTuple):
    """One actor thread's message: its transitions, the returns of the episodes that ended with them, and who sent
    it in what order (a thread numbers its messages 0, 1, 2, ...; the trainer refuses one it has seen)."""

    batch: TransitionBatch
    episode_returns: np.ndarray
    sender: str
    sequence: int
    frames: TransitionFrames | None = None
    """The batch's observations as the message carried them (images): its distinct frames and their index."""


def transitions_per_message(obs_bytes: int) -> int:
    """TRANSITIONS_PER_MESSAGE, or fewer where observations are so large that a message (each transition holds two)
    would pass the largest entry the trainer reads (MAX_ENTRY_BYTES)."""
    return max(1, min(TRANSITIONS_PER_MESSAGE, MAX_ENTRY_BYTES // max(1, 3 * obs_bytes)))


def message_chunks(outbox: list[Transition], per_message: int) -> list[list[Transition]]:
    """``outbox`` in messages of ``per_message`` transitions at most, in order (the last may hold fewer).

    >>> message_chunks(list("abcde"), 2)
    [['a', 'b'], ['c', 'd'], ['e']]
    """
    return [outbox[start:start + per_message] for start in range(0, len(outbox), per_message)]


def check_message_size(message: bytes, transitions: int) -> None:
    """RecordError if ``message`` is larger than the trainer reads: it would be dropped in Redis, unread."""
    if len(message) > MAX_ENTRY_BYTES:
        raise RecordError(f"a message of {transitions} transition(s) is {len(message) / 2**20:.1f} MB, over the "
                          f"{MAX_ENTRY_BYTES / 2**20:.0f} MB the trainer reads: observations this large do not fit "
                          f"SEED's transitions; downscale them (a gymnasium ResizeObservation wrapper, say)")


def encode_transitions(batch: TransitionBatch, key: bytes, episode_returns: list[float] | None = None,
                       sender: str = "", sequence: int = 0) -> bytes:
    """A signed safetensors message of transitions (and the returns of episodes that ended with them), with its
    sender and sequence number under the signature. Images (uint8 observations of two or more axes) go as their
    distinct frames and an index: an Atari transition's 8 frames (two stacks) hold about one new one."""
    arrays: dict[str, np.ndarray] = dict(batch._asdict())
    arrays["episode_returns"] = np.asarray(episode_returns or [], np.float64)
    images = holds_images(batch.obs) and holds_images(batch.next_obs)
    if images and batch.obs.shape == batch.next_obs.shape:
        found = unique_frames(as_frames(batch.obs), as_frames(batch.next_obs))
        del arrays["obs"], arrays["next_obs"]
        arrays["frames"], arrays["frame_index"] = found.frames, found.frame_index.reshape(2, batch.size, -1)
    return seal(arrays, {"sender": sender, "sequence": str(sequence)}, key)


def decode_transitions(blob: bytes, key: bytes) -> TransitionMessage:
    """Inverse of encode_transitions; SignatureError/RecordError if it is not this run's, or not whole."""
    arrays, metadata = unseal(blob, key)
    observations = ("frames", "frame_index") if "frames" in arrays else ("obs", "next_obs")
    wanted = [name for name in TransitionBatch._fields if name not in ("obs", "next_obs")]
    missing = [name for name in (*wanted, *observations, "episode_returns") if name not in arrays]
    if missing:
        raise RecordError(f"a transition message lacks its {missing} arrays; are the actors and the trainer the "
                          f"same rqrl version?")
    transitions = len(arrays["actions"])
    frames = None
    if "frames" in arrays:
        index = arrays.pop("frame_index")
        if index.ndim != 3 or len(index) != 2 or index.shape[1] != transitions:
            raise RecordError(f"a transition message's frame index is {index.dtype}{list(index.shape)}: expected "
                              f"[2, {transitions} transitions, frames per observation]")
        arrays["obs"], arrays["next_obs"] = (rebuild_stacks(arrays["frames"], part) for part in index)
        frames = TransitionFrames(arrays["frames"], index)
    batch = TransitionBatch(*(arrays[name] for name in TransitionBatch._fields))
    if lengths := batch.uneven_lengths():
        raise RecordError(f"a transition message's arrays differ in length ({lengths})")
    return TransitionMessage(batch, arrays["episode_returns"], metadata.get("sender", ""),
                             int(metadata.get("sequence", "0")), frames)


class TransitionSender:
    """Pushes transition messages onto the run's bounded list, waiting while it is full (or, if ``drop_when_full``,
    dropping the message and counting its transitions in the run's stats as transitions_dropped)."""

    def __init__(self, run: SeedRun, bound: int, drop_when_full: bool = False):
        self.run, self.bound, self.drop_when_full = run, bound, drop_when_full
        self._push = run.connection.register_script(_BOUNDED_PUSH)

    def send(self, message: bytes, count: int, stop: threading.Event | None = None) -> bool:
        """Push one message of ``count`` transitions; False if it was dropped (the list was full and
        ``drop_when_full``). RunStoppedError if the run stops while it waits."""
        keys = [self.run.keys.seed("transitions"), self.run.keys.stopped, self.run.keys.seed("stats")]
        pause = 0.005
        while True:
            result = TransitionPush(self._push(keys=keys, args=[self.bound, message, count, int(self.drop_when_full)]))
            if result == TransitionPush.PUSHED:
                return True
            if result == TransitionPush.DROPPED:
                return False
            if result == TransitionPush.STOPPED or (stop is not None and stop.is_set()):
                raise RunStoppedError(f"run {self.run.keys.run_name} stopped while transitions waited to be sent")
            time.sleep(pause)
            pause = min(0.1, pause * 2)


class _SwitchInterval:
    """The Actors running in this process, and the switch interval to restore when the last one ends."""

    lock = threading.Lock()
    users = 0
    restore = 0.0


@contextlib.contextmanager
def short_switch_interval() -> Iterator[None]:
    """SWITCH_INTERVAL as the process's GIL switch interval while any Actor of the process runs."""
    with _SwitchInterval.lock:
        if _SwitchInterval.users == 0:
            _SwitchInterval.restore = sys.getswitchinterval()
            sys.setswitchinterval(min(_SwitchInterval.restore, SWITCH_INTERVAL))
        _SwitchInterval.users += 1
    try:
        yield
    finally:
        with _SwitchInterval.lock:
            _SwitchInterval.users -= 1
            if _SwitchInterval.users == 0:
                sys.setswitchinterval(_SwitchInterval.restore)


def thread_seeds(run_seed: int, actor_index: int, thread_index: int,
                 incarnation: int) -> tuple[int, np.random.Generator]:
    """``(env reset seed, epsilon generator)`` of one actor thread, derived from the run seed."""
    sequence = np.random.SeedSequence(run_seed, spawn_key=(actor_index, thread_index, incarnation))
    env_sequence, epsilon_sequence = sequence.spawn(2)
    return int(env_sequence.generate_state(1)[0]), np.random.default_rng(epsilon_sequence)


def legal_mask(info: dict[str, Any], n_actions: int) -> np.ndarray | None:
    """``info["action_mask"]`` as a bool array of ``n_actions``, or None (all legal)."""
    mask = info.get("action_mask")
    if mask is None:
        return None
    mask = np.asarray(mask, bool).reshape(-1)
    if mask.shape != (n_actions,):
        raise EnvError(f"expected info['action_mask'] of {n_actions} booleans, got shape {mask.shape}")
    return mask


def choose_action(q_values: np.ndarray | None, mask: np.ndarray | None, explore: bool,
                  random: np.random.Generator, n_actions: int) -> int:
    """A uniformly random legal action when exploring, else the greedy legal one."""
    legal = np.flatnonzero(mask) if mask is not None and mask.any() else np.arange(n_actions)
    if explore or q_values is None:
        return int(random.choice(legal))
    return int(legal[np.argmax(q_values[legal])])


def env_misfit(env: gymnasium.Env, obs: Any, n_actions: int, state_shape: Any = None) -> str | None:
    """Why ``env``, whose reset gave ``obs``, does not fit the agent (its action space, its observations' shape),
    naming the fix; None if it fits. ``state_shape`` None: the observations are not checked."""
    space = env.action_space
    if not isinstance(space, gymnasium.spaces.Discrete) or int(space.n) != n_actions:
        return (f"expected the environment's action space to be Discrete({n_actions}) (the agent's "
                f"action_space_size), got {space}; set AgentConfig.action_space_size to the env's number of actions "
                f"(SEED's agent needs a Discrete action space)")
    shape = obs_array(obs).shape
    if state_shape is not None and shape != tuple(state_shape):
        return (f"expected the environment's observations to be shaped {tuple(state_shape)} (the agent's "
                f"state_shape), got {shape}; set AgentConfig.state_shape={shape}, with a network that takes "
                f"observations of that shape")
    return None


class ActorThread(threading.Thread):
    """Steps one env until ``stop`` is set; ``error`` holds the traceback if it died."""

    def __init__(self, run: SeedRun, settings: dict[str, Any], environment: Callable[[], gymnasium.Env],
                 actor_index: int, thread_index: int, incarnation: int, stop: threading.Event,
                 inference: ActorInference):
        super().__init__(name=f"rqrl-seed-actor-{actor_index}.{thread_index}", daemon=True)
        self.store, self.settings, self.environment, self.inference = run, settings, environment, inference
        self.actor_index, self.thread_index, self.incarnation = actor_index, thread_index, incarnation
        self.stop = stop
        self.error: str | None = None
        self.steps = 0

    def run(self) -> None:
        try:
            with self.inference.member():
                self._loop()
        except RunStoppedError:
            pass
        except BaseException:  # reported by the Actor, which replaces this thread
            self.error = traceback.format_exc()

    def _loop(self) -> None:
        env = self.environment()
        try:
            self._act(env)
        finally:
            env.close()

    def _act(self, env: gymnasium.Env) -> None:
        """Step ``env`` until ``stop`` is set, once its first observation showed that it fits the agent."""
        settings = self.settings
        n_actions, epsilon, cap = settings["n_actions"], settings["epsilon"], settings["max_environment_steps"]
        env_seed, random = thread_seeds(settings["seed"], self.actor_index, self.thread_index, self.incarnation)
        obs, info = env.reset(seed=env_seed)
        misfit = env_misfit(env, obs, n_actions, settings.get("state_shape"))
        if misfit is not None:
            raise EnvError(misfit)
        sender = TransitionSender(self.store, settings["transition_queue_size"], settings.get("drop_when_full", False))
        name = f"{self.actor_index}.{self.thread_index}.{self.incarnation}.{uuid.uuid4().hex[:8]}"
        sequence = 0
        collector = NStepCollector(settings["n_step"], settings["gamma"])
        mask = legal_mask(info, n_actions)
        episode_return, episode_steps = 0.0, 0
        per_message = transitions_per_message(obs_array(obs).nbytes)
        outbox: list[Transition] = []
        while not self.stop.is_set():
            explore = bool(random.random() < epsilon)
            q_values = None if explore else self.inference.evaluate(obs_array(obs)).q_values
            action = choose_action(q_values, mask, explore, random, n_actions)
            next_obs, reward, terminated, truncated, info = env.step(action)
            reward = finite_reward(reward, f"actor {self.actor_index} thread {self.thread_index}", episode_steps,
                                   "its episode")
            episode_return += reward
            episode_steps += 1
            self.steps += 1
            truncated = bool(truncated) or (cap > 0 and episode_steps >= cap)
            next_mask = legal_mask(info, n_actions)
            transitions = collector.step(obs, action, mask, float(reward), next_obs, next_mask,
                                         bool(terminated), truncated)
            ended = bool(terminated) or truncated
            outbox.extend(transitions)
            if outbox and (ended or len(outbox) >= per_message):
                returns = [episode_return] if ended else None
                chunks = message_chunks(outbox, per_message)  # an episode's end may flush n_step more
                for index, chunk in enumerate(chunks):
                    message = encode_transitions(stack(chunk, n_actions), self.store.message_key,
                                                 returns if index == len(chunks) - 1 else None, name, sequence)
                    check_message_size(message, len(chunk))
                    sender.send(message, len(chunk), self.stop)
                    sequence += 1
                outbox = []
            if ended:
                obs, info = env.reset()
                mask = legal_mask(info, n_actions)
                episode_return, episode_steps = 0.0, 0
            else:
                obs, mask = next_obs, next_mask


class Actor:
    """``actor_threads`` env threads in this process; a thread that dies is reported and replaced."""

    def __init__(self, run: SeedRun, actor_index: int, settings: dict[str, Any] | None = None,
                 environment: Callable[[], gymnasium.Env] | None = None):
        self.run, self.actor_index = run, actor_index
        self.settings = settings if settings is not None else run.settings()
        self.environment = environment if environment is not None else run.load("environment")
        self.stop = threading.Event()
        self.threads: list[ActorThread] = []
        self.replaced = 0
        client = InferenceClient(run, f"a{actor_index}.{os.getpid()}.{uuid.uuid4().hex[:8]}",
                                 self.settings["request_timeout"], stopped=lambda: self.stop.is_set() or run.stopped(),
                                 send_frames=self.settings.get("request_frames", True))
        self.inference = ActorInference(client, self.settings["inference_batchsize"], self.settings["inference_delay"])

    def _start_thread(self, thread_index: int, incarnation: int) -> ActorThread:
        thread = ActorThread(self.run, self.settings, self.environment, self.actor_index, thread_index,
                             incarnation, self.stop, self.inference)
        thread.start()
        return thread

    def run_forever(self, check_seconds: float = 0.2, tick: Callable[[], None] | None = None) -> None:
        """Run the threads until the run is stopped (or ``stop`` is set), replacing dead ones; a thread that
        keeps dying soon after its start is replaced after a growing pause (up to MAX_RESTART_PAUSE s).
        ``tick()`` runs every ``check_seconds`` in this thread (a job's heartbeat)."""
        with short_switch_interval():
            self._run_threads(check_seconds, tick)

    def _run_threads(self, check_seconds: float, tick: Callable[[], None] | None) -> None:
        count = self.settings["actor_threads"]
        self.threads = []
        try:
            for index in range(count):  # one by one: those started are stopped even if a later start fails
                self.threads.append(self._start_thread(index, 0))
            started = [time.monotonic()] * count
            failures, not_before, reported = [0] * count, [0.0] * count, [False] * count
            while not (self.stop.is_set() or self.run.stopped()):
                self.stop.wait(check_seconds)
                if tick is not None:
                    tick()
                now = time.monotonic()
                for index, thread in enumerate(self.threads):
                    if thread.is_alive() or self.stop.is_set():
                        continue
                    if not reported[index]:
                        reported[index] = True
                        failures[index] = 0 if now - started[index] > STABLE_SECONDS else failures[index] + 1
                        not_before[index] = now + min(MAX_RESTART_PAUSE, 0.1 * (2 ** min(failures[index], 10) - 1))
                        self._report(index, thread)
                    if now < not_before[index]:
                        continue
                    self.replaced += 1
                    self.threads[index] = self._start_thread(index, thread.incarnation + 1)
                    started[index], reported[index] = time.monotonic(), False
        finally:
            self.stop.set()
            for thread in self.threads:
                thread.join(5)

    def _report(self, index: int, thread: ActorThread) -> None:
        cause = thread.error or "the thread ended without an error"
        log.warning("actor %d: thread %d died, replacing it: %s", self.actor_index, index, cause)
        self.run.report("actor_thread_died", actor=self.actor_index, thread=index, error=cause)


def run_actor_process(redis_url: str, run_name: str, secret: str | bytes, actor_index: int,
                      learner_pid: int | None = None) -> None:
    """Entry point of an actor process: load the run's settings and environment from Redis and act until the
    run stops (or the learner that started it exits)."""
    from rqrl.engine.connection import connect
    from rqrl.engine.process import exit_when_orphaned

    if learner_pid is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's to handle: it stops us
        exit_when_orphaned(learner_pid)
    logging.basicConfig(level=logging.WARNING)
    Actor(SeedRun.attach(connect(redis_url), RunKeys(run_name), secret), actor_index).run_forever()
