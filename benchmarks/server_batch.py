"""An inference server's CPU per observation to turn a batch of actor processes' requests into one batch of
observations, for one or more checkouts of rqrl side by side (``--impl DIR``, as ``rollout_loop.py`` does).

Each step, ``--clients`` actor processes (each its own ``--threads`` envs' 84x84x4 stacks) send one request: whole
stacks, or the frames the server lacks (``rqrl.seed.request_frames``). The server unseals them and makes the batch:
a checkout with ``rqrl.seed.inference.ObservationBatch`` gathers each request straight into it (2026-11-28 on), an
older one rebuilds each request's stacks and concatenates them, as its server did. The least time of ``--repeats``
runs counts; every batch is checked against the observations asked about. Each checkout runs in a child process
of its own, the checkouts alternating over ``--rounds``. From the repository root::

    git worktree add /tmp/rqrl-base b010aa9
    PYTHONPATH=$PWD python benchmarks/server_batch.py --impl /tmp/rqrl-base --impl . --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

KEY = b"benchmark key of 32 bytes, fixed"


def child(source: str, clients: int, threads: int, steps: int, repeats: int) -> dict[str, float]:
    """us per observation of this checkout's server, whole and frames: runs in the checkout's own process."""
    import numpy as np

    from benchmarks.request_frames import pong_stacks, random_stacks  # the checkout's own (both have them)
    from rqrl.seed.request_frames import HeldFrames, SentFrames
    from rqrl.seed.store import seal, unseal

    try:
        from rqrl.seed.inference import ObservationBatch
    except ImportError:  # before 2026-11-28: stacks rebuilt per request, then concatenated
        ObservationBatch = None  # noqa: N806
    make = pong_stacks if source == "pong" else random_stacks
    stacks = [make(threads, steps, seed) for seed in range(clients)]
    results = {}
    for frames in (False, True):
        requests = []
        for client_stacks in stacks:
            client, blobs = SentFrames(), []
            for number, step in enumerate(client_stacks):
                arrays = client.request(step, number)[0] if frames else {"obs": step}
                blobs.append(seal(arrays, {"reply": "r", "id": str(number)}, KEY))
                client.answered("server", number)
            requests.append(blobs)
        runs = []
        for _ in range(repeats):
            held, seconds = HeldFrames(), 0.0
            batch = ObservationBatch() if ObservationBatch is not None else None
            for number in range(steps):
                started = time.perf_counter()
                parts = []
                if batch is not None:
                    batch.clear()
                for client, blobs in enumerate(requests):
                    arrays = unseal(blobs[number], KEY)[0]
                    if batch is not None:
                        batch.add(held.rebuild(f"c{client}", number, arrays) if frames else arrays["obs"])
                    else:
                        parts.append(held.observations(f"c{client}", number, arrays) if frames else arrays["obs"])
                made = batch.view() if batch is not None else np.concatenate(parts)
                seconds += time.perf_counter() - started
                assert all((made[client * threads:(client + 1) * threads] == client_stacks[number]).all()
                           for client, client_stacks in enumerate(stacks))
            runs.append(seconds)
        results["frames" if frames else "whole"] = min(runs) * 1e6 / (steps * clients * threads)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", action="append", default=None, help="A checkout's root (repeatable; default: .).")
    parser.add_argument("--clients", type=int, default=8, help="Actor processes whose requests a batch holds.")
    parser.add_argument("--threads", type=int, default=16, help="Envs (observations) per request.")
    parser.add_argument("--steps", type=int, default=60, help="Batches (one request per client each).")
    parser.add_argument("--repeats", type=int, default=3, help="Runs per measurement (the least time counts).")
    parser.add_argument("--rounds", type=int, default=1, help="Rounds, the checkouts alternating.")
    parser.add_argument("--sources", nargs="+", default=["pong", "random"], choices=["pong", "random"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        print(json.dumps(child(arguments.child, arguments.clients, arguments.threads, arguments.steps,
                               arguments.repeats)))
        return
    impls = arguments.impl or ["."]
    figures: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _ in range(arguments.rounds):
        for source in arguments.sources:
            for impl in impls:
                command = [sys.executable, __file__, "--child", source, "--clients", str(arguments.clients),
                           "--threads", str(arguments.threads), "--steps", str(arguments.steps),
                           "--repeats", str(arguments.repeats)]
                environment = {**os.environ, "PYTHONPATH": os.path.abspath(impl)}
                out = subprocess.run(command, env=environment, capture_output=True, text=True, check=True).stdout
                figures.setdefault((source, impl), []).append(json.loads(out.strip().splitlines()[-1]))
    print(f"\n{arguments.clients} clients x {arguments.threads} envs a batch, 84x84x4 stacks; server us per "
          f"observation (unseal, rebuild, batch), median of {arguments.rounds} round(s)\n")
    print("| frames | checkout | whole stacks | frames the server lacks |")
    print("|:--|:--|--:|--:|")
    for (source, impl), rounds in figures.items():
        whole = statistics.median(run["whole"] for run in rounds)
        frames = statistics.median(run["frames"] for run in rounds)
        print(f"| {source} | {impl} | {whole:.2f} | {frames:.2f} |", flush=True)


if __name__ == "__main__":
    main()
