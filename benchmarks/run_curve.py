"""How far a run got, window by window: a run folder's metrics.csv (IMPALA's or PPO's) as a table of fixed spans
of training time, each with the env steps, updates and episodes at its end, its own steps/s, and the mean return
of the last 100 episodes at its end (rqrl's mean_return: the run's learning curve, read at the window's end).

Run from the repository root on a finished (or running) run::

    python benchmarks/run_curve.py runs/pong-20min --window 300
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path


def read_rows(path: Path) -> list[dict[str, float]]:
    """metrics.csv's rows with the figures this table reads, as numbers (an empty cell: NaN)."""
    with path.open(newline="") as handle:
        return [{name: float(row[name]) if row.get(name) else math.nan
                 for name in ("seconds", "env_steps", "updates", "episodes", "mean_return")}
                for row in csv.DictReader(handle)]


def windows(rows: list[dict[str, float]], window: float) -> list[list[str]]:
    """One table row per ``window`` seconds of training (the last one may be shorter)."""
    table, start, before = [], 0.0, {"seconds": 0.0, "env_steps": 0.0}
    while rows and start < rows[-1]["seconds"]:
        inside = [row for row in rows if start < row["seconds"] <= start + window]
        if inside:
            last = inside[-1]
            rate = (last["env_steps"] - before["env_steps"]) / max(last["seconds"] - before["seconds"], 1e-9)
            mean = "n/a" if math.isnan(last["mean_return"]) else f"{last['mean_return']:.1f}"
            minutes = f"{start / 60:.2f}-{min(start + window, last['seconds']) / 60:.2f}"  # one precision: no overlap
            table.append([minutes, f"{last['env_steps']:,.0f}", f"{rate:,.0f}", f"{last['updates']:,.0f}",
                          f"{last['episodes']:,.0f}", mean])
            before = last
        start += window
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run folder (or its metrics.csv)")
    parser.add_argument("--window", type=float, default=300.0, help="seconds of training per row")
    args = parser.parse_args()
    path = args.run / "metrics.csv" if args.run.is_dir() else args.run
    print(f"{path}, windows of {args.window:g} s of training time\n")
    print("| minutes | env steps | steps/s in the window | updates | episodes | mean return (last 100 episodes) |")
    print("|---|--:|--:|--:|--:|--:|")
    for row in windows(read_rows(path), args.window):
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
