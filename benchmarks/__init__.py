"""Benchmark scripts for rqrl (run from the repository root, e.g. ``python -m benchmarks.actors_throughput``)."""
