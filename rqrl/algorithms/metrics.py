"""Training metrics on disk: a CSV file, TensorBoard event files, and a learning-curve PNG."""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import socket
import statistics
import struct
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.proto.summary_pb2 import Summary
from tensorboardX.record_writer import masked_crc32c

from rqrl.algorithms.checkpoint import write_error

if TYPE_CHECKING:
    from rqrl.algorithms.tracking import ScalarLog

log = logging.getLogger(__name__)


REDUCTIONS: dict[str, Callable[[list[float]], float]] = {
    "mean": statistics.fmean, "max": max, "min": min, "sum": math.fsum, "last": lambda values: values[-1]}
"""How a field's values of the updates between two rows become the row's value (MetricsWriter's reductions)."""


class MetricsWriter:
    """Appends rows to ``metrics.csv`` and the same scalars to TensorBoard, at most one row per ``every_seconds``.

    Each ``write`` adds one update's values; a row is written (and flushed, so the files can be followed) once
    ``every_seconds`` have passed since the last, at the last update's env steps, each field reduced over the
    updates between by its entry in ``reductions`` ("mean", "max", "min", "sum"; default "last"), finite values
    first. ``flush`` and ``close`` write what is pending. ``every_seconds`` 0: a row per ``write``. ``tracker``
    (--wandb's) gets each row's TensorBoard scalars too, and is closed with the writer.

    ``resume_step`` (a resumed run: the checkpoint's env steps) drops the rows and TensorBoard points an
    earlier learner wrote past it, so history is never written twice.

    A file that cannot be written (a full disk) is a CheckpointError naming it, the system's reason and the fix, as
    a failed checkpoint save is: the learner stops on it, and ``close`` then only closes the files."""

    def __init__(self, run_dir: str | Path, fields: list[str], resume_step: int | None = None, *,
                 every_seconds: float = 0.0, reductions: Mapping[str, str] | None = None,
                 tracker: ScalarLog | None = None, clock: Callable[[], float] = time.monotonic):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.fields = ["env_steps", *fields]
        self.every_seconds, self.reductions, self._clock = every_seconds, dict(reductions or {}), clock
        unknown = sorted(set(self.reductions.values()) - set(REDUCTIONS))
        if unknown:
            raise ValueError(f"unknown reduction(s) {unknown}: use {', '.join(REDUCTIONS)}")
        self.csv_path = self.run_dir / "metrics.csv"
        self.failed = False
        """True once a write failed: close() then writes nothing more."""
        with self._writing(self.csv_path):
            if resume_step is not None:
                truncate_rows(self.csv_path, resume_step, self.fields)
            is_new = not self.csv_path.exists() or self.csv_path.stat().st_size == 0
            self._file = self.csv_path.open("a", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=self.fields, extrasaction="ignore")
        try:
            with self._writing(self.csv_path):
                if is_new:
                    self._csv.writeheader()
            with self._writing(self.run_dir / "tensorboard"):
                # purge_step: TensorBoard hides the earlier files' points from that step on
                self._tensorboard = EventFile(self.run_dir / "tensorboard",
                                              purge_step=resume_step + 1 if resume_step is not None else None)
        except BaseException:
            with contextlib.suppress(OSError):
                self._file.close()
            raise
        self._tracker = tracker
        self._pending: dict[str, list[float]] = {}
        self._pending_step: int | None = None
        self._last_row: float | None = None

    def write(self, env_steps: int, values: Mapping[str, float | None]) -> None:
        """Add one update's values (None: nothing to add); write a row if ``every_seconds`` have passed."""
        self._pending_step = env_steps
        for name, value in values.items():
            self._pending.setdefault(name, [])
            if value is not None:
                self._pending[name].append(value)
        now = self._clock()
        if self._last_row is None or now - self._last_row >= self.every_seconds:
            self._write_row()
            self._last_row = now

    def _write_row(self) -> None:
        """The pending values as one CSV row (None: an empty cell) and their finite values as TensorBoard scalars
        (tensorboard_tag)."""
        if self._pending_step is None:
            return
        row = {name: self._reduce(name, values) for name, values in self._pending.items()}
        with self._writing(self.csv_path):
            self._csv.writerow({"env_steps": self._pending_step, **row})
            self._file.flush()
        scalars = {tensorboard_tag(name): value for name, value in row.items()
                   if value is not None and math.isfinite(value)}
        with self._writing(self._tensorboard.path):
            self._tensorboard.write_scalars(self._pending_step, scalars)
            self._tensorboard.flush()
        if self._tracker is not None and scalars:
            self._tracker.log(self._pending_step, scalars)
        self._pending, self._pending_step = {}, None

    def _reduce(self, name: str, values: list[float]) -> float | None:
        finite = [value for value in values if math.isfinite(value)]
        if not finite:
            return values[-1] if values else None
        return REDUCTIONS[self.reductions.get(name, "last")](finite)

    def flush(self) -> None:
        """Write the pending row, if any, and flush the files."""
        self._write_row()
        with self._writing(self.csv_path):
            self._file.flush()
        with self._writing(self._tensorboard.path):
            self._tensorboard.flush()

    def close(self) -> None:
        """Write the pending row and close the files. After a failed write (a full disk) only close them: what they
        still buffer is lost (the rows written before stay), and no second error buries the first."""
        try:
            if not self.failed:
                self._write_row()
        finally:
            self._close_files()

    def _close_files(self) -> None:
        """Close metrics.csv, the event file and the tracker, each of them whatever the others do. Closing flushes,
        which fails again on a full disk: after a failed write that is ignored, else it is _writing's error."""
        failures: list[tuple[Path, OSError]] = []
        for path, file in ((self.csv_path, self._file), (self._tensorboard.path, self._tensorboard)):
            try:
                file.close()
            except OSError as error:
                failures.append((path, error))
        if self._tracker is not None:
            self._tracker.close()
        if failures and not self.failed:
            failed_path, failure = failures[0]
            with self._writing(failed_path):  # the first failure as the CheckpointError of a failed write
                raise failure

    @contextlib.contextmanager
    def _writing(self, path: Path) -> Iterator[None]:
        """An OSError (ENOSPC, EROFS...) while writing ``path`` as write_error's CheckpointError, which names it
        and the fix; the writer is ``failed`` from then on."""
        try:
            yield
        except OSError as error:
            self.failed = True
            raise write_error(path, error, "the rows and TensorBoard points written before stay",
                              run_dir=self.run_dir) from error


LOSS_TERMS = frozenset({"entropy", "clip_fraction", "mean_rho", "grad_norm"})
"""Figures of the update itself, grouped with the losses."""


def tensorboard_tag(name: str) -> str:
    """A metric's TensorBoard tag, grouped as the field's tools group them: the update's terms under ``losses/``,
    everything else (returns, steps/s, lag, queue, workers) under ``charts/``.

    >>> tensorboard_tag("policy_loss"), tensorboard_tag("entropy"), tensorboard_tag("mean_return")
    ('losses/policy_loss', 'losses/entropy', 'charts/mean_return')
    """
    group = "losses" if name.endswith("_loss") or name in LOSS_TERMS else "charts"
    return f"{group}/{name}"


class EventFile:
    """A TensorBoard event file written in the caller's thread, one whole record per write call.

    tensorboardX's SummaryWriter hands events to a thread through a multiprocessing.Queue, and a Ctrl-C that
    lands inside its put can lose the wake-up of the queue's feeder thread: close() then waits forever for
    the thread to see its stop signal (a learner that never exits after Ctrl-C). Here nothing waits on
    another thread, and a Ctrl-C mid-write cannot leave half a record behind. The framing is TFRecord's:
    length, its masked CRC-32C, the serialized Event, its masked CRC-32C."""

    def __init__(self, directory: Path, purge_step: int | None = None):
        directory.mkdir(parents=True, exist_ok=True)
        # a unique suffix: event files are named by the second, and a resume within it must not overwrite
        self.path = directory / (f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
                                 f".{uuid.uuid4().hex[:8]}")
        self._file = self.path.open("wb")
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))
        if purge_step is not None:
            self._write(Event(wall_time=time.time(), step=purge_step,
                              session_log=SessionLog(status=SessionLog.START)))

    def write_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """One event holding every value of ``values`` as a scalar at ``step``."""
        if values:
            summary = Summary(value=[Summary.Value(tag=name, simple_value=value) for name, value in values.items()])
            self._write(Event(wall_time=time.time(), step=step, summary=summary))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def _write(self, event: Event) -> None:
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        self._file.write(header + struct.pack("<I", masked_crc32c(header)) + data
                         + struct.pack("<I", masked_crc32c(data)))


class Bottleneck:
    """Where an asynchronous learner's time goes, to name what limits a run's throughput: a learner that waits
    for rollouts much of its time is fed too slowly (the workers), one that finds the out-of-sync queue full
    batch after batch makes the workers wait (the learner)."""

    WAITING = 0.25  # waiting this share of its time or more: the workers limit the run
    FULL = 0.5  # finding the queue full in this share of batches or more: the learner limits the run

    def __init__(self) -> None:
        self.waited = self.elapsed = 0.0
        self.batches = self.full_batches = 0

    def add(self, waited: float, elapsed: float, queue_full: bool) -> None:
        """One batch: ``waited`` seconds in collect_outputs out of ``elapsed`` seconds for the whole step."""
        self.waited += waited
        self.elapsed += elapsed
        self.batches += 1
        self.full_batches += int(queue_full)

    @property
    def waiting_share(self) -> float | None:
        return self.waited / self.elapsed if self.elapsed > 0 else None

    @property
    def full_share(self) -> float | None:
        return self.full_batches / self.batches if self.batches else None

    def verdict(self) -> str | None:
        """"workers", "learner" or "balanced"; None before the first batch."""
        waiting, full = self.waiting_share, self.full_share
        if waiting is None or full is None:
            return None
        if waiting >= self.WAITING:
            return "workers"
        return "learner" if full >= self.FULL else "balanced"

    def explain(self) -> str:
        """One line for the run's summary."""
        verdict, waiting, full = self.verdict(), self.waiting_share, self.full_share
        if verdict is None or waiting is None or full is None:
            return "bottleneck: no batch trained on"
        facts = (f"the learner waited for rollouts {waiting:.0%} of its time; the queue was full at {full:.0%} "
                 f"of batches")
        advice = {"workers": "the workers limit throughput: add workers or envs per worker",
                  "learner": "the learner limits throughput: a faster learner (--learner-device cuda, more "
                             "--learner-threads) or larger batches",
                  "balanced": "learner and workers keep pace with each other"}[verdict]
        return f"bottleneck: {advice} ({facts})"


def truncate_rows(csv_path: Path, last_step: int, fields: list[str]) -> int:
    """Keep the rows of ``csv_path`` up to ``last_step`` env steps (rewritten with header ``fields``, atomically);
    returns how many were dropped. Rows whose env_steps does not parse are dropped too."""
    if not csv_path.is_file() or csv_path.stat().st_size == 0:
        return 0
    with csv_path.open(newline="") as file:
        rows = list(csv.DictReader(file))
    kept = [row for row in rows if _step(row) <= last_step]
    dropped = len(rows) - len(kept)
    if dropped == 0 and list(rows[0].keys() if rows else []) == fields:
        return 0
    partial = csv_path.with_name(csv_path.name + ".partial")
    try:
        with partial.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(kept)
        partial.replace(csv_path)
    except OSError:
        partial.unlink(missing_ok=True)  # the rows stay as they were; the caller says what failed
        raise
    if dropped and last_step == 0:  # a run folder with no checkpoint (or one of 0 steps): the run starts over
        log.warning("%s: dropped the %d row(s) of the earlier attempt: the run starts again from its first step",
                    csv_path, dropped)
    elif dropped:
        log.warning("%s: dropped %d row(s) past the checkpoint's %d env steps (written after it, before the "
                    "run stopped)", csv_path, dropped, last_step)
    return dropped


def write_summary(run_dir: Path, summary: Mapping[str, Any]) -> None:
    """``summary`` (TrainResult.summary()) as the run's summary.json, through a temporary file renamed over it: a
    full disk leaves the earlier one whole, and is a CheckpointError naming the file, the reason and the fix."""
    path = run_dir / "summary.json"
    temporary = path.with_name(path.name + ".tmp")
    try:
        temporary.write_text(json.dumps(dict(summary), indent=2))
        temporary.replace(path)
    except OSError as error:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise write_error(path, error, "the checkpoint and weights written before it stay",
                          resume=False) from error


def _step(row: Mapping[str, str | None]) -> float:
    """A row's env steps; infinity (dropped) if it does not parse."""
    try:
        return float(row.get("env_steps") or "")
    except ValueError:
        return math.inf


def plot_learning_curve(csv_path: str | Path, png_path: str | Path, column: str = "mean_return",
                        target: float | None = None, title: str = "") -> None:
    """Plot ``column`` against env steps from a metrics CSV into a PNG (headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, values = [], []
    with Path(csv_path).open() as file:
        for row in csv.DictReader(file):
            if row.get(column) not in (None, ""):
                steps.append(int(float(row["env_steps"])))
                values.append(float(row[column]))
    figure, axes = plt.subplots(figsize=(7, 4), dpi=100)
    axes.plot(steps, values, label=column.replace("_", " "))
    if target is not None:
        axes.axhline(target, color="grey", linestyle="--", label=f"target {target:g}")
    axes.set_xlabel("env steps")
    axes.set_ylabel("episode return (mean of last 100)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(png_path)
    plt.close(figure)
