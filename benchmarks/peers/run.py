"""rqrl next to the reference and every peer that installed, side by side in one run, rounds interleaved.

Each measurement is a fresh subprocess printing one JSON line (see harness.py): rqrl and the reference run
benchmarks/peers/rqrl_throughput.py in the project's venv (this interpreter unless --python), each peer runs
``<peer>_throughput.py`` in its own venv under benchmarks/peers/.venvs (made by install.sh). Within a round every
E measures every system, in an order that rotates from round to round so machine noise hits all of them. The
table shows medians over rounds; each ratio is the median of the per-round (paired) ratios to rqrl.

Run from the repository root, after ``bash benchmarks/peers/install.sh``::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/peers/run.py --rounds 3 --seconds 10 --envs-per-worker 8 32
    PYTHONPATH=$PWD .venv/bin/python benchmarks/peers/run.py --workload atari --rounds 2 --seconds 8

``--workload atari`` steps ALE/Pong-v5 with the standard preprocessing and a small conv net (see harness.py) in
every system that has an Atari path (ATARI_PEERS); the default is CartPole-v1 with the MLP.

This module uses the standard library only, so its table builder is testable without any peer installed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
VENVS = HERE / ".venvs"
OURS = ("rqrl", "reference")
PEERS = ("sample_factory", "rllib", "pufferlib", "torchrl", "gymnasium_async")  # the CartPole workload's
ATARI_PEERS = ("sample_factory", "rllib", "envpool")  # the peers with an Atari path
ALL_PEERS = (*PEERS, "envpool")
WORKLOAD_PEERS = {"cartpole": PEERS, "atari": ATARI_PEERS}
TITLES = {
    "rqrl": "rqrl",
    "reference": "reference",
    "sample_factory": "Sample Factory",
    "rllib": "RLlib",
    "pufferlib": "PufferLib",
    "torchrl": "TorchRL",
    "gymnasium_async": "AsyncVectorEnv",
    "envpool": "EnvPool",
}
HEADINGS = {
    "cartpole": "CartPole-v1, {workers} worker processes x E envs, 4-64-64-2 tanh MLP",
    "atari": "ALE/Pong-v5 (noop 30, frame skip 4, 84x84 grayscale, 4 stacked: uint8 4x84x84), {workers} worker "
             "processes x E envs, a 2-layer conv net (image_obs.py's ConvPolicy)",
}


@dataclass
class Results:
    """Steps/s per system, E and round (None where that round's run failed), the same per CPU second of the
    system's own processes where measured, and why systems are missing."""

    envs_per_worker: list[int]
    systems: list[str]
    rates: dict[str, dict[int, list[float | None]]] = field(default_factory=dict)
    cpu_rates: dict[str, dict[int, list[float | None]]] = field(default_factory=dict)
    not_installed: dict[str, str] = field(default_factory=dict)
    failures: dict[str, list[str]] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)

    def add(self, system: str, envs: int, rate: float | None, cpu_rate: float | None = None) -> None:
        self.rates.setdefault(system, {}).setdefault(envs, []).append(rate)
        self.cpu_rates.setdefault(system, {}).setdefault(envs, []).append(cpu_rate)

    def fail(self, system: str, envs: int, reason: str) -> None:
        self.add(system, envs, None)
        self.failures.setdefault(system, []).append(f"E={envs}: {reason}")


def install_status(peer: str, venvs: Path = VENVS) -> tuple[bool, str]:
    """(installed, versions or why not) from the STATUS file install.sh leaves in the peer's venv."""
    status = venvs / peer / "STATUS"
    if not status.is_file():
        return False, "not installed (run benchmarks/peers/install.sh)"
    text = status.read_text().strip()
    if text.startswith("ok"):
        return True, text[2:].strip()
    return False, text.removeprefix("failed:").strip() or "install failed"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _rates(results: Results, per_cpu: bool) -> dict[str, dict[int, list[float | None]]]:
    return results.cpu_rates if per_cpu else results.rates


def median_rate(results: Results, system: str, envs: int, per_cpu: bool = False) -> float | None:
    return _median([rate for rate in _rates(results, per_cpu).get(system, {}).get(envs, []) if rate is not None])


def median_ratio(results: Results, system: str, envs: int, base: str = "rqrl", per_cpu: bool = False) -> float | None:
    """Median over rounds of system / base, pairing the two measurements of each round."""
    tops = _rates(results, per_cpu).get(system, {}).get(envs, [])
    bottoms = _rates(results, per_cpu).get(base, {}).get(envs, [])
    return _median([top / bottom for top, bottom in zip(tops, bottoms, strict=False)
                    if top is not None and bottom is not None and bottom > 0])


def _cell(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _rate_table(results: Results, per_cpu: bool) -> list[str]:
    others = [system for system in results.systems if system != "rqrl"]
    unit = "steps/CPU s" if per_cpu else "steps/s"
    header = ["E (envs per worker)", f"rqrl {unit}"]
    for system in others:
        header += [f"{TITLES.get(system, system)} {unit}", f"{TITLES.get(system, system)} / rqrl"]
    lines = ["| " + " | ".join(header) + " |", "|" + "--:|" * len(header)]
    for envs in results.envs_per_worker:
        row = [str(envs), _cell(median_rate(results, "rqrl", envs, per_cpu), ",.0f")]
        for system in others:
            row += [_cell(median_rate(results, system, envs, per_cpu), ",.0f"),
                    _cell(median_ratio(results, system, envs, per_cpu=per_cpu), ".2f")]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def build_table(results: Results) -> str:
    """The markdown report: one row per E, steps/s per system and each system's ratio to rqrl, then (where
    measured) the same per CPU second the system's processes used, then notes."""
    lines = _rate_table(results, per_cpu=False)
    lines.append("")
    lines.append("Medians over rounds; each ratio is the median of the per-round (paired) ratios to rqrl; "
                 "below 1.00 means the system is slower than rqrl.")
    lines.append("")
    for system in results.systems:
        if system in results.paths or system in results.versions:
            lines.append(f"- {TITLES.get(system, system)}: {results.paths.get(system, '?')} "
                         f"({results.versions.get(system, 'versions unknown')})")
    for system, reason in results.not_installed.items():
        lines.append(f"- {TITLES.get(system, system)}: did not install: {reason}")
    for system, reasons in results.failures.items():
        lines.append(f"- {TITLES.get(system, system)}: failed to run: {'; '.join(reasons)}")
    if any(rate is not None for by_envs in results.cpu_rates.values() for rates in by_envs.values()
           for rate in rates):
        lines += ["", "Env steps per CPU second of each system's own processes in the window (the measuring process "
                  "and every process under it: workers, redis-server, Ray's raylet and workers, ...): what each "
                  "step costs, with the machine's other load divided out. Medians and paired ratios as above.", ""]
        lines += _rate_table(results, per_cpu=True)
    return "\n".join(lines)


def command(system: str, envs: int, args: argparse.Namespace) -> list[str]:
    """The subprocess that measures ``system`` at ``envs`` envs per worker and prints one JSON line."""
    common = ["--envs-per-worker", str(envs), "--workers", str(args.workers), "--rollout-steps",
              str(args.rollout_steps), "--seconds", str(args.seconds), "--warmup", str(args.warmup),
              "--workload", args.workload]
    if system in OURS:
        return [args.python, str(HERE / "rqrl_throughput.py"), "--system", system, *common]
    return [str(VENVS / system / "bin" / "python"), str(HERE / f"{system}_throughput.py"), *common]


def measure(system: str, envs: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run one measurement; its last JSON line, or RuntimeError with the tail of its stderr."""
    env = dict(os.environ)
    if system in OURS:
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    try:
        completed = subprocess.run(command(system, envs, args), cwd=REPO_ROOT, env=env, capture_output=True,
                                   text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as error:
        raise RuntimeError(f"no result within {args.timeout:g} s") from error
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        tail = " | ".join(completed.stderr.strip().splitlines()[-3:])[-400:]
        raise RuntimeError(f"exit code {completed.returncode}: {tail or 'no output'}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def versions_of(system: str, args: argparse.Namespace) -> str:
    if system in OURS:
        completed = subprocess.run([args.python, str(HERE / "rqrl_throughput.py"), "--check"], cwd=REPO_ROOT,
                                   env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, capture_output=True, text=True,
                                   timeout=120)
        return completed.stdout.strip().splitlines()[-1] if completed.returncode == 0 else "versions unknown"
    return install_status(system)[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--envs-per-worker", type=int, nargs="+", default=[8, 32], help="E values")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--rollout-steps", type=int, default=128, help="rollout length, where a system has one")
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement window per system and E")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds before each window")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--workload", choices=sorted(WORKLOAD_PEERS), default="cartpole",
                        help="cartpole: CartPole-v1 with the MLP; atari: ALE/Pong-v5, preprocessed, with a conv net")
    parser.add_argument("--peers", nargs="+", choices=ALL_PEERS,
                        help=f"peers to include (default: {', '.join(PEERS)}; with --workload atari: "
                             f"{', '.join(ATARI_PEERS)})")
    parser.add_argument("--no-reference", action="store_true", help="leave the reference out")
    parser.add_argument("--python", default=sys.executable, help="interpreter with rqrl for rqrl and the reference")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one measurement may take at most")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0 or args.workers < 1 or min(args.envs_per_worker) < 1:
        parser.error("expected --rounds, --workers, --envs-per-worker >= 1 and --seconds > 0")
    if args.peers is None:
        args.peers = list(WORKLOAD_PEERS[args.workload])
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ours = ["rqrl"] if args.no_reference else list(OURS)
    installed = []
    results = Results(envs_per_worker=list(args.envs_per_worker), systems=[])
    for peer in args.peers:
        ok, detail = install_status(peer)
        if ok:
            installed.append(peer)
        else:
            results.not_installed[peer] = detail
    results.systems = ours + installed
    for system in results.systems:
        results.versions[system] = versions_of(system, args)
    for round_index in range(args.rounds):
        for envs in args.envs_per_worker:
            shift = round_index % len(results.systems)
            for system in results.systems[shift:] + results.systems[:shift]:
                started = time.monotonic()
                try:
                    measured = measure(system, envs, args)
                except RuntimeError as error:
                    results.fail(system, envs, str(error))
                    print(f"round {round_index + 1}/{args.rounds} E={envs} {system}: failed: {error}",
                          file=sys.stderr, flush=True)
                    continue
                rate = float(measured["steps_per_second"])
                cpu_rate = measured.get("steps_per_cpu_second")
                results.add(system, envs, rate, None if cpu_rate is None else float(cpu_rate))
                results.paths[system] = str(measured.get("path", "?"))
                per_cpu = "" if cpu_rate is None else f", {float(cpu_rate):,.0f} per CPU s"
                print(f"round {round_index + 1}/{args.rounds} E={envs} {system}: {rate:,.0f} steps/s{per_cpu} "
                      f"({time.monotonic() - started:.0f} s with start-up)", file=sys.stderr, flush=True)
    print()
    print(f"## Peers: {HEADINGS[args.workload].format(workers=args.workers)}, "
          f"{args.rollout_steps}-step rollouts where the system has them, {args.seconds:g} s windows, "
          f"{args.rounds} round(s)")
    print()
    print(build_table(results))


if __name__ == "__main__":
    main()
