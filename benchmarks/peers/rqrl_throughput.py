"""rqrl's ``collect_outputs`` and the reference, measured by benchmarks/actors_throughput.py, as peer-style JSON lines.

``--system rqrl`` runs ``SubprocDistributedActors.collect_outputs`` (private redis-server, W local RQ workers,
E actors per worker); ``--system reference`` runs W plain processes, each a ``SyncVectorEnv(E)`` stepped with one
batched forward and numpy sampling, no transport. Both are actors_throughput.py's own measurements (its
``measure``), so run.py's numbers are the same as that script's. Run with the project's venv and the repository
root on PYTHONPATH::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/peers/rqrl_throughput.py --system rqrl --envs-per-worker 8 32

``--workload atari`` runs both on ALE/Pong-v5 with the standard preprocessing (benchmarks/frame_bytes.py's
``atari_factory``, what ``rqrl train`` makes: uint8 (4, 84, 84) stacks) and benchmarks/image_obs.py's ConvPolicy
over Pong's 6 actions, by image_obs.py's own measurements (its ``measure_rqrl`` and ``measure_reference``).
rqrl's workers send each rollout's frame stacks as their unique frames, zstd-compressed.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

import harness

import rqrl
from benchmarks import actors_throughput, frame_bytes, image_obs

PATHS = {
    "rqrl": "SubprocDistributedActors.collect_outputs (Redis + RQ workers)",
    "reference": "W plain processes x SyncVectorEnv(E), batched forward, numpy sampling, no transport",
}


def add_system(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--system", choices=sorted(PATHS), default="rqrl", help="what to measure")


def measure_atari(system: str, args: argparse.Namespace, envs_per_worker: int) -> harness.Measured:
    options = image_obs.parse_args(["--seconds", str(args.seconds), "--warmup", str(args.warmup), "--workers",
                                    str(args.workers), "--rollout-steps", str(args.rollout_steps), "--layout", "first"])
    side = image_obs.measure_rqrl if system == "rqrl" else image_obs.measure_reference
    measured = side(args.workers, envs_per_worker, options, frame_bytes.atari_factory(harness.ATARI_ID),
                    harness.ATARI_ACTIONS)
    return measured.steps, measured.seconds, measured.own_cpu_seconds


def measure(system: str) -> Callable[[argparse.Namespace, int], harness.Measured]:
    def run(args: argparse.Namespace, envs_per_worker: int) -> harness.Measured:
        if args.workload == "atari":
            return measure_atari(system, args, envs_per_worker)
        options = actors_throughput.parse_args([
            "--seconds", str(args.seconds), "--warmup", str(args.warmup), "--workers", str(args.workers),
            "--actors-per-worker", str(envs_per_worker), "--rollout-steps", str(args.rollout_steps),
            "--quiet-wait", "0",
        ])
        measured = actors_throughput.measure(system, args.workers, envs_per_worker, options)
        cpu = measured.cpu_seconds
        return measured.steps, measured.seconds, cpu and cpu["learner"] + cpu["workers"] + cpu["redis"]

    return run


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING)
    probe = argparse.ArgumentParser(add_help=False)
    add_system(probe)
    system = probe.parse_known_args(argv)[0].system
    harness.main(system, PATHS[system], lambda: harness.versions(rqrl=rqrl.__version__), measure(system),
                 __doc__.split("\n\n")[0], argv, extra=add_system, workloads=("cartpole", "atari"))


if __name__ == "__main__":
    main()
