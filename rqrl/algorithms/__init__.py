"""Learners built on the public DistributedActors API, one readable file each."""
