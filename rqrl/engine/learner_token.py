"""Which learner holds a run: its token in ``RunKeys.learner_token``, written when it stores or resumes the run.

A learner that resumes a run whose learner still runs writes its own token over the other's; the other finds out
at its next heartbeat, publish or pop, raises RunTakenOverError and leaves the run to the new one (what it popped
at that last pop stays unacknowledged, so the new learner reads it).
"""

from __future__ import annotations

from rqrl.errors import RunTakenOverError


def held_by_another(holder: bytes | str | None, token: str | None) -> bool:
    """Whether ``holder`` (the run's token as read from Redis) names a learner other than ``token``'s; a learner
    without a token (``rqrl stop``, a worker) and a run without one (an older rqrl's) are nobody's to lose."""
    if token is None or holder is None:
        return False
    return (holder.decode(errors="replace") if isinstance(holder, bytes) else holder) != token


def taken_over_error(run_name: str) -> RunTakenOverError:
    """What a learner that lost its run raises."""
    return RunTakenOverError(
        f"run {run_name!r} was taken over by another learner (resume=True, `rqrl train --resume`): this learner "
        f"stops and leaves the run's keys and jobs to it. Two learners of one run compete for its rollouts: resume "
        f"a run only once its learner has stopped, or start a new run_name"
    )
