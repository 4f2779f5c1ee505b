"""garage's API on rqrl: ``MultiprocessingSampler``/``RQSampler``, ``LocalSampler``, ``WorkerFactory`` and
``EpisodeBatch``, with the RQ job that runs sampler workers. The public names are exported by ``rqrl``."""
