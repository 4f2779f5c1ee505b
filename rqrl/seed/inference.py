"""Central batched inference over Redis: actor threads ask for one observation each, servers answer in batches.

The threads of one actor process share an ``ActorInference``: their observations travel together, one request
per round trip, and the answer is split back among them (a request goes out once every member thread is
waiting, ``inference_batchsize`` observations are pending, or the oldest has waited ``inference_delay``,
counted from the end of the last round trip if one was in flight). Requests are signed and go onto one
shared list (``seed:requests``); each client waits on a reply list of its own. Requests of images carry only
the frames their server does not hold for the client yet, and go onto that server's own list
(``rqrl.seed.request_frames``). Each server pops requests, its own list first, then more (polling every
DELAY_POLL_SECONDS) until it holds ``inference_batchsize`` observations or ``inference_delay`` seconds have
passed since the first, runs forward passes of up to ``inference_batchsize`` observations on
``inference_device`` and pushes each answer to its client. Servers share the list, so a request goes to
whichever server is free, and a client whose server died re-sends after ``request_timeout``, whole, to any
live one (an answer to an earlier request that arrives later is told apart by its request id and dropped). Servers load
weights from the run's WeightStore before their first batch and look for a newer version every
``broadcast_period``.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis
import torch
from torch import nn

from rqrl.engine.compression import holds_images
from rqrl.engine.keys import RunKeys
from rqrl.engine.weights import WeightStore
from rqrl.errors import RecordError, RunStoppedError, SignatureError
from rqrl.seed.nstep import obs_array
from rqrl.seed.request_frames import FramesMissing, HeldFrames, RebuiltObservations, SentFrames
from rqrl.seed.store import SeedRun, seal, unseal

log = logging.getLogger(__name__)

REPLY_TTL_SECONDS = 60
"""A reply list nobody reads (its client died) expires after this long."""
DELAY_POLL_SECONDS = 0.0005
"""How often a server looks for more requests while a batch waits out its delay."""
SHRINK_BATCH_BYTES = 64 * 2**20
"""A server's batch array larger than this, four times or more the last batch's, is let go (ObservationBatch)."""
IDLE_POLL_SECONDS = 0.5
"""How long a server blocks for a first request before it looks at the stop flag and weights again."""


class _Missing:
    """What a client reads from an answer saying that its server lacked frames the request relied on."""


_MISSING = _Missing()


def server_requests_key(keys: RunKeys, server: str) -> str:
    """The list of requests for one server only: those of images that rely on frames it holds for their client
    (``rqrl.seed.request_frames``)."""
    return keys.seed(f"requests:{server}")


@dataclass(frozen=True)
class Answer:
    """Q-values ``(A,)`` for one observation, with what produced them."""

    q_values: np.ndarray
    version: int
    batch_size: int
    reason: str  # "full" or "delay"
    server: str


class InferenceClient:
    """A connection to the inference servers with one request in flight at a time (not thread-safe: an actor
    process's threads share one through ActorInference)."""

    def __init__(self, run: SeedRun, client_id: str, timeout: float, stopped: Callable[[], bool] | None = None,
                 send_frames: bool = True):
        self.run, self.client_id, self.timeout = run, client_id, timeout
        self.send_frames = send_frames  # requests of images as the frames their server lacks (rqrl.seed.request_frames)
        self.instance = f"{client_id}.{uuid.uuid4().hex[:12]}"  # what servers hold frames under: ids may repeat
        self.stopped = stopped or run.stopped
        self.reply_key = run.keys.seed(f"reply:{client_id}")
        self._ids = itertools.count()
        self.requests = 0  # requests sent (each once, however often re-sent)
        self.resent = 0  # requests sent again after request_timeout
        self.missed = 0  # requests sent again whole: their server no longer held frames they relied on
        self.bytes_sent = 0  # bytes of the requests sent, re-sent ones included
        self.sent_frames = SentFrames()

    def evaluate(self, obs: np.ndarray) -> Answer:
        """The Q-values of ``obs``; blocks until a server answers, re-sending every ``timeout`` s; RunStoppedError
        once the run is stopped."""
        return self.evaluate_batch(obs_array(obs)[None])[0]

    def evaluate_batch(self, observations: np.ndarray) -> list[Answer]:
        """The Q-values of each row of ``observations`` ``(B, *obs_shape)``, asked in one request; as ``evaluate``."""
        observations = obs_array(observations)
        if len(observations) == 0:
            raise ValueError("evaluate_batch was given no observations: pass an array of shape (B, *obs_shape), "
                             "B >= 1")
        number = next(self._ids)
        request_id = f"{number}"
        self.requests += 1
        metadata = {"reply": self.reply_key, "id": request_id, "client": self.instance}
        while True:
            arrays, server = self._request_arrays(observations, number)
            self._send(seal(arrays, metadata, self.run.message_key), server)
            answers = self._wait_for_answers(request_id, len(observations), whole=server is None)
            if isinstance(answers, list):
                if "frame_source" in arrays:
                    self.sent_frames.answered(answers[0].server, number)
                return answers
            self.sent_frames.forget()  # whole again, to any server
            if answers is _MISSING:
                self.missed += 1
                continue
            self.resent += 1
            log.info("%s: no answer within %.1f s, sending request %s again", self.client_id, self.timeout,
                     request_id)

    def _request_arrays(self, observations: np.ndarray, number: int) -> tuple[dict[str, np.ndarray], str | None]:
        """Request ``number``'s arrays, and the server whose own list it must go onto (None: the shared list)."""
        if self.send_frames and holds_images(observations):
            return self.sent_frames.request(observations, number)
        return {"obs": observations}, None

    def _send(self, blob: bytes, server: str | None) -> None:
        self.bytes_sent += len(blob)
        if server is None:
            self.run.connection.rpush(self.run.keys.seed("requests"), blob)
            return
        own_list = server_requests_key(self.run.keys, server)
        with self.run.connection.pipeline(transaction=False) as pipe:
            pipe.rpush(own_list, blob)
            pipe.expire(own_list, REPLY_TTL_SECONDS)  # a server that died leaves no list behind for long
            pipe.execute()

    def _wait_for_answers(self, request_id: str, rows: int, whole: bool) -> list[Answer] | _Missing | None:
        """The answers to request ``request_id``, _MISSING if its server lacked frames it relied on, None if no
        answer came within ``timeout``; RunStoppedError once the run is stopped. A ``whole`` request relies on
        no frames: a "missing" answer then is to an earlier copy sent to one server, and it waits on."""
        deadline = time.monotonic() + self.timeout
        while (remaining := deadline - time.monotonic()) > 0:
            popped = self.run.connection.blpop([self.reply_key], timeout=max(0.01, min(remaining, IDLE_POLL_SECONDS)))
            if popped is None:
                if self.stopped():
                    raise RunStoppedError(f"run {self.run.keys.run_name} stopped while {self.client_id} waited "
                                          f"for inference")
                continue
            answers = self._answers(_as_bytes(popped[1]), request_id, rows)
            if answers is not None and not (whole and answers is _MISSING):
                return answers
        return None

    def _answers(self, blob: bytes, request_id: str, rows: int) -> list[Answer] | _Missing | None:
        """The answers ``blob`` holds for request ``request_id`` of ``rows`` observations, _MISSING if its server
        lacked frames it relied on; None for the answer to a request re-sent earlier, or for what is no answer of
        this run's servers (refused, counted and logged at a bounded rate: a Redis writer cannot make the thread
        fail)."""
        try:
            arrays, metadata = unseal(blob, self.run.message_key)
            if metadata.get("id") != request_id:
                return None  # the answer to a request re-sent earlier
            if metadata.get("missing"):
                return _MISSING
            if len(arrays["q"]) != rows or len(arrays["batch_size"]) != rows:
                raise RecordError(f"{metadata.get('server')} answered {len(arrays['q'])} Q-value rows for {rows} "
                                  f"observations; are actors and servers the same rqrl version?")
            version, reason, server = int(metadata["version"]), metadata["reason"], metadata["server"]
            return [Answer(q_values, version, int(batch_size), reason, server)
                    for q_values, batch_size in zip(arrays["q"], arrays["batch_size"], strict=True)]
        except (SignatureError, RecordError, KeyError, ValueError, TypeError) as error:
            self.run.refuse(f"{self.client_id}: refusing a reply that is no answer of this run's servers: {error}")
            return None


@dataclass
class _Pending:
    """One thread's observation waiting in an ActorInference."""

    obs: np.ndarray
    since: float = field(default_factory=time.monotonic)
    answer: Answer | None = None
    error: BaseException | None = None


class ActorInference:
    """The inference client of an actor process's threads: their observations go out together, one request per
    round trip (a Redis round trip and a signature per thread and step would cap a process at a few thousand
    steps/s). Whichever waiting thread finds no request in flight sends all pending observations, once every
    member thread waits, ``batch_size`` are pending or the oldest has waited ``delay`` s (counted from the end
    of the last round trip if one was in flight), then hands each thread its answer; an error (RunStoppedError,
    a Redis outage) reaches every thread whose observation was in it."""

    def __init__(self, client: InferenceClient, batch_size: int, delay: float):
        self.client, self.batch_size, self.delay = client, batch_size, delay
        self._condition = threading.Condition()
        self._pending: list[_Pending] = []
        self._members = 0
        self._in_flight = False
        self._free_since = time.monotonic()  # when the last request in flight came back

    @contextmanager
    def member(self) -> Iterator[ActorInference]:
        """A thread that asks for inference while inside: a request waits for all members, or ``delay``."""
        with self._condition:
            self._members += 1
        try:
            yield self
        finally:
            with self._condition:
                self._members -= 1
                self._condition.notify_all()

    def evaluate(self, obs: np.ndarray) -> Answer:
        """The Q-values of ``obs``, asked together with the other threads' observations."""
        waiting = _Pending(obs_array(obs))
        with self._condition:
            self._pending.append(waiting)
        while (batch := self._lead_or_wait(waiting)) is not None:
            try:
                self._round_trip(batch)
            finally:
                self._finish(batch)
        if waiting.error is not None:
            raise waiting.error
        assert waiting.answer is not None
        return waiting.answer

    def _lead_or_wait(self, waiting: _Pending) -> list[_Pending] | None:
        """Wait until ``waiting`` has its answer or error (None), or until this thread is to send the pending
        observations (returned; the caller must ``_finish`` them)."""
        with self._condition:
            while waiting.answer is None and waiting.error is None:
                if not self._in_flight and self._ready():
                    batch, self._pending, self._in_flight = self._pending, [], True
                    return batch
                # while a request is in flight only its end (notify_all) can make this thread's turn
                self._condition.wait(None if self._in_flight else self._until_ready())
            return None

    def _finish(self, batch: list[_Pending]) -> None:
        """End a round trip: no observation of it is left without an answer or error, and the waiters wake."""
        with self._condition:
            for waiting in batch:
                if waiting.answer is None and waiting.error is None:
                    waiting.error = RunStoppedError("the thread asking for this observation's Q-values stopped "
                                                    "before the answer came")
            self._in_flight, self._free_since = False, time.monotonic()
            self._condition.notify_all()

    def _ready(self) -> bool:
        return bool(self._pending) and (len(self._pending) >= min(self.batch_size, max(1, self._members))
                                        or time.monotonic() >= self._send_by())

    def _send_by(self) -> float:
        """When the pending observations go whoever is missing: ``delay`` after the oldest came, or after the last
        request came back if it came while one was in flight (so the threads answered by it can join in)."""
        return max(self._pending[0].since, self._free_since) + self.delay

    def _until_ready(self) -> float | None:
        """Seconds until the pending observations go by the delay (None: nothing pending)."""
        if not self._pending:
            return None
        return max(0.0, self._send_by() - time.monotonic()) + 1e-4

    def _round_trip(self, batch: list[_Pending]) -> None:
        try:
            answers = self.client.evaluate_batch(np.stack([waiting.obs for waiting in batch]))
            for waiting, answer in zip(batch, answers, strict=True):
                waiting.answer = answer
        except Exception as error:  # each waiting thread raises it
            for waiting in batch:
                waiting.error = error


class InferenceServer:
    """Answers requests in batches with ``model`` (a QModel or any module mapping ``(B, *obs)`` to ``(B, A)``)."""

    def __init__(self, run: SeedRun, model: nn.Module, server_id: str, batch_size: int, delay: float,
                 device: torch.device | str = "cpu", broadcast_period: float = 2.5):
        self.run, self.server_id = run, server_id
        self.batch_size, self.delay, self.broadcast_period = batch_size, delay, broadcast_period
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.weights = WeightStore(run.connection, run.keys, run.weights_key)
        self.version: int | None = None
        self.batches = {"full": 0, "delay": 0}
        self.own_requests = server_requests_key(run.keys, server_id)
        self.held_frames = HeldFrames()
        self.batch = ObservationBatch()
        self.missing = 0  # requests answered "send it whole": they relied on frames not held here

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
        try:
            while not stopping():
                if time.monotonic() >= next_weights:
                    self.load_weights()
                    next_weights = time.monotonic() + self.broadcast_period
                self.serve_once(IDLE_POLL_SECONDS)
                if tick is not None:
                    tick()
        finally:
            try:
                self.hand_back()
            except redis.RedisError as error:  # stopping because Redis is gone, say: the clients re-send in time
                log.debug("%s: could not hand back the requests on its own list: %s", self.server_id, error)

    def hand_back(self) -> int:
        """Answer each request waiting on this server's own list that its frames are not held here, so that its
        client sends it again, whole, to a server that goes on (a server that stops strands nobody for
        ``request_timeout``); returns how many it handed back."""
        handed = 0
        while blobs := self._pop_more([self.own_requests], 64):
            for blob in blobs:
                try:
                    _, metadata = unseal(blob, self.run.message_key)
                    self._answer_missing(metadata["reply"], metadata["id"])
                    handed += 1
                except (SignatureError, RecordError, KeyError) as error:
                    self.run.refuse(f"{self.server_id}: dropping a request that is not a signed observation: "
                                    f"{error}")
        return handed

    def serve_once(self, wait: float) -> int:
        """Wait up to ``wait`` s for a request, add those that come within ``delay`` until ``batch_size``
        observations are held, answer them all; returns how many observations it answered (0: nothing came)."""
        connection, lists = self.run.connection, [self.own_requests, self.run.keys.seed("requests")]
        first = connection.blpop(lists, timeout=wait)  # this server's own list first
        if first is None:
            return 0
        requests: list[_Request] = []
        self.batch.clear()
        held = self._take([_as_bytes(first[1])], requests)
        deadline = time.monotonic() + self.delay
        while held < self.batch_size:
            more = self._pop_more(lists, self.batch_size - held)
            if more:
                held += self._take(more, requests)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            # poll rather than BLPOP: Redis notices a blocked client's timeout only at its next event-loop wake-up,
            # up to 1/hz (100 ms by default) late, which would stretch short delays many times over
            time.sleep(min(remaining, DELAY_POLL_SECONDS))
        if not requests:
            return 0
        return self._answer(requests, "full" if held >= self.batch_size else "delay")

    def _pop_more(self, lists: list[str], count: int) -> list[bytes]:
        """Up to ``count`` requests off the first of ``lists`` that holds any."""
        for key in lists:
            more = self.run.connection.lpop(key, count)
            if isinstance(more, list) and more:
                return [_as_bytes(blob) for blob in more]
        return []

    def _take(self, blobs: list[bytes], requests: list[_Request]) -> int:
        """Add to ``requests``, and their observations to the batch, the signed requests among ``blobs`` whose
        observations are shaped like the first request's; returns how many observations it added."""
        added = 0
        for blob in blobs:
            try:
                arrays, metadata = unseal(blob, self.run.message_key)
                reply, request_id = metadata["reply"], metadata["id"]
                observations = self._observations(arrays, metadata)
            except FramesMissing:
                self._answer_missing(reply, request_id)
                continue
            except (SignatureError, RecordError, KeyError, ValueError, TypeError) as error:
                self.run.refuse(f"{self.server_id}: dropping a request that is not a signed observation: {error}")
                continue
            shape = self.batch.observation_shape
            if len(observations.shape) < 1 or 0 in observations.shape or (
                    shape is not None and observations.shape[1:] != shape):
                self.run.refuse(f"{self.server_id}: dropping a request of observations shaped {observations.shape}, "
                                f"expected (N, {', '.join(map(str, shape or ('...',)))})")
                continue
            self.batch.add(observations)  # gathered now: the client's next request may reuse its frames' slots
            requests.append(_Request(reply, request_id, len(observations)))
            added += len(observations)
        return added

    def _observations(self, arrays: dict[str, np.ndarray],
                      metadata: dict[str, str]) -> np.ndarray | RebuiltObservations:
        """A request's observations: as sent, or rebuilt from its frames and those held for its client (the
        client's requests are numbered)."""
        if "frame_source" in arrays:
            return self.held_frames.rebuild(metadata["client"], int(metadata["id"]), arrays)
        return arrays["obs"]

    def _answer_missing(self, reply: str, request_id: str) -> None:
        """Tell a client that its request relied on frames not held here: it sends it again, whole."""
        self.missing += 1
        answer = {"id": request_id, "missing": "1", "server": self.server_id}
        with self.run.connection.pipeline(transaction=False) as pipe:
            pipe.rpush(reply, seal({}, answer, self.run.message_key))
            pipe.expire(reply, REPLY_TTL_SECONDS)
            pipe.hincrby(self.run.keys.seed("stats"), "requests_missing", 1)
            pipe.execute()

    def _answer(self, requests: list[_Request], reason: str) -> int:
        """Forward passes of up to ``batch_size`` observations over all of ``requests``, one reply to each."""
        obs = self.batch.view()
        chunks = range(0, len(obs), self.batch_size)
        with torch.no_grad():
            # float32 whatever came (uint8 images travel as they are): what the network is given everywhere
            q_values = np.concatenate([self.model(torch.as_tensor(obs[start:start + self.batch_size],
                                                                  device=self.device).float()).float().cpu().numpy()
                                       for start in chunks])
        batch_sizes = np.array([min(self.batch_size, len(obs) - start) for start in chunks], np.int32)
        row_batch = np.repeat(batch_sizes, batch_sizes)  # the size of the forward pass that answered each row
        self.batches[reason] += len(batch_sizes)
        answer: dict[str, Any] = {"version": str(self.version), "reason": reason, "server": self.server_id}
        with self.run.connection.pipeline(transaction=False) as pipe:
            row = 0
            for request in requests:
                rows = slice(row, row + request.rows)
                row = rows.stop
                pipe.rpush(request.reply, seal({"q": q_values[rows], "batch_size": row_batch[rows]},
                                               {**answer, "id": request.request_id}, self.run.message_key))
                pipe.expire(request.reply, REPLY_TTL_SECONDS)
            pipe.hincrby(self.run.keys.seed("stats"), f"batches_{reason}", len(batch_sizes))
            pipe.hincrby(self.run.keys.seed("stats"), "inferences", len(obs))
            pipe.hincrby(self.run.keys.seed("stats"), "requests", len(requests))
            pipe.execute()
        return len(obs)


@dataclass(frozen=True)
class _Request:
    """One decoded request: where to reply, its id, how many observations (rows of the batch) it asked about."""

    reply: str
    request_id: str
    rows: int


class ObservationBatch:
    """The observations of the batch a server gathers: each request's are written once, into one array kept from
    batch to batch (concatenating them at the end made a copy more, into an array more per batch)."""

    def __init__(self) -> None:
        self._array: np.ndarray = np.empty(0, np.uint8)
        self.rows = 0

    @property
    def observation_shape(self) -> tuple[int, ...] | None:
        """The shape of one observation of the batch; None while it is empty."""
        return tuple(self._array.shape[1:]) if self.rows else None

    def add(self, observations: np.ndarray | RebuiltObservations) -> None:
        """Append ``observations`` ``(N, *obs_shape)`` (of the batch's shape once it holds any), widening the
        batch's dtype where they need it, as ``np.concatenate`` would."""
        end = self.rows + len(observations)
        dtype = np.result_type(self._array.dtype, observations.dtype) if self.rows else observations.dtype
        if len(self._array) < end or self._array.dtype != dtype or self._array.shape[1:] != observations.shape[1:]:
            same_kind = self._array.shape[1:] == observations.shape[1:] and self._array.dtype == dtype
            grown = np.empty((max(end, 2 * len(self._array)) if same_kind else end, *observations.shape[1:]), dtype)
            if self.rows:
                grown[:self.rows] = self._array[:self.rows]
            self._array = grown
        target = self._array[self.rows:end]
        if isinstance(observations, RebuiltObservations):
            observations.write(target)
        else:
            target[...] = observations
        self.rows = end

    def view(self) -> np.ndarray:
        """The batch's observations ``(rows, *obs_shape)``: a view, valid until the next ``clear``."""
        return self._array[:self.rows]

    @property
    def capacity(self) -> int:
        """Observations the batch holds without growing."""
        return len(self._array)

    def clear(self) -> None:
        """Empty the batch for the next one; an array grown far past the batch just answered (after one huge
        request) is let go rather than kept from batch to batch."""
        if self._array.nbytes > SHRINK_BATCH_BYTES and len(self._array) > 4 * self.rows:
            self._array = np.empty(0, np.uint8)
        self.rows = 0


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
    from rqrl.engine.connection import connect
    from rqrl.engine.memory import keep_freed_memory
    from rqrl.engine.process import exit_when_orphaned

    if learner_pid is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's to handle: it stops us
        exit_when_orphaned(learner_pid)
    keep_freed_memory()  # a server's buffers per batch: no page faults (rqrl.engine.memory)
    logging.basicConfig(level=logging.WARNING)
    run = SeedRun.attach(connect(redis_url), RunKeys(run_name), secret)
    settings = run.settings()
    torch.set_num_threads(settings["inference_threads"])
    model = run.load("model")()
    server = InferenceServer(run, model, f"server-{server_index}.{os.getpid()}", settings["inference_batchsize"],
                             settings["inference_delay"], settings["inference_device"], settings["broadcast_period"])
    server.run_forever()
