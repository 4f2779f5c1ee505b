"""Inference requests of images send each frame once: a frame the server already holds for the client goes as
where it is held.

An actor thread's next observation is its last one shifted by a frame, so of a 4-frame stack's 28 KB only one
frame is new at each step. The server keeps, for each client (an actor process), the distinct frames of the
last HELD_REQUESTS requests it answered for it, in the order the request listed them (``HeldFrames``). The
client finds a request's distinct frames by their digests (``rqrl.engine.unique_frames``), mirrors what that
server holds (``SentFrames``) and sends only the frames it lacks; for each of the others, the number of the
earlier request that held it and its position there (two small integers, where a digest would be 16 bytes
that do not compress), and an index that rebuilds the stacks.

Such a request relies on one server, so it goes onto that server's own list (``seed:requests:{server}``, which
the server pops before the shared one); a request that carries every frame goes onto the shared list, to
whichever server is free. Nothing is lost when the two sides disagree (a server restarted, or dropped an idle
client): the server answers that it lacks frames and the client sends the request again, whole, to the shared
list (a server that stops answers what waits on its own list that way). Every REBALANCE_REQUESTS requests a
client sends one whole to the shared list anyway, so clients that all stuck to the first server up drift to the
free ones.

>>> frames = np.arange(5, dtype=np.uint8)[:, None, None] + np.zeros((5, 6, 6), np.uint8)
>>> stacks = np.stack([frames[t:t + 4] for t in range(2)])  # two steps of one env, a new frame each
>>> client, server = SentFrames(), HeldFrames()
>>> first, _ = client.request(stacks[:1], 0)
>>> len(first["frames"]), bool((server.observations("c", 0, first) == stacks[:1]).all())
(4, True)
>>> client.answered("server-0", 0)
>>> second, to_server = client.request(stacks[1:], 1)
>>> len(second["frames"]), to_server  # one new frame; the other three are request 0's frames 1 to 3
(1, 'server-0')
>>> second["frame_source"].tolist()
[[0, 1], [0, 2], [0, 3], [-1, -1]]
>>> bool((server.observations("c", 1, second) == stacks[1:]).all())
True
"""

from __future__ import annotations

import math
import time
from collections import deque

import numpy as np

from rqrl.engine.compression import MAX_DECOMPRESSED_BYTES
from rqrl.engine.unique_frames import as_frames, check_frame_index, unique_frames
from rqrl.errors import RecordError

HELD_REQUESTS = 4
"""Requests per client whose frames a server holds: an actor's threads do not all ask in every request (a thread
still stepping misses one), so a thread's last observation may be a few requests back. A server's memory for a
client is that many requests' distinct frames: 1.8 MB for 16 threads of Atari stacks."""
REBALANCE_REQUESTS = 64
"""A client sends every this many-th request (of those it sends, re-sends counted) whole, to any server (about
1.5% more frame bytes at 4-frame stacks)."""
MAX_REQUEST_NUMBER = 2**62
"""Request numbers a server takes are below this (a client counts from 0); the held requests' table stores them
as int64, and -1 marks its free rows."""
COMPACT_SLOTS = 1024
"""A client's pool of more slots than this, four times or more those its held requests list, is compacted."""
IDLE_CLIENT_SECONDS = 60.0
"""A server drops the frames of a client it has not heard from for this long (the client died, or moved)."""
__all__ = ["HELD_REQUESTS", "REBALANCE_REQUESTS", "FramesMissing", "HeldFrames", "RebuiltObservations", "SentFrames"]


class FramesMissing(Exception):
    """A request relies on frames this server does not hold (any more) for its client: it must come again whole."""


class SentFrames:
    """A client's side: which server holds which of its frames, and the arrays of a request that relies on them."""

    def __init__(self) -> None:
        self.server: str | None = None
        self._held: deque[tuple[int, list[bytes]]] = deque(maxlen=HELD_REQUESTS)
        self._where: dict[bytes, tuple[int, int]] = {}  # digest -> (request number, position) of a held frame
        self._asked: tuple[int, list[bytes]] | None = None  # the last request made, until it is answered
        self._requests = 0

    def request(self, observations: np.ndarray, number: int) -> tuple[dict[str, np.ndarray], str | None]:
        """The arrays of request ``number`` (the client's count, kept when it is sent again) of ``observations``
        (images), and the server whose list it must go onto (None: the shared list; every frame is in it)."""
        self._requests += 1
        if self._requests % REBALANCE_REQUESTS == 0:
            self.forget()
        found = unique_frames(as_frames(observations))
        where = self._where
        source = np.fromiter((part for key in found.keys for part in where.get(key, _SENT)), np.int32,
                             2 * len(found.keys)).reshape(-1, 2)
        sent = source[:, 0] < 0
        self._asked = (number, found.keys)
        arrays = {"frames": found.frames[sent], "frame_source": source,
                  "frame_index": found.frame_index.reshape(len(observations), -1)}
        return arrays, None if sent.all() else self.server

    def answered(self, server: str, number: int) -> None:
        """``server`` answered request ``number``: it now holds that request's frames."""
        if self._asked is None or self._asked[0] != number:
            return
        if server != self.server:
            self.forget()
            self.server = server
        if len(self._held) == self._held.maxlen:  # the server drops its oldest request's frames: so does this
            dropped, keys = self._held.popleft()
            for key in keys:
                if self._where.get(key, _SENT)[0] == dropped:
                    del self._where[key]
        number, keys = self._asked
        self._held.append(self._asked)
        self._where.update((key, (number, position)) for position, key in enumerate(keys))

    def forget(self) -> None:
        """Rely on no server's frames (its answer said it lacks some, or it did not answer in time)."""
        self.server = None
        self._held.clear()
        self._where = {}


class RebuiltObservations:
    """A request's observations as they lie in its client's frame pool on the server, gathered once: into the
    server's batch (``write``) or a new array (``array``), before the client's next request is rebuilt (which may
    reuse the slots of frames no held request lists any more)."""

    def __init__(self, pool: np.ndarray, slots: np.ndarray):
        self._pool = pool
        self._slots = slots[:, 0] if slots.shape[1] == 1 else slots  # one frame per observation: no stack axis
        self.shape = (*self._slots.shape, *pool.shape[1:])
        self.dtype = pool.dtype

    def __len__(self) -> int:
        return len(self._slots)

    def write(self, out: np.ndarray) -> None:
        """Gather the observations into ``out`` (shaped ``self.shape``, of ``self.dtype``): one copy of each."""
        if out.dtype != self.dtype:  # a batch of wider observations (requests of another kind in it)
            out[...] = self.array()
            return
        np.take(self._pool, self._slots, axis=0, out=out, mode="clip")  # "clip": the slots were checked; unbuffered

    def array(self) -> np.ndarray:
        return np.take(self._pool, self._slots, axis=0)


class HeldFrames:
    """A server's side: the frames of each client's last HELD_REQUESTS requests, which rebuild its next ones. Each
    client's frames lie in a pool of its own, each written once when it arrives, and its observations are gathered
    from the pool straight into the server's batch: one copy per observation, where rebuilding the request's
    distinct frames and then its stacks made two."""

    def __init__(self, idle_seconds: float = IDLE_CLIENT_SECONDS):
        self.idle_seconds = idle_seconds
        self._clients: dict[str, _ClientFrames] = {}
        self._swept = time.monotonic()

    @property
    def clients(self) -> int:
        return len(self._clients)

    @property
    def pool_bytes(self) -> int:
        """The bytes of the clients' frame pools, free slots included."""
        return sum(held.pool.nbytes for held in self._clients.values())

    def observations(self, client: str, number: int, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """The observations ``[B, *obs]`` that request ``number`` of ``client`` rebuilds, as a new array; as
        ``rebuild``."""
        return self.rebuild(client, number, arrays).array()

    def rebuild(self, client: str, number: int, arrays: dict[str, np.ndarray]) -> RebuiltObservations:
        """The observations that request ``number`` of ``client`` rebuilds, its frames then held for the client's
        next ones; FramesMissing if it relies on frames not held, RecordError if its arrays do not fit (then
        nothing is held or changed)."""
        if not 0 <= number < MAX_REQUEST_NUMBER:
            raise RecordError(f"a request numbered {number}: clients number their requests 0, 1, 2, ...")
        source, frames, index = _checked(arrays)
        check_frame_index(index, frames, len(source))
        now = time.monotonic()
        sent = source[:, 0] < 0
        held = self._clients.get(client)
        if held is not None:
            held.compact_if_sparse()
        if held is None or not held.fits(frames):  # a first request, or one of frames of another kind
            if sent.all():
                held = _ClientFrames(frames)
            elif held is None:
                raise FramesMissing(f"request {int(source[~sent, 0].min())}")
            else:
                raise RecordError(f"a request's frames are {frames.dtype}{list(frames.shape[1:])}, its client's "
                                  f"earlier ones {held.pool.dtype}{list(held.pool.shape[1:])}")
        slots = held.slots_of(source, sent)  # checked before anything changes
        slots[sent] = held.store(frames)
        held.hold(number, slots)
        held.seen = now
        self._clients[client] = held
        self._sweep(now)
        return RebuiltObservations(held.pool, slots[index])

    def _sweep(self, now: float) -> None:
        """Drop the clients not heard from for ``idle_seconds`` (looked at once per ``idle_seconds``)."""
        if now - self._swept < self.idle_seconds:
            return
        self._swept = now
        for client in [client for client, held in self._clients.items() if now - held.seen > self.idle_seconds]:
            del self._clients[client]


class _ClientFrames:
    """One client's frames on a server: a pool of slots, how many held requests list each slot, and for each held
    request (up to HELD_REQUESTS, in the order the client counts them) the slots of its distinct frames, a row of
    a table each. A slot no held request lists is free for the next frame that arrives."""

    def __init__(self, like: np.ndarray):
        self.pool = np.empty((0, *like.shape[1:]), like.dtype)
        self.uses = np.zeros(0, np.intp)
        self.free = np.zeros(0, np.intp)
        self._order: deque[int] = deque()  # the held requests' rows, oldest first
        self.seen = 0.0
        self._table = np.zeros((HELD_REQUESTS + 1, 0), np.intp)  # a row per held request: its frames' slots
        self._numbers = np.full(HELD_REQUESTS + 1, -1, np.int64)  # each row's request number (-1: none)
        self._lengths = np.zeros(HELD_REQUESTS + 1, np.intp)

    def fits(self, frames: np.ndarray) -> bool:
        return frames.shape[1:] == self.pool.shape[1:] and frames.dtype == self.pool.dtype

    def slots_of(self, source: np.ndarray, sent: np.ndarray) -> np.ndarray:
        """The slots of a request's frames held here (-1 for those it carries); FramesMissing if one of the
        requests it relies on is not held (any more), RecordError if it points outside one."""
        slots = np.full(len(source), -1, np.intp)
        if sent.all():
            return slots
        numbers, positions = source[~sent, 0], source[~sent, 1]
        match = numbers[:, None] == self._numbers
        rows = match.argmax(1)
        if not match[np.arange(len(rows)), rows].all():
            raise FramesMissing(f"request {int(numbers[~match.any(1)][0])}")
        if int(positions.min()) < 0 or (positions >= self._lengths[rows]).any():
            raise RecordError(f"a request points outside the frames of its client's requests "
                              f"{sorted(set(numbers.tolist()))}")
        slots[~sent] = self._table[rows, positions]
        return slots

    def store(self, frames: np.ndarray) -> np.ndarray:
        """Write ``frames`` into free slots, growing the pool if too few are free; their slots."""
        if len(self.free) < len(frames):
            self._grow(len(frames) - len(self.free))
        slots, self.free = self.free[:len(frames)], self.free[len(frames):]
        self.pool[slots] = frames
        return slots

    def hold(self, number: int, slots: np.ndarray) -> None:
        """Hold request ``number``'s frames: in its place if it came before (sent again), so the requests held stay
        the ones its client counts on, else as the newest, dropping the oldest past HELD_REQUESTS."""
        self.uses += np.bincount(slots, minlength=len(self.uses))  # first: frames shared with a dropped one stay
        copy_of = np.flatnonzero(self._numbers == number)
        if len(copy_of):  # a copy: its row takes the new slots, and the old ones are let go
            row = int(copy_of[0])
            self._release(row)
        else:
            row = int(np.flatnonzero(self._numbers < 0)[0])  # one row is always spare
            self._order.append(row)
        if len(slots) > self._table.shape[1]:
            self._table = np.concatenate([self._table, np.zeros((len(self._table), len(slots) - self._table.shape[1]),
                                                                np.intp)], axis=1)
        self._table[row, :len(slots)] = slots
        self._numbers[row], self._lengths[row] = number, len(slots)
        if len(self._order) > HELD_REQUESTS:
            oldest = self._order.popleft()
            self._release(oldest)
            self._numbers[oldest] = -1

    def _release(self, row: int) -> None:
        """The held request in ``row`` no longer lists its slots: those no other held request lists are free."""
        listed = np.bincount(self._table[row, :self._lengths[row]], minlength=len(self.uses))
        self.uses -= listed
        self.free = np.concatenate([self.free, np.flatnonzero((self.uses == 0) & (listed > 0))])

    def compact_if_sparse(self) -> None:
        """Keep only the slots the held requests list once they are a quarter of the pool or less (a request far
        bigger than the client's others has left): the pool, counts and table would otherwise stay at their peak,
        and cost each request a pass over them. Before a request is rebuilt, never between a rebuild and its
        gather: the slots change."""
        if len(self.pool) <= COMPACT_SLOTS or len(self.pool) <= 4 * int(np.count_nonzero(self.uses)):
            return
        used = np.flatnonzero(self.uses)
        moved = np.full(len(self.pool), -1, np.intp)
        moved[used] = np.arange(len(used))
        self.pool, self.uses, self.free = self.pool[used], self.uses[used], np.zeros(0, np.intp)
        held_rows = np.flatnonzero(self._numbers >= 0)
        table = np.zeros((len(self._table), int(self._lengths[held_rows].max(initial=0))), np.intp)
        for row in held_rows.tolist():
            length = self._lengths[row]
            table[row, :length] = moved[self._table[row, :length]]
        self._table = table

    def _grow(self, needed: int) -> None:
        size = len(self.pool)
        grown = np.empty((max(2 * size, size + needed, 16), *self.pool.shape[1:]), self.pool.dtype)
        grown[:size] = self.pool
        self.pool = grown
        self.uses = np.concatenate([self.uses, np.zeros(len(grown) - size, np.intp)])
        self.free = np.concatenate([self.free, np.arange(size, len(grown))])


_SENT = (-1, -1)
"""The source of a frame the request carries itself."""


def _checked(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A request's frame sources, its frames and its index; RecordError unless they fit each other."""
    try:
        source, frames, index = (arrays[name] for name in ("frame_source", "frames", "frame_index"))
    except KeyError as error:
        raise RecordError(f"a request of frames lacks its {error} array; are actors and servers the same rqrl "
                          f"version?") from None
    if source.dtype.kind != "i" or source.ndim != 2 or source.shape[1] != 2 or frames.ndim < 2 \
            or frames.dtype != np.uint8 or len(frames) != int((source[:, 0] < 0).sum()):
        raise RecordError(f"a request's frames do not fit their sources: {source.dtype}{list(source.shape)} sources "
                          f"and {frames.dtype}{list(frames.shape)} frames; expected [distinct frames, 2] integers, "
                          f"(-1, -1) for each uint8 frame the request carries")
    distinct_bytes = len(source) * math.prod(frames.shape[1:])
    if len(source) > index.size or distinct_bytes > MAX_DECOMPRESSED_BYTES:
        raise RecordError(f"a request lists {len(source)} distinct frames ({distinct_bytes / 2**20:.0f} MB) for an "
                          f"index of {index.size}: more than its observations hold, or than a message may")
    return source, frames, index
