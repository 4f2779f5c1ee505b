"""The ``rqrl`` command line: ``worker``, ``train``, ``status``, ``stop``, ``health``, ``evaluate``, ... ."""

from rqrl.cli.commands import main

__all__ = ["main"]
