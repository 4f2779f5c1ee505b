"""CPU cost per rollout record on both ends of the queue: the worker's encode+sign, the learner's
verify+decode, check and batch, next to what stepping the envs cost; and the same for the group entry
workers push (one per actor group: ``group encode+sign``, ``group decode+check``, per rollout in it).

One CartPole-v1 actor group (``--envs`` actors, ``--steps``-step rollouts, the 4-64-64-2 MLP) makes
real records in process; each stage is then timed in CPU time (best of ``--repeats``), so the
numbers hold on a busy machine. With 2 workers on 2 cores, the learner's stages take CPU the
workers' env stepping would otherwise have: their sum over the stepping cost bounds rqrl's ratio to
a reference that moves nothing.

``--checkouts A B ...`` runs the same measurement on other source trees (each in a subprocess with
that tree first on ``sys.path``), interleaved round by round, for before/after tables.

Run from the repository root::

    python benchmarks/record_cost.py --rounds 3
    python benchmarks/record_cost.py --rounds 3 --checkouts ../before .
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

STAGES = ("encode+sign", "verify+decode", "check", "batch", "env steps")
GROUP_STAGES = ("group encode+sign", "group decode+check")  # absent from trees older than rqrl.maze.group_records


def _best_cpu_seconds(function: Callable[[], object], repeats: int, calls: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(calls):
            function()
        best = min(best, (time.process_time() - started) / calls)
    return best


def _one_record_per_entry(spec: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """Encode+sign and verify+decode of one record as one entry: the single-record format of trees before issue 23,
    a group of one since (its decode checks the record against ``spec`` too)."""
    try:
        from rqrl.maze.records import decode_signed_record, encode_signed_record  # type: ignore[attr-defined]
    except ImportError:
        from rqrl.maze.group_records import decode_signed_entry, encode_signed_group

        return (lambda record, run_id, key: encode_signed_group([record], run_id, key),
                lambda blob, run_id, key: decode_signed_entry(blob, run_id, key, spec).records[0])
    return encode_signed_record, decode_signed_record


def measure(envs: int, steps: int, repeats: int) -> dict[str, float]:
    """Microseconds of CPU per record for each stage, in this process (this tree's rqrl)."""
    import torch

    from benchmarks.actors_throughput import agent_seeds, env_seeds, make_env, make_policy
    from rqrl.engine.policy import make_act_function
    from rqrl.maze.records import RecordSpec, batch_records, check_record, record_signature
    from rqrl.maze.rollout import ActorGroup

    torch.set_num_threads(1)
    group = ActorGroup(make_env, list(range(envs)), env_seeds(envs), agent_seeds(envs), steps)
    act = make_act_function(make_policy(), group.action_space)
    records = list(group.run(act, 0, policy_version=1, cut_at_end=False))
    key = b"k" * 32
    spec = RecordSpec(n_steps=steps, n_actors=envs, signature=record_signature(records[0]), action_bounds=(0, 2))
    encode_signed_record, decode_signed_record = _one_record_per_entry(spec)
    blobs = [encode_signed_record(record, "run", key) for record in records]
    decoded = [decode_signed_record(blob, "run", key) for blob in blobs]
    stages: dict[str, Callable[[], object]] = {
        "encode+sign": lambda: [encode_signed_record(record, "run", key) for record in records],
        "verify+decode": lambda: [decode_signed_record(blob, "run", key) for blob in blobs],
        "check": lambda: [check_record(record, spec) for record in decoded],
        "batch": lambda: batch_records(decoded, "cpu"),
        "env steps": lambda: group.run(act, 1, policy_version=1, cut_at_end=False),
    }
    try:
        from rqrl.maze.group_records import decode_signed_entry, encode_signed_group
    except ImportError:  # a --checkouts tree from before group entries
        pass
    else:
        group_blob = encode_signed_group(records, "run", key)
        stages["group encode+sign"] = lambda: encode_signed_group(records, "run", key)
        stages["group decode+check"] = lambda: decode_signed_entry(group_blob, "run", key, spec)
    result = {}
    for name, function in stages.items():
        calls = 2 if name == "env steps" else 10
        result[name] = 1e6 * _best_cpu_seconds(function, repeats, calls) / envs
    group.close()
    return result


def _measure_in(checkout: str, args: argparse.Namespace) -> dict[str, float]:
    """measure() in a subprocess whose rqrl is ``checkout``'s."""
    root = os.path.abspath(checkout)
    # rqrl is imported from the checkout first; the benchmarks package then comes from this tree
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import rqrl; sys.path.insert(0, sys.argv[2]); "
            "from benchmarks.record_cost import measure; "
            "print(json.dumps(measure(int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))))")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    completed = subprocess.run([sys.executable, "-c", code, root, here, str(args.envs), str(args.steps),
                                str(args.repeats)], env=env, capture_output=True, text=True)
    if completed.returncode != 0:
        raise SystemExit(f"measuring {checkout} failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def print_table(args: argparse.Namespace, results: dict[str, list[dict[str, float]]]) -> None:
    print()
    print(f"## CPU per record: CartPole-v1, {args.steps}-step rollouts, group of {args.envs} envs, "
          f"best of {args.repeats}, medians of {args.rounds} round(s) (microseconds per record)")
    print()
    print("| tree | " + " | ".join(STAGES + GROUP_STAGES) + " | learner total | (encode + learner) / env steps "
          "| group: (encode + learner) / env steps |")
    print("|:--|" + "--:|" * (len(STAGES) + len(GROUP_STAGES) + 3))
    for tree, rounds in results.items():
        middle = {stage: statistics.median(r.get(stage, float("nan")) for r in rounds)
                  for stage in STAGES + GROUP_STAGES}
        learner = middle["verify+decode"] + middle["check"] + middle["batch"]
        share = statistics.median((r["encode+sign"] + r["verify+decode"] + r["check"] + r["batch"]) / r["env steps"]
                                  for r in rounds)
        group_share = statistics.median(
            (r.get("group encode+sign", float("nan")) + r.get("group decode+check", float("nan")) + r["batch"])
            / r["env steps"] for r in rounds)
        cells = " | ".join(f"{middle[stage]:,.1f}" for stage in STAGES + GROUP_STAGES)
        print(f"| {tree} | {cells} | {learner:,.1f} | {share:.3f} | {group_share:.3f} |")
    print()
    print("'env steps' is ActorGroup.run per actor's rollout (the policy call included). The last two columns are "
          "the transport's CPU beside the stepping's, the share of the machine it takes from the workers: with one "
          "entry per rollout, and with one per actor group as workers push them (the group's stages are per rollout "
          "in the entry; nan for a tree without group entries).")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--envs", type=int, default=32, help="actors in the group (records per rollout)")
    parser.add_argument("--steps", type=int, default=128, help="steps per rollout")
    parser.add_argument("--repeats", type=int, default=5, help="timings per stage; the best is kept")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (trees interleaved)")
    parser.add_argument("--checkouts", nargs="+", default=None,
                        help="source trees to compare (default: this one, in process)")
    args = parser.parse_args(argv)
    if min(args.envs, args.steps, args.repeats, args.rounds) < 1:
        parser.error("expected --envs, --steps, --repeats and --rounds >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    trees = args.checkouts or ["this tree"]
    results: dict[str, list[dict[str, float]]] = {tree: [] for tree in trees}
    for round_index in range(args.rounds):
        order = trees if round_index % 2 == 0 else list(reversed(trees))
        for tree in order:
            print(f"round {round_index + 1}/{args.rounds}: {tree}", file=sys.stderr, flush=True)
            if args.checkouts is None:
                results[tree].append(measure(args.envs, args.steps, args.repeats))
            else:
                results[tree].append(_measure_in(tree, args))
    print_table(args, results)


if __name__ == "__main__":
    main()
