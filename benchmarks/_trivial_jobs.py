"""Job functions for ``benchmarks/worker_overhead.py``; tiny on purpose so a worker imports them cheaply."""


def noop() -> None:
    """A job that does nothing: what is left of its run time is the worker's per-job overhead."""
    return None
