"""The worker's log of a Redis that vanished while it stopped: one line, not a screen of chained tracebacks."""

from __future__ import annotations

import logging
import sys

import redis

from rqrl.engine import worker


def rq_record(name: str, error: BaseException) -> logging.LogRecord:
    """The record RQ's work loop logs for an unhandled exception, with ``error`` as the one being handled."""
    try:
        raise error
    except BaseException:
        exc_info = sys.exc_info()
    return logging.LogRecord("rq.worker", logging.ERROR, __file__, 1,
                             "Worker %s: found an unhandled exception, quitting...", (name,), exc_info)


def test_a_stopping_workers_redis_outage_is_logged_in_one_line(monkeypatch):
    monkeypatch.setattr(worker, "_stopping", {"w1"})
    record = rq_record("w1", redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. 100% refused."))
    assert worker._OneLineOutageOnStop().filter(record)
    assert record.exc_info is None
    assert record.getMessage() == ("Worker w1: found an unhandled exception, quitting... (ConnectionError: Error 111 "
                                   "connecting to 127.0.0.1:1. 100% refused.)")


def test_other_errors_and_running_workers_keep_their_traceback(monkeypatch):
    monkeypatch.setattr(worker, "_stopping", {"w1"})
    for record in (rq_record("w1", ValueError("a bug")), rq_record("w2", redis.ConnectionError("gone"))):
        assert worker._OneLineOutageOnStop().filter(record)
        assert record.exc_info is not None, record.getMessage()
        assert record.getMessage().endswith("quitting...")
