"""The engine every family runs on: Redis keys, the signed wire format, the connection, weights, leases and
fencing, the run record, the job lifecycle, the rqrl worker, RQ safety, and local processes.

It imports no family (``rqrl.maze``, ``rqrl.garage``, ``rqrl.seed``), no learner and no CLI."""
