"""Central batched inference over Redis: actors send one observation each, servers answer in batches.

Clients push signed requests onto one shared list (``seed:requests``) and wait on a reply list of their
own. Each server pops a request, then more (polling every DELAY_POLL_SECONDS) until it holds
``inference_batchsize`` of them or ``inference_delay`` seconds have passed since the first, runs one
forward pass on ``inference_device`` and pushes each answer to its client. Servers share the list, so a
request goes to whichever server is free, and a client whose server died re-sends after
``request_timeout`` to any live one (a stale answer that arrives later is told apart by its request id
and dropped). Servers load weights from the run's WeightStore before their first batch and look for a
newer version every ``broadcast_period``.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rqrl.codec import weights_key
from rqrl.errors import RecordError, RunStoppedError, SignatureError
from rqrl.keys import RunKeys
from rqrl.seed_store import SeedRun, seal, unseal
from rqrl.weights import WeightStore

log = logging.getLogger(__name__)

REPLY_TTL_SECONDS = 60
"""A reply list nobody reads (its client died) expires after this long."""
DELAY_POLL_SECONDS = 0.0005
"""How often a server looks for more requests while a batch waits out its delay."""
IDLE_POLL_SECONDS = 0.5
"""How long a server blocks for a first request before it looks at the stop flag and weights again."""


@dataclass(frozen=True)
class Answer:
    """Q-values ``(A,)`` for one observation, with what produced them."""

    q_values: np.ndarray
    version: int
    batch_size: int
    reason: str  # "full" or "delay"
    server: str


class InferenceClient:
    """One actor thread's connection to the inference servers (not thread-safe: one per thread)."""

    def __init__(self, run: SeedRun, client_id: str, timeout: float, stopped: Callable[[], bool] | None = None):
        self.run, self.client_id, self.timeout = run, client_id, timeout
        self.stopped = stopped or run.stopped
        self.reply_key = run.keys.seed(f"reply:{client_id}")
        self._ids = itertools.count()
        self.resent = 0  # requests sent again after request_timeout

    def evaluate(self, obs: np.ndarray) -> Answer:
        """The Q-values of ``obs``; blocks until a server answers, re-sending every ``timeout`` s; RunStoppedError
        once the run is stopped."""
        request_id = f"{next(self._ids)}"
        blob = seal({"obs": np.asarray(obs, np.float32)}, {"reply": self.reply_key, "id": request_id},
                    self.run.message_key)
        connection = self.run.connection
        while True:
            connection.rpush(self.run.keys.seed("requests"), blob)
            deadline = time.monotonic() + self.timeout
            while (remaining := deadline - time.monotonic()) > 0:
                popped = connection.blpop([self.reply_key], timeout=max(0.01, min(remaining, IDLE_POLL_SECONDS)))
                if popped is None:
                    if self.stopped():
                        raise RunStoppedError(f"run {self.run.keys.run_name} stopped while {self.client_id} waited "
                                              f"for inference")
                    continue
                arrays, metadata = unseal(_as_bytes(popped[1]), self.run.message_key)
                if metadata.get("id") != request_id:
                    continue  # the answer to a request re-sent earlier
                return Answer(arrays["q"], int(metadata["version"]), int(metadata["batch_size"]),
                              metadata["reason"], metadata["server"])
            self.resent += 1
            log.info("%s: no answer within %.1f s, sending request %s again", self.client_id, self.timeout,
                     request_id)


class InferenceServer:
    """Answers requests in batches with ``model`` (a QModel or any module mapping ``(B, *obs)`` to ``(B, A)``)."""

    def __init__(self, run: SeedRun, model: nn.Module, server_id: str, batch_size: int, delay: float,
                 device: torch.device | str = "cpu", broadcast_period: float = 2.5):
        self.run, self.server_id = run, server_id
        self.batch_size, self.delay, self.broadcast_period = batch_size, delay, broadcast_period
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.weights = WeightStore(run.connection, run.keys, weights_key(run.secret, run.keys.run_name))
        self.version: int | None = None
        self.batches = {"full": 0, "delay": 0}

    def load_weights(self) -> bool:
        """Load the newest weights if they moved; True if it loaded some."""
        fetched = self.weights.fetch_if_newer(self.version)
        if fetched is None:
            return False
        version, state_dict = fetched
        self.model.load_state_dict(state_dict)
        self.version = version
        log.debug("%s: weights version %d", self.server_id, version)
        return True

    def run_forever(self, stop: threading.Event | None = None, tick: Callable[[], None] | None = None) -> None:
        """Serve until ``stop`` is set or the run is stopped; loads weights before the first batch. ``tick()`` runs
        between batches in this thread (a job's heartbeat)."""
        stop = stop or threading.Event()
        checked = {"at": -float("inf"), "stopped": False}

        def stopping() -> bool:  # the run's flag costs a round trip: looked at every IDLE_POLL_SECONDS at most
            if not checked["stopped"] and time.monotonic() - checked["at"] >= IDLE_POLL_SECONDS:
                checked["at"], checked["stopped"] = time.monotonic(), self.run.stopped()
            return stop.is_set() or bool(checked["stopped"])

        while self.version is None:
            if stopping():
                return
            if tick is not None:
                tick()
            if not self.load_weights():
                time.sleep(0.05)
        next_weights = time.monotonic() + self.broadcast_period
        while not stopping():
            if time.monotonic() >= next_weights:
                self.load_weights()
                next_weights = time.monotonic() + self.broadcast_period
            self.serve_once(IDLE_POLL_SECONDS)
            if tick is not None:
                tick()

    def serve_once(self, wait: float) -> int:
        """Wait up to ``wait`` s for a request, batch it with those that come within ``delay``, answer them all;
        returns the batch size (0: nothing came)."""
        connection, requests = self.run.connection, self.run.keys.seed("requests")
        first = connection.blpop([requests], timeout=wait)
        if first is None:
            return 0
        blobs = [_as_bytes(first[1])]
        deadline = time.monotonic() + self.delay
        while len(blobs) < self.batch_size:
            more = connection.lpop(requests, self.batch_size - len(blobs))
            if isinstance(more, list) and more:
                blobs.extend(_as_bytes(blob) for blob in more)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            # poll rather than BLPOP: Redis notices a blocked client's timeout only at its next event-loop wake-up,
            # up to 1/hz (100 ms by default) late, which would stretch short delays many times over
            time.sleep(min(remaining, DELAY_POLL_SECONDS))
        reason = "full" if len(blobs) >= self.batch_size else "delay"
        return self._answer(blobs, reason)

    def _answer(self, blobs: list[bytes], reason: str) -> int:
        requests: list[tuple[str, str, np.ndarray]] = []
        for blob in blobs:
            try:
                arrays, metadata = unseal(blob, self.run.message_key)
                requests.append((metadata["reply"], metadata["id"], arrays["obs"]))
            except (SignatureError, RecordError, KeyError) as error:
                log.warning("%s: dropping a request that is not a signed observation: %s", self.server_id, error)
        if not requests:
            return 0
        with torch.no_grad():
            obs = torch.as_tensor(np.stack([obs for _, _, obs in requests]), device=self.device)
            q_values = self.model(obs).float().cpu().numpy()
        self.batches[reason] += 1
        answer: dict[str, Any] = {"version": str(self.version), "batch_size": str(len(requests)),
                                  "reason": reason, "server": self.server_id}
        with self.run.connection.pipeline(transaction=False) as pipe:
            for (reply, request_id, _), q in zip(requests, q_values, strict=True):
                pipe.rpush(reply, seal({"q": q}, {**answer, "id": request_id}, self.run.message_key))
                pipe.expire(reply, REPLY_TTL_SECONDS)
            pipe.hincrby(self.run.keys.seed("stats"), f"batches_{reason}", 1)
            pipe.hincrby(self.run.keys.seed("stats"), "inferences", len(requests))
            pipe.execute()
        return len(requests)


def _as_bytes(value: object) -> bytes:
    """A reply item of a client without decode_responses (the only kind rqrl makes)."""
    if not isinstance(value, bytes):
        raise RecordError(f"expected bytes from Redis, got {type(value).__name__}: use a client without "
                          f"decode_responses")
    return value


def run_server_process(redis_url: str, run_name: str, secret: str | bytes, server_index: int,
                       learner_pid: int | None = None) -> None:
    """Entry point of an inference server process: load the run's model factory and settings from Redis, serve
    until the run stops (or the learner that started it exits)."""
    from rqrl.connection import connect
    from rqrl.process import exit_when_orphaned

    if learner_pid is not None:
        exit_when_orphaned(learner_pid)
    logging.basicConfig(level=logging.WARNING)
    run = SeedRun(connect(redis_url), RunKeys(run_name), secret)
    settings = run.settings()
    torch.set_num_threads(settings["inference_threads"])
    model = run.load("model")()
    server = InferenceServer(run, model, f"server-{server_index}.{os.getpid()}", settings["inference_batchsize"],
                             settings["inference_delay"], settings["inference_device"], settings["broadcast_period"])
    server.run_forever()
