"""SentCommands against a real Redis: replies read later, error replies in their place, lost connections."""

from __future__ import annotations

import redis

from rqrl.engine.sent_commands import SentCommands


def test_replies_are_read_in_order_with_an_error_reply_in_its_place(connection, run_name):
    connection.set(f"{run_name}:text", "a string")
    sent = SentCommands.send(connection, [("SET", f"{run_name}:a", 1), ("HGET", f"{run_name}:text", "field"),
                                          ("INCR", f"{run_name}:a")])
    assert sent is not None
    first, error, third = sent.read(3)
    assert first is True or first == b"OK"
    assert isinstance(error, redis.ResponseError) and "WRONGTYPE" in str(error)
    assert third == 2, "the reply after the error is still read, on a connection in step with the server"
    assert sent.read(1) is None, "replies are read once"
    assert not connection.connection_pool._in_use_connections
    assert connection.get(f"{run_name}:a") == b"2"


def test_a_lost_connection_reads_as_none_and_goes_back_to_the_pool(connection, run_name):
    sent = SentCommands.send(connection, [("BLPOP", f"{run_name}:never", 5)])
    assert sent is not None
    connection.client_kill_filter(_type="normal", skipme=True)
    assert sent.read(1) is None
    assert not connection.connection_pool._in_use_connections
    assert connection.ping(), "the client's other connections still work"


def test_sending_to_a_server_that_is_gone_gives_none():
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5,
                         retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0))
    assert SentCommands.send(client, [("PING",)]) is None
    assert not client.connection_pool._in_use_connections
