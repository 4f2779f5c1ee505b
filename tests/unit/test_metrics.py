"""MetricsWriter (CSV + TensorBoard) and plot_learning_curve, on real files."""

from __future__ import annotations

import csv
import errno
import logging
import math
import struct
import threading
import time
from pathlib import Path

import pytest

from rqrl.algorithms.metrics import Bottleneck, EventFile, MetricsWriter, plot_learning_curve, write_summary
from rqrl.errors import CheckpointError
from tests.run_files import PNG_SIGNATURE, read_rows, tensorboard_events, tensorboard_scalars


def test_writes_csv_rows_and_tensorboard_scalars(tmp_path):
    writer = MetricsWriter(tmp_path / "run", ["mean_return", "loss"])
    writer.write(100, {"mean_return": 1.5, "loss": None})
    writer.write(200, {"mean_return": float("nan"), "loss": 0.25, "not_a_column": 7.0})
    writer.write(300, {"mean_return": 3.0, "loss": 0.125})
    writer.flush()
    rows = read_rows(tmp_path / "run" / "metrics.csv")  # readable after flush, before close
    writer.close()
    assert list(rows[0]) == ["env_steps", "mean_return", "loss"]
    assert [(row["env_steps"], row["mean_return"], row["loss"]) for row in rows] == [
        ("100", "1.5", ""), ("200", "nan", "0.25"), ("300", "3.0", "0.125")]
    scalars = tensorboard_scalars(tmp_path / "run")
    # None and NaN are left out of TensorBoard; extra keys still reach it
    # tagged as the field groups them: the update's terms under losses/, the rest under charts/
    assert sorted(scalars) == sorted([(100, "charts/mean_return", 1.5), (200, "charts/loss", 0.25),
                                      (200, "charts/not_a_column", 7.0), (300, "charts/mean_return", 3.0),
                                      (300, "charts/loss", 0.125)])
    assert all(math.isfinite(value) for _, _, value in scalars)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rows_come_at_most_every_n_seconds_with_the_updates_between_reduced(tmp_path):
    clock = Clock()
    writer = MetricsWriter(tmp_path, ["loss", "lag_max", "dropped", "updates", "eval"], every_seconds=1.0,
                           reductions={"loss": "mean", "lag_max": "max", "dropped": "sum"}, clock=clock)
    writer.write(10, {"loss": 9.0, "lag_max": 1, "dropped": 1, "updates": 1, "eval": None})  # the first: a row
    for step, loss in ((20, 1.0), (30, float("nan")), (40, 3.0)):  # within the second: pending
        clock.now += 0.3
        writer.write(step, {"loss": loss, "lag_max": step / 10, "dropped": 2, "updates": step / 10, "eval": None})
    assert len(read_rows(tmp_path / "metrics.csv")) == 1, "no row before a second has passed"
    clock.now += 0.2
    writer.write(50, {"loss": 5.0, "lag_max": 0, "dropped": 0, "updates": 5, "eval": 7.5})
    writer.write(60, {"loss": 6.0, "lag_max": 0, "dropped": 0, "updates": 6, "eval": None})
    writer.close()  # writes what is pending
    rows = [(row["env_steps"], row["loss"], row["lag_max"], row["dropped"], row["updates"], row["eval"])
            for row in read_rows(tmp_path / "metrics.csv")]
    # mean of the finite losses (1, 3, 5), the largest lag, the dropped summed, the last update count, the eval
    assert rows == [("10", "9.0", "1", "1.0", "1", ""), ("50", "3.0", "4.0", "6.0", "5", "7.5"),
                    ("60", "6.0", "0", "0.0", "6", "")]
    scalars = tensorboard_scalars(tmp_path)
    assert sorted(step for step, tag, _ in scalars if tag == "charts/loss") == [10, 50, 60]
    assert [(step, value) for step, tag, value in scalars if tag == "charts/eval"] == [(50, 7.5)]


def test_flush_writes_the_pending_row(tmp_path):
    clock = Clock()
    writer = MetricsWriter(tmp_path, ["x"], every_seconds=60.0, clock=clock)
    writer.write(1, {"x": 1.0})
    writer.write(2, {"x": 2.0})
    writer.flush()  # a checkpoint at 2 env steps: its row is on disk with it
    assert [row["env_steps"] for row in read_rows(tmp_path / "metrics.csv")] == ["1", "2"]
    writer.close()
    assert len(read_rows(tmp_path / "metrics.csv")) == 2


def test_writing_metrics_starts_no_thread_so_ctrl_c_cannot_strand_one(tmp_path):
    # tensorboardX's SummaryWriter feeds a thread through a multiprocessing.Queue; a Ctrl-C inside its put could
    # leave close() waiting for that thread forever. Our writer works in the caller's thread alone.
    before = set(threading.enumerate())
    writer = MetricsWriter(tmp_path, ["x"], resume_step=10)
    for step in range(20, 40):
        writer.write(step, {"x": float(step)})
    writer.flush()
    assert set(threading.enumerate()) == before
    writer.close()
    assert [step for step, tag, _ in tensorboard_scalars(tmp_path) if tag == "charts/x"] == list(range(20, 40))


def test_reopening_appends_without_repeating_the_header(tmp_path):
    first = MetricsWriter(tmp_path, ["x"])
    first.write(1, {"x": 1.0})
    first.write(2, {"x": 2.0})
    first.close()
    second = MetricsWriter(tmp_path, ["x"])
    second.write(3, {"x": 3.0})
    second.close()
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines == ["env_steps,x", "1,1.0", "2,2.0", "3,3.0"]
    assert (3, "charts/x", 3.0) in tensorboard_scalars(tmp_path)


def test_reopening_within_a_second_keeps_the_earlier_tensorboard_events(tmp_path):
    time.sleep(1.02 - time.time() % 1)  # start just after a second boundary: both writers open in that second
    first = MetricsWriter(tmp_path, ["x"])
    first.write(1, {"x": 1.0})
    first.close()
    second = MetricsWriter(tmp_path, ["x"])
    second.write(2, {"x": 2.0})
    second.close()
    assert sorted(step for step, tag, _ in tensorboard_scalars(tmp_path) if tag == "charts/x") == [1, 2]


def test_reopening_an_empty_csv_writes_the_header(tmp_path):
    (tmp_path / "metrics.csv").write_text("")
    writer = MetricsWriter(tmp_path, ["x"])
    writer.write(1, {"x": 1.0})
    writer.close()
    assert (tmp_path / "metrics.csv").read_text().splitlines() == ["env_steps,x", "1,1.0"]


def write_csv(path, rows):
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=["env_steps", "mean_return", "loss"])
        writer.writeheader()
        writer.writerows(rows)


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_learning_curve_writes_a_png(tmp_path):
    write_csv(tmp_path / "metrics.csv", [{"env_steps": 64 * i, "mean_return": "" if i < 3 else 10.0 + i, "loss": 1.0}
                                         for i in range(1, 30)])
    plot_learning_curve(tmp_path / "metrics.csv", tmp_path / "curve.png", target=475.0, title="IMPALA on CartPole")
    assert (tmp_path / "curve.png").stat().st_size > 1000
    assert png_size(tmp_path / "curve.png") == (700, 400)


def test_plot_of_another_column_and_of_no_data(tmp_path):
    write_csv(tmp_path / "metrics.csv", [{"env_steps": 10, "mean_return": "", "loss": 0.5},
                                         {"env_steps": 20, "mean_return": "", "loss": 0.25}])
    plot_learning_curve(tmp_path / "metrics.csv", tmp_path / "loss.png", column="loss")
    plot_learning_curve(tmp_path / "metrics.csv", tmp_path / "empty.png")  # only empty cells: still a figure
    for name in ("loss.png", "empty.png"):
        assert png_size(tmp_path / name) == (700, 400)


def test_a_resume_drops_the_rows_written_after_the_checkpoint(tmp_path):
    first = MetricsWriter(tmp_path, ["x"])
    for step in (100, 200, 300, 400):  # the checkpoint was at 200; 300 and 400 came before a SIGKILL
        first.write(step, {"x": float(step)})
    first.close()
    resumed = MetricsWriter(tmp_path, ["x"], resume_step=200)
    resumed.write(300, {"x": -3.0})
    resumed.close()
    rows = read_rows(tmp_path / "metrics.csv")
    assert [(row["env_steps"], row["x"]) for row in rows] == [("100", "100.0"), ("200", "200.0"), ("300", "-3.0")]
    assert (tmp_path / "metrics.csv").read_text().count("env_steps") == 1


def test_a_resume_keeps_every_row_up_to_the_checkpoint_and_drops_junk(tmp_path):
    (tmp_path / "metrics.csv").write_text("env_steps,x\n100,1\nbroken,2\n200,3\n")
    MetricsWriter(tmp_path, ["x", "y"], resume_step=200).close()  # a column more: the header is rewritten
    rows = read_rows(tmp_path / "metrics.csv")
    assert list(rows[0]) == ["env_steps", "x", "y"]
    assert [(row["env_steps"], row["x"], row["y"]) for row in rows] == [("100", "1", ""), ("200", "3", "")]


def test_a_resume_tells_tensorboard_to_hide_the_old_points_past_the_checkpoint(tmp_path):
    MetricsWriter(tmp_path, ["x"], resume_step=200).close()
    purge_steps = [event.step for event in tensorboard_events(tmp_path) if event.HasField("session_log")]
    assert purge_steps == [201]


@pytest.mark.parametrize(("steps", "verdict"), [
    ([(0.5, 1.0, False)] * 4, "workers"),  # waits half its time for rollouts
    ([(0.01, 1.0, True)] * 3 + [(0.01, 1.0, False)], "learner"),  # never waits, the queue is full 3 times in 4
    ([(0.1, 1.0, False)] * 3 + [(0.1, 1.0, True)], "balanced"),
])
def test_bottleneck_names_what_limits_the_run(steps, verdict):
    bottleneck = Bottleneck()
    for waited, elapsed, full in steps:
        bottleneck.add(waited, elapsed, full)
    assert bottleneck.verdict() == verdict
    assert bottleneck.explain().startswith("bottleneck: ") and "%" in bottleneck.explain()


def test_bottleneck_before_any_batch_says_so():
    assert Bottleneck().verdict() is None
    assert Bottleneck().explain() == "bottleneck: no batch trained on"


def test_a_restarted_run_says_it_dropped_the_earlier_attempt_s_rows_not_a_checkpoint_s(tmp_path, caplog):
    """A run folder with no checkpoint starts again from its first step (resume_step 0): no checkpoint to name."""
    (tmp_path / "metrics.csv").write_text("env_steps,x\n512,1\n1024,2\n")
    with caplog.at_level(logging.WARNING, logger="rqrl.algorithms.metrics"):
        MetricsWriter(tmp_path, ["x"], resume_step=0).close()
    assert read_rows(tmp_path / "metrics.csv") == []
    assert "dropped the 2 row(s) of the earlier attempt: the run starts again from its first step" in caplog.text
    assert "checkpoint" not in caplog.text


NO_SPACE = OSError(errno.ENOSPC, "No space left on device")


class FullDisk:
    """A file on a full disk: what is written waits in its buffer, and flushing (closing too) fails with ENOSPC."""

    def __init__(self, file) -> None:
        self.file = file

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        raise NO_SPACE

    def close(self) -> None:
        self.file.close()
        raise NO_SPACE


@pytest.fixture
def run(tmp_path):
    """A run folder (it has config.json): the messages say how to resume it."""
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_a_full_disk_under_metrics_csv_is_one_error_naming_the_file_and_the_fix(run, monkeypatch):
    real_open = Path.open

    def open_on_a_full_disk(path, *args, **kwargs):
        file = real_open(path, *args, **kwargs)
        return FullDisk(file) if path.name == "metrics.csv" and args[:1] == ("a",) else file

    first = MetricsWriter(run, ["x"])  # writes the header
    first.close()
    monkeypatch.setattr(Path, "open", open_on_a_full_disk)
    writer = MetricsWriter(run, ["x"])
    with pytest.raises(CheckpointError) as raised:
        writer.write(100, {"x": 1.0})
    assert str(raised.value) == (f"cannot write {run / 'metrics.csv'}: No space left on device; the rows and "
                                 f"TensorBoard points written before stay. Free space on that disk (or make {run} "
                                 f"writable), then resume the run with `rqrl train --resume {run}`")
    assert raised.value.__cause__ is NO_SPACE and writer.failed
    writer.close()  # no second error: the files are only closed
    writer = MetricsWriter(run, ["x"])  # no write failed yet: the close's own flush meets the full disk
    with pytest.raises(CheckpointError, match=f"cannot write {run / 'metrics.csv'}: No space left on device"):
        writer.close()


def test_a_full_disk_under_the_event_file_is_one_error_naming_it(run, monkeypatch):
    writer = MetricsWriter(run, ["x"])
    monkeypatch.setattr(EventFile, "_write", lambda self, event: (_ for _ in ()).throw(NO_SPACE))
    with pytest.raises(CheckpointError, match=f"cannot write {writer._tensorboard.path}: No space left on device; "
                                              f".*then resume the run with `rqrl train --resume {run}`"):
        writer.write(100, {"x": 1.0})
    writer.close()
    assert read_rows(run / "metrics.csv") == [{"env_steps": "100", "x": "1.0"}], "the row written before stays"


def test_a_full_disk_under_summary_json_keeps_the_earlier_one(run, monkeypatch):
    write_summary(run, {"env_steps": 1})
    monkeypatch.setattr(Path, "write_text", lambda self, text: (_ for _ in ()).throw(NO_SPACE))
    with pytest.raises(CheckpointError, match=f"cannot write {run / 'summary.json'}: No space left on device; the "
                                              r"checkpoint and weights written before it stay. Free space on that "
                                              rf"disk \(or make {run} writable\)$"):
        write_summary(run, {"env_steps": 2})
    assert (run / "summary.json").read_text() == '{\n  "env_steps": 1\n}'
    assert sorted(path.name for path in run.iterdir()) == ["config.json", "summary.json"], "no temporary left"
