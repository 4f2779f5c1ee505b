"""Redis commands written now and their replies read later, so a worker steps envs instead of idling on a round trip.

The commands go out on a connection of their own, taken from the client's pool; the replies are read when the
caller needs them (``read``), or never (``abandon``: the connection is closed). Either way the connection goes
back to its pool once. A lost connection is not an error here: ``send`` returns None and ``read`` returns None,
and the caller falls back to its waiting path.

What is worth sending ahead is the caller's to judge: a rollout job sends its entries ahead only while the queue
has had room, since a push into a full queue is refused and its payload sent again (``rqrl.maze.jobs``).
"""

from __future__ import annotations

import logging
from typing import Any

import redis

log = logging.getLogger(__name__)

_SEND_ERRORS = (redis.RedisError, OSError)  # no connection, a failed handshake or write: take the waiting path


class SentCommands:
    """Commands sent on a pooled connection whose replies are still to be read."""

    def __init__(self, pool: redis.ConnectionPool, connection: redis.Connection):
        self._pool: redis.ConnectionPool | None = pool
        self._connection = connection

    @classmethod
    def send(cls, client: redis.Redis, commands: list[tuple[Any, ...]]) -> SentCommands | None:
        """Write ``commands`` without waiting; None, having sent nothing usable, when no connection takes them."""
        pool = client.connection_pool
        try:
            connection = pool.get_connection()
        except _SEND_ERRORS as error:
            log.debug("no connection to send %s on (%s)", commands[0][0], error)
            return None
        try:
            connection.send_packed_command(connection.pack_commands(commands))  # type: ignore[no-untyped-call]
        except BaseException as error:
            connection.disconnect()  # type: ignore[no-untyped-call]
            pool.release(connection)
            if not isinstance(error, _SEND_ERRORS):
                raise
            log.debug("sending %s failed (%s)", commands[0][0], error)
            return None
        return cls(pool, connection)

    def read(self, count: int) -> list[Any] | None:
        """The next ``count`` replies (an error reply as its exception object, not raised), or None when they
        were lost: the connection failed or sent what is no reply (it is then closed). Reads once: later calls
        return None."""
        if self._pool is None:
            return None
        replies = []
        try:
            for _ in range(count):
                try:
                    replies.append(self._connection.read_response())
                except redis.ResponseError as error:
                    replies.append(error)
        except _SEND_ERRORS as error:  # the connection failed, or sent what is not a reply
            log.debug("a sent command's reply was lost (%s)", error)
            self.abandon()
            return None
        except BaseException:
            self.abandon()
            raise
        self._pool.release(self._connection)
        self._pool = None
        return replies

    def abandon(self) -> None:
        """Close the connection without reading the replies (the caller no longer needs them)."""
        if self._pool is not None:
            self._connection.disconnect()  # type: ignore[no-untyped-call]
            self._pool.release(self._connection)
            self._pool = None
