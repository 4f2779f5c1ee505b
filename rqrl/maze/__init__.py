"""Maze's API on rqrl: ``DistributedActors`` (Redis, subprocess and serial) and ``SubprocVectorEnv``, with the
rollout records and the RQ job that steps an actor group. The public names are exported by ``rqrl``."""
