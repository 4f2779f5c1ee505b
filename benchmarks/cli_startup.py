"""How fast the everyday `rqrl` commands answer, and what they cost, now and at an earlier commit, side by side.

Each command runs as a user runs it (``python -m rqrl ...``, a fresh interpreter) against a private redis-server:
``--help``, ``status``, ``stop`` (of a run that is not there), ``health --worker`` (what compose runs in every
container) and ``worker --help``. For each: the median wall time of ``--runs`` runs, the largest resident memory
(from wait4), and whether the command imported torch (``-X importtime``, one more run). The commits alternate run
by run, so both see the same machine load.

Run from the repository root (the earlier commit is checked out into a temporary git worktree)::

    python benchmarks/cli_startup.py                    # this checkout against 92e00d3, before torch-free CLI
    python benchmarks/cli_startup.py --before HEAD~3 --runs 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BEFORE = "92e00d3"
"""The last commit before `import rqrl` and the CLI stopped importing torch."""


def commands(redis_url: str) -> dict[str, list[str]]:
    return {
        "rqrl --help": ["--help"],
        "rqrl status": ["status", "--redis-url", redis_url],
        "rqrl stop": ["stop", "no-such-run", "--redis-url", redis_url, "--wait", "0"],
        "rqrl health --worker": ["health", "--redis-url", redis_url, "--worker", "no-such-worker"],
        "rqrl worker --help": ["worker", "--help"],
    }


@dataclass
class Measured:
    seconds: list[float] = field(default_factory=list)
    max_rss_mb: float = 0.0
    imports_torch: bool = False


def run_once(tree: Path, arguments: list[str], import_times: bool = False) -> tuple[float, float, str]:
    """Run ``python -m rqrl ARGUMENTS`` from ``tree``; (wall seconds, max RSS in MB, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, *(["-X", "importtime"] if import_times else []), "-m", "rqrl", *arguments]
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert process.stderr is not None
    stderr = process.stderr.read().decode(errors="replace")
    _, _, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = 0  # reaped by wait4 above
    process.stderr.close()
    return seconds, usage.ru_maxrss / 1024, stderr


def measure(trees: dict[str, Path], redis_url: str, runs: int) -> dict[tuple[str, str], Measured]:
    results = {(label, name): Measured() for label in trees for name in commands(redis_url)}
    for name, arguments in commands(redis_url).items():
        for _ in range(runs):
            for label, tree in trees.items():  # alternate, so both commits see the same load
                seconds, rss, _ = run_once(tree, arguments)
                results[label, name].seconds.append(seconds)
                results[label, name].max_rss_mb = max(results[label, name].max_rss_mb, rss)
        for label, tree in trees.items():
            _, _, stderr = run_once(tree, arguments, import_times=True)
            results[label, name].imports_torch = any(line.split("|")[-1].strip() == "torch"
                                                          for line in stderr.splitlines())
        print(f"  measured {name}", file=sys.stderr, flush=True)
    return results


def table(results: dict[tuple[str, str], Measured], labels: list[str], names: list[str]) -> str:
    before, now = labels
    lines = [f"| command | median s ({before}) | median s ({now}) | ratio | max RSS MB ({before}) | "
             f"max RSS MB ({now}) | torch ({before}) | torch ({now}) |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for name in names:
        old, new = results[before, name], results[now, name]
        old_median, new_median = statistics.median(old.seconds), statistics.median(new.seconds)
        lines.append(f"| `{name}` | {old_median:.2f} | {new_median:.2f} | {new_median / old_median:.2f} | "
                     f"{old.max_rss_mb:.0f} | {new.max_rss_mb:.0f} | {'yes' if old.imports_torch else 'no'} | "
                     f"{'yes' if new.imports_torch else 'no'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE, help="the earlier commit to compare with (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per command and commit (default: 5)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO_ROOT))
    from rqrl.engine.server import EmbeddedRedis

    with tempfile.TemporaryDirectory(prefix="rqrl-cli-startup-") as scratch, EmbeddedRedis() as server:
        before_tree = Path(scratch) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(before_tree), args.before],
                       cwd=REPO_ROOT, check=True)
        try:
            trees = {args.before: before_tree, "this checkout": REPO_ROOT}
            print(f"timing {len(commands(server.url))} commands, {args.runs} runs each, at {args.before} and in this "
                  f"checkout (cpus: {os.cpu_count()})", file=sys.stderr)
            results = measure(trees, server.url, args.runs)
            names = list(commands(server.url))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before_tree)], cwd=REPO_ROOT, check=False)
    print(table(results, list(trees), names))


if __name__ == "__main__":
    main()
