"""The forkserver's preload: the worker's modules (torch among them), imported once for every worker forked.

A Ctrl-C pressed while the forkserver starts reaches it too (it shares the learner's terminal), and used to print
a KeyboardInterrupt traceback from inside torch's import. The learner starts the forkserver with SIGINT blocked
(``local_workers.start_forkserver``); here it is ignored, which drops one that came meanwhile, and unblocked. The
workers get the disposition the forkserver started with, as they did before: the forkserver hands its children
the handlers it found after the preload.
"""

import signal

_started_with = signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
try:
    import rqrl.engine.worker  # noqa: F401 - the preload itself
finally:
    signal.signal(signal.SIGINT, _started_with)
