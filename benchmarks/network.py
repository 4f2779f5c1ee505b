"""Across machines, simulated: env steps/s over a 1 ms, 1 Gbit/s network next to the same run on loopback.

Network namespaces put each process on a "machine" of its own, on one host: ``rqrl-bench-redis`` runs
redis-server, ``rqrl-bench-learner`` the learner, ``rqrl-bench-worker-N`` one ``rqrl worker`` each. Each has
one veth interface (``eth0``) on a private subnet (``--subnet``, 10.213.0.0/24 by default: .2 Redis, .3 the
learner, .10 and up the workers), and the veths' other ends are ports of a bridge in a namespace of its own
(``rqrl-bench-net``, the "switch"), so nothing is added to the root namespace. The learner is
``RedisDistributedActors`` with ``n_local_workers=0``, connecting to Redis by URL; the workers are
``rqrl worker --redis-url redis://10.213.0.x:6379/0`` processes started with ``ip netns exec``: how runs across
machines are set up. The loopback side runs the same processes, a redis-server on 127.0.0.1, no namespaces.

The link, each direction of each veth (``--link``):

- ``netem`` (what the kernel's ``sch_netem`` gives): ``tc qdisc ... root netem delay 1ms rate 1gbit`` on the
  namespace's own end (its egress: what the machine sends), and ``netem rate 1gbit`` with no delay on the
  bridge's end (its egress is the machine's ingress). A packet from one machine to another is delayed once, on
  the sender's interface: 1 ms one way, 2 ms round trip; each machine's NIC carries at most 1 Gbit/s each way,
  so Redis's link is shared by every worker pushing rollouts and the learner popping them.
- ``relay``, for kernels built without ``sch_netem`` (``tc`` says "Specified qdisc kind is unknown"): ``tbf rate
  1gbit`` on both ends of each veth for the rate, and a userspace TCP relay on the bridge (10.213.0.1:6379, a
  child process of this script in the bridge's namespace) that holds every chunk of bytes for the delay in each
  direction before passing it on, so clients connect to Redis through it: again 1 ms one way, 2 ms round trip.
  The relay costs CPU that netem does not (the per-window table's "relay cores" says how much); ``--delay-ms 0``
  measures the rate without the delay, and with ``--rate 100gbit`` too, the namespaces and the relay alone.
- ``auto`` (the default): ``netem`` where the kernel has it, else ``relay``.

Workloads: (a) CartPole-v1 with the 4-64-64-2 tanh MLP of benchmarks/scale.py, 128-step rollouts; (b) the
84x84x4 uint8 frame stacks and small conv policy of benchmarks/image_obs.py (imported, not copied), 64-step
rollouts. For each round, workload and envs-per-worker count, the two sides run one window each, alternating
which goes first, each window in a learner process of its own (in the learner's namespace on the netem side).
Workers, redis-servers (and the relay) of both sides stay up for the whole run; the idle side's workers wait on
Redis.

The table: median steps/s of each side and the median of per-round ratios; Redis's traffic over the netem
side's window (``total_net_input_bytes`` / ``total_net_output_bytes``) per second and per env step; the steps/s
one 1 Gbit/s link (125 MB/s) would carry at those bytes per step; Redis commands per worker rollout (one
rollout of a worker's envs, the unit a worker pushes; the most frequent commands follow the table); and the round
trip measured by the learner (median of redis PINGs) on each side. With the relay, also the round trips on the
wire: per worker rollout, each worker's, and per batch, the learner's (a client's bytes that follow a reply start
one; requests sent ahead of a reply count with it, so this bounds from above the round trips anyone waits on).
The bytes are whatever the code sends: when rollout payloads are compressed or de-duplicated, these columns drop
with them.

Needs root (namespaces, veths, qdiscs), ``ip`` and ``tc`` (iproute2) and ``redis-server`` on PATH. Everything it
creates (namespaces, and with them their veths, bridge and qdiscs; the processes in them; a temporary folder) is
named ``rqrl-bench-*`` and removed at the end, also on Ctrl-C or SIGTERM; leftovers of a run that was killed are
removed when the next one starts. One run at a time: it holds ``/run/rqrl-bench-network.lock`` (an empty file,
left in place) while it runs. ``--check`` only says whether this machine can run it, and with which link.

Run from the repository root, as root::

    sudo .venv/bin/python benchmarks/network.py                      # 2 workers, 8 envs each, 2 rounds
    sudo .venv/bin/python benchmarks/network.py --seconds 5 --rounds 4 --envs 8 32
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import fcntl
import ipaddress
import json
import logging
import os
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("network")

REPO_ROOT = Path(__file__).resolve().parent.parent
PREFIX = "rqrl-bench-"
BRIDGE_NAMESPACE = PREFIX + "net"
BRIDGE = "rqbr0"
INNER_INTERFACE = "eth0"
DEFAULT_SUBNET = "10.213.0.0/24"
REDIS_PORT = 6379
QUEUE_KEY = "rq:workers:rqrl"  # RQ's set of the workers that serve rqrl's default queue
SECRET = "network-benchmark-secret-network-benchmark"
LOCK_PATH = "/run/rqrl-bench-network.lock"
WORKLOADS = ("cartpole", "frames")
ROLLOUT_STEPS = {"cartpole": 128, "frames": 64}
LINK_BYTES_PER_SECOND = 125e6  # 1 Gbit/s
TBF_BURST = "128kb"  # a GSO packet of a veth is up to 64 KiB: a smaller burst makes tbf split it
TBF_LATENCY = "10ms"
NETEM_LIMIT = "10000"  # packets in flight per qdisc (netem's default, 1000, drops at 1 ms x 1 Gbit with small packets)
PING_COUNT = 50


class SetupError(RuntimeError):
    """What this machine lacks to run the benchmark, and what to do about it."""


# ---- the topology: names, addresses and the commands that build it (pure) --------------------------------------


@dataclass(frozen=True)
class Host:
    """One simulated machine: its namespace, its address and the bridge's end of its veth."""

    role: str
    namespace: str
    address: str
    peer: str


@dataclass(frozen=True)
class Topology:
    prefixlen: int
    bridge_address: str
    hosts: tuple[Host, ...]

    def host(self, role: str) -> Host:
        return next(host for host in self.hosts if host.role == role)

    @property
    def workers(self) -> list[Host]:
        return [host for host in self.hosts if host.role.startswith("worker-")]

    @property
    def namespaces(self) -> list[str]:
        return [BRIDGE_NAMESPACE, *(host.namespace for host in self.hosts)]


@dataclass(frozen=True)
class Link:
    """How each veth is shaped: ``kind`` "netem" or "relay" (tbf and a delaying relay, see the docstring)."""

    kind: str
    delay_ms: float
    rate: str

    def describe(self) -> str:
        if self.kind == "netem":
            return (f"netem delay {self.delay_ms:g}ms rate {self.rate} on each machine's egress, netem rate "
                    f"{self.rate} on its ingress: {self.delay_ms:g} ms one way, {2 * self.delay_ms:g} ms round trip")
        return (f"tbf rate {self.rate} on each machine's egress and ingress, a userspace relay holding bytes "
                f"{self.delay_ms:g} ms each way (this kernel has no sch_netem): {2 * self.delay_ms:g} ms round trip")


def plan_topology(workers: int, subnet: str = DEFAULT_SUBNET) -> Topology:
    """Addresses and names: the subnet's 1st host address is the bridge's (the relay's), the 2nd Redis's, the
    3rd the learner's, the 10th and up the workers'."""
    if workers < 1:
        raise ValueError("expected at least one worker")
    network = ipaddress.IPv4Network(subnet)
    addresses = [str(address) for address in network.hosts()]
    if len(addresses) < 9 + workers:
        raise ValueError(f"subnet {subnet} has room for {max(0, len(addresses) - 9)} workers, not {workers}: "
                         f"give --subnet a larger one")
    roles = [("redis", addresses[1]), ("learner", addresses[2])]
    roles += [(f"worker-{index}", addresses[9 + index]) for index in range(workers)]
    hosts = tuple(Host(role, PREFIX + role, address, f"rqv{index}") for index, (role, address) in enumerate(roles))
    return Topology(network.prefixlen, addresses[0], hosts)


def topology_commands(topology: Topology, link: Link) -> list[list[str]]:
    """The ``ip`` and ``tc`` commands that build ``topology`` with ``link``, in order."""
    bridge_ns = BRIDGE_NAMESPACE
    commands = [["ip", "netns", "add", bridge_ns],
                ["ip", "-n", bridge_ns, "link", "set", "lo", "up"],
                ["ip", "-n", bridge_ns, "link", "add", BRIDGE, "type", "bridge"],
                ["ip", "-n", bridge_ns, "link", "set", BRIDGE, "up"]]
    if link.kind == "relay":
        commands.append(["ip", "-n", bridge_ns, "addr", "add", f"{topology.bridge_address}/{topology.prefixlen}",
                         "dev", BRIDGE])
    for host in topology.hosts:
        commands += [
            ["ip", "netns", "add", host.namespace],
            ["ip", "-n", host.namespace, "link", "set", "lo", "up"],
            ["ip", "-n", bridge_ns, "link", "add", host.peer, "type", "veth", "peer", "name", INNER_INTERFACE,
             "netns", host.namespace],
            ["ip", "-n", bridge_ns, "link", "set", host.peer, "master", BRIDGE, "up"],
            ["ip", "-n", host.namespace, "addr", "add", f"{host.address}/{topology.prefixlen}", "dev",
             INNER_INTERFACE],
            ["ip", "-n", host.namespace, "link", "set", INNER_INTERFACE, "up"],
            qdisc_command(host.namespace, INNER_INTERFACE, link, egress_of_machine=True),
            qdisc_command(bridge_ns, host.peer, link, egress_of_machine=False),
        ]
    return commands


def qdisc_command(namespace: str, interface: str, link: Link, *, egress_of_machine: bool) -> list[str]:
    """The root qdisc of one end of a veth: the delay only on the machine's own end (its egress)."""
    base = ["tc", "-n", namespace, "qdisc", "replace", "dev", interface, "root"]
    if link.kind == "netem":
        delay = ["delay", f"{link.delay_ms:g}ms"] if egress_of_machine else []
        return base + ["netem", "limit", NETEM_LIMIT, *delay, "rate", link.rate]
    return base + ["tbf", "rate", link.rate, "burst", TBF_BURST, "latency", TBF_LATENCY]


def netns_exec(namespace: str | None, command: Sequence[str]) -> list[str]:
    """``command`` run in ``namespace`` (``ip netns exec`` execs it: the child's pid is the command's), or as is."""
    return list(command) if namespace is None else ["ip", "netns", "exec", namespace, *command]


def redis_command(bind: str, port: int, directory: str, executable: str = "redis-server") -> list[str]:
    """A throwaway redis-server: no persistence, reachable on ``bind`` (a private address or loopback)."""
    return [executable, "--bind", bind, "--port", str(port), "--protected-mode", "no", "--save", "", "--appendonly",
            "no", "--dir", directory, "--daemonize", "no", "--loglevel", "warning"]


def worker_command(python: str, url: str, name: str) -> list[str]:
    return [python, "-m", "rqrl", "worker", "--redis-url", url, "--name", name, "--log-level", "WARNING"]


def relay_command(python: str, listen: str, upstream: str, delay_ms: float, turns_path: str) -> list[str]:
    return [python, str(Path(__file__).resolve()), "--relay", listen, upstream, "--delay-ms", f"{delay_ms:g}",
            "--relay-turns", turns_path]


def redis_url(address: str, port: int) -> str:
    return f"redis://{address}:{port}/0"


def ours(namespaces: Sequence[str]) -> list[str]:
    """The namespaces of ``ip netns list`` output lines that this script creates (leftovers of a killed run)."""
    names = [line.split()[0] for line in namespaces if line.strip()]
    return [name for name in names if name.startswith(PREFIX)]


# ---- the table (pure) -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """What one learner process measured over its window (its JSON line)."""

    side: str  # "loopback" or "netem"
    workload: str
    envs: int
    round: int
    steps: int
    worker_rollouts: int  # rollouts of one worker's envs (a group: envs x rollout steps)
    seconds: float
    bytes_in: int
    bytes_out: int
    commands: dict[str, int]  # Redis's calls by command over the window
    ping_ms: float
    cores: dict[str, float]
    batches: int = 0  # collect_outputs calls
    round_trips: dict[str, int] | None = None  # "workers", "learner": round trips counted by the relay

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else float("nan")

    @staticmethod
    def from_json(line: str) -> Window:
        return Window(**json.loads(line))


@dataclass(frozen=True)
class Row:
    workload: str
    envs: int
    loopback: float
    netem: float
    ratio: float
    mb_in: float
    mb_out: float
    bytes_in_per_step: float
    bytes_out_per_step: float
    link_ceiling: float
    commands_per_rollout: float
    ping_loopback_ms: float
    ping_netem_ms: float
    worker_round_trips: float | None = None  # per worker rollout, each worker's
    learner_round_trips: float | None = None  # per batch


def round_trips_per(windows: Sequence[Window], role: str, unit: Callable[[Window], int]) -> float | None:
    """Median over windows of the relay's round-trip count for ``role`` per ``unit`` (None without a relay)."""
    values = [w.round_trips[role] / unit(w) for w in windows if w.round_trips is not None and unit(w) > 0]
    return statistics.median(values) if values else None


def summarize(windows: Sequence[Window]) -> list[Row]:
    """One row per (workload, envs): medians over rounds, the ratio as the median of per-round ratios; traffic
    and commands are the netem side's."""
    rows = []
    keys = sorted({(w.workload, w.envs) for w in windows}, key=lambda key: (WORKLOADS.index(key[0]), key[1]))
    middle = statistics.median
    for workload, envs in keys:
        mine = [w for w in windows if (w.workload, w.envs) == (workload, envs)]
        by_round: dict[int, dict[str, Window]] = {}
        for window in mine:
            by_round.setdefault(window.round, {})[window.side] = window
        pairs = [sides for sides in by_round.values() if {"loopback", "netem"} <= set(sides)]
        loopback = [w for w in mine if w.side == "loopback"]
        netem = [w for w in mine if w.side == "netem"]
        if not loopback or not netem:
            continue
        bytes_in = middle(w.bytes_in / w.steps if w.steps else float("nan") for w in netem)
        bytes_out = middle(w.bytes_out / w.steps if w.steps else float("nan") for w in netem)
        rows.append(Row(
            workload=workload, envs=envs,
            loopback=middle(w.steps_per_second for w in loopback), netem=middle(w.steps_per_second for w in netem),
            ratio=middle(p["netem"].steps_per_second / p["loopback"].steps_per_second for p in pairs)
            if pairs else float("nan"),
            mb_in=middle(w.bytes_in / w.seconds / 1e6 for w in netem),
            mb_out=middle(w.bytes_out / w.seconds / 1e6 for w in netem),
            bytes_in_per_step=bytes_in, bytes_out_per_step=bytes_out,
            link_ceiling=LINK_BYTES_PER_SECOND / max(bytes_in, bytes_out),
            commands_per_rollout=middle(sum(w.commands.values()) / w.worker_rollouts if w.worker_rollouts
                                        else float("nan") for w in netem),
            ping_loopback_ms=middle(w.ping_ms for w in loopback), ping_netem_ms=middle(w.ping_ms for w in netem),
            worker_round_trips=round_trips_per(netem, "workers", lambda w: w.worker_rollouts),
            learner_round_trips=round_trips_per(netem, "learner", lambda w: w.batches)))
    return rows


WORKLOAD_NAMES = {"cartpole": "CartPole-v1, 4-64-64-2 MLP", "frames": "84x84x4 uint8 frames, conv policy"}


def format_table(rows: Sequence[Row]) -> str:
    lines = ["| workload | envs per worker | loopback steps/s | netem steps/s | netem / loopback | Redis MB/s in / out "
             "| Redis bytes per step in / out | steps/s one 1 Gbit/s link carries | Redis commands per worker rollout "
             "| PING ms loopback / netem | round trips per worker rollout / per learner batch |",
             "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for row in rows:
        trips = " / ".join("-" if value is None else f"{value:.1f}"
                           for value in (row.worker_round_trips, row.learner_round_trips))
        lines.append(
            f"| {WORKLOAD_NAMES.get(row.workload, row.workload)} | {row.envs} | {row.loopback:,.0f} | {row.netem:,.0f} "
            f"| {row.ratio:.2f} | {row.mb_in:,.1f} / {row.mb_out:,.1f} | {row.bytes_in_per_step:,.0f} / "
            f"{row.bytes_out_per_step:,.0f} | {row.link_ceiling:,.0f} | {row.commands_per_rollout:,.1f} | "
            f"{row.ping_loopback_ms:.3f} / {row.ping_netem_ms:.3f} | {trips} |")
    return "\n".join(lines)


def top_commands(windows: Sequence[Window], top: int = 8) -> list[str]:
    """Per workload and envs: the most frequent Redis commands per worker rollout on the netem side (summed over
    its windows), e.g. ``cartpole, 8 envs: evalsha 3.0, llen 2.1``."""
    lines = []
    for workload, envs in sorted({(w.workload, w.envs) for w in windows if w.side == "netem"},
                                 key=lambda key: (WORKLOADS.index(key[0]), key[1])):
        mine = [w for w in windows if w.side == "netem" and (w.workload, w.envs) == (workload, envs)]
        rollouts = sum(w.worker_rollouts for w in mine)
        calls: dict[str, int] = {}
        for window in mine:
            for name, count in window.commands.items():
                calls[name] = calls.get(name, 0) + count
        if not rollouts:
            continue
        ranked = sorted(calls.items(), key=lambda item: (-item[1], item[0]))[:top]
        per_rollout = ", ".join(f"{name} {count / rollouts:.1f}" for name, count in ranked)
        lines.append(f"{workload}, {envs} envs: {per_rollout}")
    return lines


def format_windows(windows: Sequence[Window]) -> str:
    """Every window, in the order measured, with the cores each role used (CPU s per wall s)."""
    roles = ("workers", "learner", "redis", "relay", "machine")
    lines = ["| round | workload | envs | side | steps/s | PING ms | " + " | ".join(f"{r} cores" for r in roles) + " |",
             "|--:|:--|--:|:--|--:|--:|" + "--:|" * len(roles)]
    for w in windows:
        cores = " | ".join(f"{w.cores[role]:.2f}" if role in w.cores else "-" for role in roles)
        lines.append(f"| {w.round + 1} | {w.workload} | {w.envs} | {w.side} | {w.steps_per_second:,.0f} | "
                     f"{w.ping_ms:.3f} | {cores} |")
    return "\n".join(lines)


# ---- the host: checks, commands, cleanup ------------------------------------------------------------------------


def check_host() -> None:
    """Raise SetupError saying what to do if this is not root or ``ip``, ``tc`` or ``redis-server`` is missing."""
    if sys.platform != "linux":
        raise SetupError("it needs Linux (network namespaces, veth, tc)")
    if os.geteuid() != 0:
        raise SetupError("it creates network namespaces, which needs root: run it with sudo, e.g. `sudo "
                         ".venv/bin/python benchmarks/network.py` from the repository root")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise SetupError(f"{' and '.join(missing)} not found on PATH: install iproute2 (Debian/Ubuntu: "
                         f"`apt-get install iproute2`), or put /usr/sbin on PATH")
    if shutil.which("redis-server") is None:
        raise SetupError("redis-server not found on PATH: install Redis (Debian/Ubuntu: `apt-get install "
                         "redis-server`)")


def run_command(command: Sequence[str]) -> None:
    completed = subprocess.run(list(command), capture_output=True, text=True)
    if completed.returncode != 0:
        raise SetupError(f"`{' '.join(command)}` failed ({completed.returncode}): "
                         f"{(completed.stderr or completed.stdout).strip()}")


def namespace_pids(namespace: str) -> list[int]:
    completed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return [int(pid) for pid in completed.stdout.split() if pid.isdigit()]


def remove_namespaces(names: Sequence[str]) -> None:
    """Stop every process still in the named namespaces (only this script starts any there), then delete them."""
    pids = [pid for name in names for pid in namespace_pids(name)]
    signal_pids(pids, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    signal_pids([pid for pid in pids if alive(pid)], signal.SIGKILL)
    for name in names:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def leftover_namespaces() -> list[str]:
    completed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return ours(completed.stdout.splitlines())


def signal_pids(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def probe_link(wanted: str, delay_ms: float, rate: str) -> Link:
    """``wanted`` ("auto", "netem" or "relay") as this kernel allows: a netem qdisc is tried on a veth in a
    throwaway namespace."""
    if wanted == "relay":
        return Link("relay", delay_ms, rate)
    probe = PREFIX + "probe"
    try:
        run_command(["ip", "netns", "add", probe])
        run_command(["ip", "-n", probe, "link", "add", "rqp0", "type", "veth", "peer", "name", "rqp1"])
        completed = subprocess.run(qdisc_command(probe, "rqp0", Link("netem", delay_ms, rate), egress_of_machine=True),
                                   capture_output=True, text=True)
    finally:
        remove_namespaces([probe])
    if completed.returncode == 0:
        return Link("netem", delay_ms, rate)
    if wanted == "netem":
        raise SetupError(f"this kernel cannot add a netem qdisc ({completed.stderr.strip()}): it needs sch_netem "
                         f"(CONFIG_NET_SCH_NETEM; Debian/Ubuntu: the linux-modules-extra package, then `modprobe "
                         f"sch_netem`), or run with --link relay (or auto)")
    return Link("relay", delay_ms, rate)


@contextlib.contextmanager
def single_run() -> Iterator[None]:
    """One run at a time: the cleanup of leftovers would take a running benchmark's namespaces."""
    with open(LOCK_PATH, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EAGAIN, errno.EACCES):
                raise SetupError(f"another run of benchmarks/network.py holds {LOCK_PATH}: let it end") from None
            raise
        yield


def raise_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# ---- processes --------------------------------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(part for part in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if part)
    env["RQRL_SECRET"] = SECRET
    env.pop("REDIS_URL", None)
    return env


def die_with_parent_thread() -> None:
    """preexec_fn: the kernel sends the child SIGTERM when the thread that started it exits (PR_SET_PDEATHSIG), so
    a benchmark killed with SIGKILL leaves no worker or redis-server behind on loopback; in the namespaces the next
    run's cleanup finds them."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))


class Children:
    """Processes this run starts: stopped (SIGTERM, then SIGKILL) in reverse order at the end."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, command: Sequence[str], *, quiet: bool = False) -> subprocess.Popen[bytes]:
        log.debug("starting %s", " ".join(command))
        process = subprocess.Popen(list(command), cwd=REPO_ROOT, env=child_env(), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL if quiet else None, start_new_session=True,
                                   preexec_fn=die_with_parent_thread)
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + 15
        for process in reversed(self.processes):
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        self.processes.clear()


def wait_for_redis(host: str, port: int, namespace: str | None, process: subprocess.Popen[bytes]) -> None:
    """redis-server answers on host:port; from inside ``namespace``, where the address is."""
    probe = f"import redis; redis.Redis(host={host!r}, port={port}, socket_timeout=1).ping()"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SetupError(f"redis-server on {host}:{port} exited at start ({process.returncode})")
        if subprocess.run(netns_exec(namespace, [sys.executable, "-c", probe]), capture_output=True,
                          env=child_env()).returncode == 0:
            return
        time.sleep(0.2)
    raise SetupError(f"redis-server on {host}:{port} did not answer within 15 s")


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Side:
    """One side's stack: the URL the learner and workers use, and where the learner runs."""

    name: str
    url: str
    learner_namespace: str | None
    watch: dict[str, list[int]]
    turns: dict[str, Any] | None = None  # the relay's round-trip counts: {"path": ..., "roles": {address: role}}


def start_loopback(children: Children, args: argparse.Namespace, directory: str) -> Side:
    port = free_loopback_port()
    redis_process = children.start(redis_command("127.0.0.1", port, directory), quiet=True)
    wait_for_redis("127.0.0.1", port, None, redis_process)
    url = redis_url("127.0.0.1", port)
    workers = [children.start(worker_command(sys.executable, url, f"loopback-{index}"))
               for index in range(args.workers)]
    return Side("loopback", url, None, {"redis": [redis_process.pid], "workers": [w.pid for w in workers]})


def start_netem(children: Children, args: argparse.Namespace, topology: Topology, link: Link, directory: str) -> Side:
    redis_host = topology.host("redis")
    redis_process = children.start(netns_exec(redis_host.namespace, redis_command(
        redis_host.address, REDIS_PORT, directory)), quiet=True)
    wait_for_redis(redis_host.address, REDIS_PORT, topology.host("learner").namespace, redis_process)
    watch = {"redis": [redis_process.pid]}
    url = redis_url(redis_host.address, REDIS_PORT)
    if link.kind == "relay":
        turns_path = os.path.join(directory, "relay-turns.json")
        relay = children.start(netns_exec(BRIDGE_NAMESPACE, relay_command(
            sys.executable, f"{topology.bridge_address}:{REDIS_PORT}", f"{redis_host.address}:{REDIS_PORT}",
            link.delay_ms, turns_path)))
        wait_for_redis(topology.bridge_address, REDIS_PORT, topology.host("learner").namespace, relay)
        url = redis_url(topology.bridge_address, REDIS_PORT)
        watch["relay"] = [relay.pid]
    workers = [children.start(netns_exec(host.namespace, worker_command(sys.executable, url, f"netem-{index}")))
               for index, host in enumerate(topology.workers)]
    watch["workers"] = [worker.pid for worker in workers]
    turns = None
    if link.kind == "relay":
        roles = {host.address: "workers" for host in topology.workers}
        roles[topology.host("learner").address] = "learner"
        turns = {"path": turns_path, "roles": roles}
    return Side("netem", url, topology.host("learner").namespace, watch, turns)


def run_window(side: Side, workload: str, envs: int, round_index: int, args: argparse.Namespace) -> Window:
    """One learner process (in the learner's namespace on the netem side) measures one window."""
    spec = {"side": side.name, "workload": workload, "envs": envs, "round": round_index, "url": side.url,
            "workers": args.workers, "seconds": args.seconds, "warmup": args.warmup,
            "rollout_steps": args.rollout_steps or ROLLOUT_STEPS[workload], "watch": side.watch, "turns": side.turns}
    command = netns_exec(side.learner_namespace, [sys.executable, str(Path(__file__).resolve()), "--learner",
                                                  json.dumps(spec)])
    timeout = args.seconds + args.warmup + 300
    completed = subprocess.run(command, cwd=REPO_ROOT, env=child_env(), stdout=subprocess.PIPE, timeout=timeout,
                               stdin=subprocess.DEVNULL, preexec_fn=die_with_parent_thread)
    lines = completed.stdout.decode().strip().splitlines()
    if completed.returncode != 0 or not lines:
        raise RuntimeError(f"the {side.name} learner ({workload}, {envs} envs per worker) exited with "
                           f"{completed.returncode}; its log is above")
    return Window.from_json(lines[-1])


def run_benchmark(args: argparse.Namespace) -> None:
    check_host()
    with single_run():
        leftovers = leftover_namespaces()
        if leftovers:
            log.info("removing leftovers of an earlier run: %s", ", ".join(leftovers))
            remove_namespaces(leftovers)
        for folder in Path(tempfile.gettempdir()).glob(PREFIX + "*"):  # a killed run's temporary folder
            shutil.rmtree(folder, ignore_errors=True)
        link = probe_link(args.link, args.delay_ms, args.rate)
        topology = plan_topology(args.workers, args.subnet)
        log.info("link: %s", link.describe())
        children = Children()
        windows: list[Window] = []
        directory = tempfile.mkdtemp(prefix=PREFIX)
        try:
            for command in topology_commands(topology, link):
                run_command(command)
            os.mkdir(os.path.join(directory, "loopback"))
            os.mkdir(os.path.join(directory, "netem"))
            loopback = start_loopback(children, args, os.path.join(directory, "loopback"))
            netem = start_netem(children, args, topology, link, os.path.join(directory, "netem"))
            for round_index in range(args.rounds):
                for workload in args.workloads:
                    for envs in args.envs:
                        for side in [loopback, netem] if round_index % 2 == 0 else [netem, loopback]:
                            log.info("round %d/%d, %s, %d envs per worker: %s", round_index + 1, args.rounds,
                                     workload, envs, side.name)
                            window = run_window(side, workload, envs, round_index, args)
                            log.info("    %s steps/s, PING %.3f ms", f"{window.steps_per_second:,.0f}",
                                     window.ping_ms)
                            windows.append(window)
        finally:
            children.stop()
            remove_namespaces(topology.namespaces)
            shutil.rmtree(directory, ignore_errors=True)
    print_report(args, link, windows)


def print_report(args: argparse.Namespace, link: Link, windows: Sequence[Window]) -> None:
    import platform

    print()
    print(f"## Across machines, simulated: {args.workers} workers, {args.rounds} round(s) of {args.seconds:g} s "
          f"windows, loopback against namespaces")
    print()
    print(f"link: {link.describe()}")
    print(f"machine: {os.cpu_count()} logical CPUs, {platform.python_implementation()} {platform.python_version()}, "
          f"{platform.release()}")
    print()
    print(format_table(summarize(windows)))
    print()
    print("Steps/s: medians over rounds; netem / loopback: the median of per-round ratios. Redis traffic and "
          "commands: the netem side's window (Redis's own counters). 'steps/s one 1 Gbit/s link carries' = 125 MB/s "
          "over the larger of the bytes in and out per step: Redis's NIC carries both. PING: the median round trip "
          f"of {PING_COUNT} PINGs from the learner's machine. Round trips: counted by the relay (none with netem): "
          "a client's bytes after a reply start one, requests sent ahead of a reply count with it.")
    print()
    print("Redis commands per worker rollout, the most frequent (netem side):")
    for line in top_commands(windows):
        print(f"- {line}")
    print()
    print(format_windows(windows))


# ---- the learner process (--learner) -----------------------------------------------------------------------------


def make_cartpole() -> Any:
    """CartPole-v1 (module level: the workers import it by name)."""
    import gymnasium

    return gymnasium.make("CartPole-v1")


def workload_parts(workload: str) -> tuple[Callable[[], Any], Any]:
    """(env factory, policy) of a workload: benchmarks/scale.py's MLP, benchmarks/image_obs.py's env and conv net."""
    if workload == "cartpole":
        from benchmarks.scale import make_policy

        return make_cartpole, make_policy()
    from benchmarks.image_obs import ConvPolicy, make_env

    return make_env, ConvPolicy().eval()


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_busy_seconds() -> float:
    with open("/proc/stat") as file:
        fields = [int(value) for value in file.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4] - sum(fields[8:10])) / CLOCK_TICKS


def cpu_snapshot(watch: dict[str, list[int]]) -> dict[str, float]:
    times = os.times()
    snapshot = {role: sum(cpu_seconds(pid) for pid in pids) for role, pids in watch.items()}
    snapshot["learner"] = times.user + times.system
    snapshot["machine"] = machine_busy_seconds()
    return snapshot


def relay_round_trips(turns: dict[str, Any] | None) -> dict[str, int] | None:
    """The relay's round-trip counts so far by role ("workers", "learner"), from the file it rewrites every
    RELAY_TURNS_PERIOD seconds; None without a relay."""
    if turns is None:
        return None
    try:
        with open(turns["path"]) as file:
            by_address: dict[str, int] = json.load(file)
    except (OSError, ValueError):
        by_address = {}
    by_role = {"workers": 0, "learner": 0}
    for address, count in by_address.items():
        role = turns["roles"].get(address)
        if role is not None:
            by_role[role] += count
    return by_role


def learner_main(spec: dict[str, Any]) -> None:
    """Wait for the workers, PING, then one window of collect_outputs; print the Window as one JSON line."""
    import redis
    import torch

    from benchmarks.scale import RedisCost
    from rqrl import RedisDistributedActors

    torch.set_num_threads(1)
    client = redis.Redis.from_url(spec["url"])
    deadline = time.monotonic() + 120
    while client.scard(QUEUE_KEY) < spec["workers"]:
        if time.monotonic() > deadline:
            raise SetupError(f"{spec['workers']} workers did not register on {spec['url']} within 120 s")
        time.sleep(0.1)
    pings = []
    for _ in range(PING_COUNT):
        started = time.perf_counter()
        client.ping()
        pings.append((time.perf_counter() - started) * 1000.0)
    env_factory, policy = workload_parts(spec["workload"])
    n_actors = spec["workers"] * spec["envs"]
    run = RedisDistributedActors(env_factory, policy, spec["rollout_steps"], n_actors, n_actors, 2.0,
                                 redis_url=spec["url"], n_local_workers=0, secret=SECRET,
                                 run_name=f"bench-{spec['side']}-{spec['workload']}-{spec['envs']}-{spec['round']}")
    with run:
        run.broadcast_updated_policy(policy.state_dict())
        run.collect_outputs("cpu")  # includes the workers' start on this run: not measured
        warm_until = time.perf_counter() + spec["warmup"]
        while time.perf_counter() < warm_until:
            run.collect_outputs("cpu")
        cost_before, cpu_before = RedisCost.read(client), cpu_snapshot(spec["watch"])
        turns_before = relay_round_trips(spec["turns"])
        steps = worker_rollouts = batches = 0
        started = time.perf_counter()
        while time.perf_counter() - started < spec["seconds"]:
            rewards = run.collect_outputs("cpu").record.rewards
            steps += int(rewards.numel())
            worker_rollouts += int(rewards.shape[1]) // spec["envs"]  # each worker's group: envs columns
            batches += 1
        elapsed = time.perf_counter() - started
        turns_after = relay_round_trips(spec["turns"])
        cpu_after = cpu_snapshot(spec["watch"])
        cost = RedisCost.read(client).since(cost_before)
    round_trips = None
    if turns_before is not None and turns_after is not None:
        round_trips = {role: turns_after[role] - turns_before.get(role, 0) for role in turns_after}
    cores = {role: (cpu_after[role] - cpu_before[role]) / elapsed for role in cpu_after}
    window = Window(side=spec["side"], workload=spec["workload"], envs=spec["envs"], round=spec["round"], steps=steps,
                    worker_rollouts=worker_rollouts, seconds=elapsed, bytes_in=cost.bytes_in,
                    bytes_out=cost.bytes_out, commands=cost.commands, ping_ms=statistics.median(pings), cores=cores,
                    batches=batches, round_trips=round_trips)
    print(json.dumps(dataclasses.asdict(window)), flush=True)


# ---- the relay process (--relay) ---------------------------------------------------------------------------------


RELAY_CHUNK = 256 * 1024


class RoundTrips:
    """Round trips that clients start through the relay, by client address: a client's bytes that follow a reply
    (or open the connection) start one. Requests sent ahead of a reply (pipelines, pushes whose reply is read
    later) count once with it: the count is of exchanges on the wire, not only those a client waited for."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()

    def add(self, address: str) -> None:
        with self.lock:
            self.counts[address] = self.counts.get(address, 0) + 1

    def write_forever(self, path: str, period: float) -> None:
        while True:
            with self.lock:
                text = json.dumps(self.counts)
            with open(path + ".tmp", "w") as file:
                file.write(text)
            os.replace(path + ".tmp", path)
            time.sleep(period)


RELAY_TURNS_PERIOD = 0.02


def relay_main(listen: str, upstream: str, delay_seconds: float, turns_path: str | None = None) -> None:
    """Accept TCP connections on ``listen`` and pass each one's bytes to and from ``upstream``, every chunk held
    ``delay_seconds`` in each direction (a thread reads, another writes what is due, so bytes keep flowing);
    with ``turns_path``, the round trips of each client address go to that file (JSON), rewritten every
    RELAY_TURNS_PERIOD seconds."""
    host, port = listen.rsplit(":", 1)
    upstream_host, upstream_port = upstream.rsplit(":", 1)
    server = socket.create_server((host, int(port)), backlog=256)
    round_trips = RoundTrips()
    if turns_path is not None:
        threading.Thread(target=round_trips.write_forever, args=(turns_path, RELAY_TURNS_PERIOD), daemon=True).start()
    while True:
        client, address = server.accept()
        threading.Thread(target=relay_connection, args=(client, (upstream_host, int(upstream_port)), delay_seconds,
                                                        round_trips, address[0]), daemon=True).start()


def relay_connection(client: socket.socket, upstream: tuple[str, int], delay_seconds: float,
                     round_trips: RoundTrips | None = None, address: str = "") -> None:
    try:
        server = socket.create_connection(upstream)
    except OSError:
        client.close()
        return
    sockets = (client, server)
    for sock in sockets:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    remaining = [2]
    lock = threading.Lock()
    replied = [True]  # the server spoke last: the client's next bytes start a round trip

    def finished() -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0] == 0:
                for sock in sockets:
                    sock.close()

    def request() -> None:
        if replied[0]:
            replied[0] = False
            if round_trips is not None:
                round_trips.add(address)

    def reply() -> None:
        replied[0] = True

    for source, target, seen in ((client, server, request), (server, client, reply)):
        chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()
        threading.Thread(target=relay_read, args=(source, chunks, delay_seconds, seen), daemon=True).start()
        threading.Thread(target=relay_write, args=(target, chunks, sockets, finished), daemon=True).start()


def relay_read(source: socket.socket, chunks: queue.SimpleQueue[tuple[float, bytes]], delay_seconds: float,
               seen: Callable[[], None]) -> None:
    while True:
        try:
            data = source.recv(RELAY_CHUNK)
        except OSError:
            data = b""
        if data:
            seen()
        chunks.put((time.monotonic() + delay_seconds, data))
        if not data:
            return


def relay_write(target: socket.socket, chunks: queue.SimpleQueue[tuple[float, bytes]],
                sockets: tuple[socket.socket, socket.socket], finished: Callable[[], None]) -> None:
    """Send each chunk when it is due, together with any others already due; EOF passes on as a half-close, an
    error closes both ways."""
    pending: tuple[float, bytes] | None = None
    try:
        while True:
            due, data = pending if pending is not None else chunks.get()
            pending = None
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            batch = [data] if data else []
            ended = not data
            while not ended:
                try:
                    due, more = chunks.get_nowait()
                except queue.Empty:
                    break
                if due > time.monotonic():
                    pending = (due, more)
                    break
                if not more:
                    ended = True
                else:
                    batch.append(more)
            if batch:
                target.sendall(b"".join(batch) if len(batch) > 1 else batch[0])
            if ended:
                with contextlib.suppress(OSError):
                    target.shutdown(socket.SHUT_WR)
                return
    except OSError:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
    finally:
        finished()


# ---- command line ------------------------------------------------------------------------------------------------


def check_main(args: argparse.Namespace) -> int:
    """--check: exit 0 and say which link this machine gives, or exit 2 and say what is missing."""
    try:
        check_host()
        with single_run():
            link = probe_link(args.link, args.delay_ms, args.rate)
    except SetupError as error:
        print(f"cannot run: {error}")
        return 2
    print(f"can run; link: {link.describe()}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="rqrl worker processes (machines) per side")
    parser.add_argument("--envs", type=int, nargs="+", default=[8], help="envs per worker")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement window")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds after the first batch")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (the sides alternate which goes first)")
    parser.add_argument("--rollout-steps", type=int, default=None,
                        help="n_rollout_steps (default: 128 for CartPole, 64 for frames)")
    parser.add_argument("--link", choices=("auto", "netem", "relay"), default="auto",
                        help="how the delay is made (see the module docstring)")
    parser.add_argument("--delay-ms", type=float, default=1.0, help="one-way delay between machines")
    parser.add_argument("--rate", default="1gbit", help="each machine's link rate, as tc writes it")
    parser.add_argument("--subnet", default=DEFAULT_SUBNET, help="private IPv4 subnet for the machines")
    parser.add_argument("--check", action="store_true", help="only say whether this machine can run it, and how")
    parser.add_argument("--learner", metavar="JSON", help=argparse.SUPPRESS)
    parser.add_argument("--relay", nargs=2, metavar=("LISTEN", "UPSTREAM"), help=argparse.SUPPRESS)
    parser.add_argument("--relay-turns", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.workers < 1 or min(args.envs) < 1 or args.rounds < 1 or args.seconds <= 0 or args.warmup < 0:
        parser.error("expected --workers, --envs, --rounds >= 1, --seconds > 0 and --warmup >= 0")
    if args.rollout_steps is not None and args.rollout_steps < 1 or args.delay_ms < 0:
        parser.error("expected --rollout-steps >= 1 and --delay-ms >= 0")
    try:
        plan_topology(args.workers, args.subnet)
    except ValueError as error:
        parser.error(str(error))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    if args.relay:
        relay_main(args.relay[0], args.relay[1], args.delay_ms / 1000.0, args.relay_turns)
        return 0
    if args.learner:
        if str(REPO_ROOT) not in sys.path:
            sys.path.insert(0, str(REPO_ROOT))
        learner_main(json.loads(args.learner))
        return 0
    if args.check:
        return check_main(args)
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    signal.signal(signal.SIGHUP, raise_on_sigterm)
    try:
        run_benchmark(args)
    except SetupError as error:
        print(f"benchmarks/network.py: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("benchmarks/network.py: interrupted; its namespaces and processes are removed", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
