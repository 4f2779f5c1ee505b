"""How long junk on the out-of-sync queue holds up the learner: N entries of 32 random bytes pushed by a Redis
writer without the secret (and the doorbell deleted), then one good signed entry; the table gives the time
``collect_outputs`` takes to return that good batch, and the junk refused per second.

The learner is ``RedisDistributedActors`` on a private redis-server, with the good entry made by the same
``ActorGroup`` and encoder a worker uses (no worker process: the figure is the learner's drain alone).

Run from the repository root::

    python benchmarks/junk_drain.py --entries 1000 100000 1000000
"""

from __future__ import annotations

import argparse
import os
import time

import gymnasium
import torch

from rqrl.engine.codec import records_key
from rqrl.engine.policy import make_act_function
from rqrl.engine.server import EmbeddedRedis
from rqrl.maze.actors import RedisDistributedActors
from rqrl.maze.group_records import encode_signed_group
from rqrl.maze.rollout import ActorGroup

SECRET = "junk-drain-benchmark"


def make_cartpole() -> gymnasium.Env:
    return gymnasium.make("CartPole-v1")


def make_policy() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def drain_seconds(redis_url: str, junk: int, push_chunk: int = 10_000) -> tuple[float, int]:
    """Seconds from the collect to its batch behind ``junk`` junk entries, and the entries refused."""
    actors = RedisDistributedActors(make_cartpole, make_policy(), 16, 2, 2, 2.0,
                                    redis_url=redis_url, n_local_workers=0, no_worker_timeout=3600,
                                    collect_timeout=3600, secret=SECRET)
    with actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        config = actors.config
        group = ActorGroup(make_cartpole, [0, 1], config.actor_env_seeds, config.actor_agent_seeds,
                           config.n_rollout_steps)
        records = group.run(make_act_function(actors.policy, group.action_space), 0, actors.policy_version,
                            cut_at_end=False)
        group.close()
        connection = actors.connection
        assert connection is not None
        for start in range(0, junk, push_chunk):
            connection.rpush(actors.keys.trajectories, *[os.urandom(32) for _ in range(min(push_chunk, junk - start))])
        connection.rpush(actors.keys.trajectories, encode_signed_group(records, config.run_id,
                                                                      records_key(SECRET, config.run_id)))
        connection.delete(actors.keys.doorbell)
        started = time.monotonic()
        actors.collect_outputs("cpu")
        return time.monotonic() - started, actors.records_rejected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, nargs="+", default=[1000, 100_000, 1_000_000])
    args = parser.parse_args()
    print("| junk entries | seconds to the good batch | junk refused per second |")
    print("|--:|--:|--:|")
    with EmbeddedRedis() as server:
        for junk in args.entries:
            seconds, refused = drain_seconds(server.url, junk)
            assert refused == junk, f"refused {refused} of {junk} junk entries"
            print(f"| {junk:,} | {seconds:.2f} | {junk / max(seconds, 1e-9):,.0f} |", flush=True)


if __name__ == "__main__":
    main()
