"""Training metrics on disk: a CSV file, TensorBoard event files, and a learning-curve PNG."""

from __future__ import annotations

import csv
import math
import uuid
from collections.abc import Mapping
from pathlib import Path


class MetricsWriter:
    """Appends one row per learner update to ``metrics.csv`` and the same scalars to TensorBoard."""

    def __init__(self, run_dir: str | Path, fields: list[str]):
        from tensorboardX import SummaryWriter

        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.fields = ["env_steps", *fields]
        self.csv_path = self.run_dir / "metrics.csv"
        is_new = not self.csv_path.exists() or self.csv_path.stat().st_size == 0
        self._file = self.csv_path.open("a", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=self.fields, extrasaction="ignore")
        if is_new:
            self._csv.writeheader()
        # a unique suffix: event files are named by the second, and a resume within it must not overwrite
        self._tensorboard = SummaryWriter(logdir=str(self.run_dir / "tensorboard"),
                                          filename_suffix=f".{uuid.uuid4().hex[:8]}")

    def write(self, env_steps: int, values: Mapping[str, float | None]) -> None:
        """One CSV row (None: an empty cell) and the finite values as TensorBoard scalars."""
        self._csv.writerow({"env_steps": env_steps, **values})
        for name, value in values.items():
            if value is not None and math.isfinite(value):
                self._tensorboard.add_scalar(name, value, env_steps)

    def flush(self) -> None:
        self._file.flush()
        self._tensorboard.flush()

    def close(self) -> None:
        self._file.close()
        self._tensorboard.close()


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
