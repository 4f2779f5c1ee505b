"""benchmarks/network.py's pure parts: addresses and names, the ip and tc commands, the table, and the relay that
stands in for netem's delay (in threads on loopback: no root, no namespace, no process)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from benchmarks.network import (
    BRIDGE_NAMESPACE,
    PREFIX,
    Link,
    RoundTrips,
    Window,
    format_table,
    netns_exec,
    ours,
    parse_args,
    plan_topology,
    relay_connection,
    summarize,
    top_commands,
    topology_commands,
)


def test_addresses_bridge_redis_learner_then_workers_from_the_tenth() -> None:
    topology = plan_topology(3)
    assert topology.bridge_address == "10.213.0.1"
    assert [(h.role, h.namespace, h.address) for h in topology.hosts] == [
        ("redis", "rqrl-bench-redis", "10.213.0.2"), ("learner", "rqrl-bench-learner", "10.213.0.3"),
        ("worker-0", "rqrl-bench-worker-0", "10.213.0.10"), ("worker-1", "rqrl-bench-worker-1", "10.213.0.11"),
        ("worker-2", "rqrl-bench-worker-2", "10.213.0.12")]
    assert [host.role for host in topology.workers] == ["worker-0", "worker-1", "worker-2"]
    assert topology.namespaces[0] == BRIDGE_NAMESPACE
    assert all(name.startswith(PREFIX) for name in topology.namespaces)
    assert len({host.peer for host in topology.hosts}) == 5


def test_a_large_subnet_holds_many_workers_and_a_small_one_says_how_many_it_holds() -> None:
    topology = plan_topology(245, "10.99.0.0/24")
    assert topology.workers[-1].address == "10.99.0.254"
    assert all(len(host.peer) <= 15 for host in topology.hosts)  # IFNAMSIZ
    assert plan_topology(1, "10.99.0.0/28").workers[0].address == "10.99.0.10"
    with pytest.raises(ValueError, match="room for 245 workers, not 246"):
        plan_topology(246, "10.99.0.0/24")
    with pytest.raises(ValueError, match="room for 5 workers"):
        plan_topology(6, "10.99.0.0/28")


def qdiscs(commands: list[list[str]]) -> dict[tuple[str, str], list[str]]:
    """(namespace, interface) -> what follows `root` in its `tc qdisc replace` command."""
    return {(c[2], c[6]): c[8:] for c in commands if c[0] == "tc"}


def test_netem_delays_each_machines_egress_once_and_limits_both_directions() -> None:
    topology = plan_topology(2)
    commands = topology_commands(topology, Link("netem", 1.0, "1gbit"))
    assert all(command[0] in ("ip", "tc") for command in commands)
    shaped = qdiscs(commands)
    assert len(shaped) == 2 * len(topology.hosts)
    for host in topology.hosts:
        assert shaped[(host.namespace, "eth0")] == ["netem", "limit", "10000", "delay", "1ms", "rate", "1gbit"]
        assert shaped[(BRIDGE_NAMESPACE, host.peer)] == ["netem", "limit", "10000", "rate", "1gbit"]
        assert ["ip", "-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0"] in commands
        assert ["ip", "-n", BRIDGE_NAMESPACE, "link", "set", host.peer, "master", "rqbr0", "up"] in commands
    assert not any("addr" in command and BRIDGE_NAMESPACE in command for command in commands)  # no relay address
    # a namespace exists before anything is put in it
    added = [command[3] for command in commands if command[:3] == ["ip", "netns", "add"]]
    assert added == topology.namespaces
    first_use = {name: next(i for i, c in enumerate(commands) if name in c) for name in added}
    assert all(commands[first_use[name]][:3] == ["ip", "netns", "add"] for name in added)


def test_relay_link_shapes_with_tbf_and_gives_the_bridge_the_relays_address() -> None:
    topology = plan_topology(1)
    commands = topology_commands(topology, Link("relay", 1.0, "1gbit"))
    assert set(map(tuple, qdiscs(commands).values())) == {("tbf", "rate", "1gbit", "burst", "128kb", "latency",
                                                           "10ms")}
    assert ["ip", "-n", BRIDGE_NAMESPACE, "addr", "add", "10.213.0.1/24", "dev", "rqbr0"] in commands


def test_link_descriptions_say_one_way_and_round_trip() -> None:
    assert "1 ms one way, 2 ms round trip" in Link("netem", 1.0, "1gbit").describe()
    assert "no sch_netem" in Link("relay", 0.5, "1gbit").describe()
    assert "1 ms round trip" in Link("relay", 0.5, "1gbit").describe()


def test_commands_in_a_namespace_and_leftovers_by_prefix() -> None:
    assert netns_exec(None, ["redis-server", "--port", "1"]) == ["redis-server", "--port", "1"]
    assert netns_exec("rqrl-bench-redis", ["redis-server"]) == ["ip", "netns", "exec", "rqrl-bench-redis",
                                                                "redis-server"]
    listed = ["rqrl-bench-worker-0 (id: 4)", "other-ns", "rqrl-bench-net", "", "rqrl-benchmark-x (id: 1)"]
    assert ours(listed) == ["rqrl-bench-worker-0", "rqrl-bench-net"]


def window(side: str, round_index: int, steps: int, *, workload: str = "cartpole", envs: int = 8,
           ping_ms: float = 0.05) -> Window:
    rollouts = steps // (128 * envs)
    return Window(side=side, workload=workload, envs=envs, round=round_index, steps=steps, worker_rollouts=rollouts,
                  seconds=2.0, bytes_in=steps * 100, bytes_out=steps * 50,
                  commands={"evalsha": 6 * rollouts, "get": 3 * rollouts, "ping": 1 * rollouts}, ping_ms=ping_ms,
                  cores={"workers": 1.5})


def test_summary_takes_medians_and_the_median_of_per_round_ratios() -> None:
    windows = [window("loopback", 0, 128_000), window("netem", 0, 64_000, ping_ms=2.1),
               window("netem", 1, 25_600, ping_ms=2.3), window("loopback", 1, 12_800),
               window("netem", 2, 76_800, ping_ms=2.2), window("loopback", 2, 256_000),
               window("loopback", 0, 25_600, workload="frames", envs=32),
               window("netem", 0, 12_800, workload="frames", envs=32)]
    cartpole, frames = summarize(windows)
    assert (cartpole.workload, cartpole.envs, frames.workload, frames.envs) == ("cartpole", 8, "frames", 32)
    assert cartpole.loopback == 64_000 and cartpole.netem == 32_000  # medians of steps / 2 s
    assert cartpole.ratio == pytest.approx(0.5)  # per round: 0.5, 2.0, 0.3: not 32,000 / 64,000 by chance
    assert cartpole.bytes_in_per_step == pytest.approx(100) and cartpole.bytes_out_per_step == pytest.approx(50)
    assert cartpole.mb_in == pytest.approx(32_000 * 100 / 1e6)
    assert cartpole.link_ceiling == pytest.approx(125e6 / 100)  # the larger direction fills the link first
    assert cartpole.commands_per_rollout == pytest.approx(10)
    assert (cartpole.ping_loopback_ms, cartpole.ping_netem_ms) == (0.05, 2.2)
    table = format_table([cartpole, frames]).splitlines()
    assert table[0].startswith("| workload | envs per worker | loopback steps/s | netem steps/s | netem / loopback |")
    cells = [cell.strip() for cell in table[2].strip("|").split("|")]
    assert cells == ["CartPole-v1, 4-64-64-2 MLP", "8", "64,000", "32,000", "0.50", "3.2 / 1.6", "100 / 50",
                     "1,250,000", "10.0", "0.050 / 2.200", "- / -"]  # netem: no relay counted round trips
    assert table[3].startswith("| 84x84x4 uint8 frames, conv policy | 32 | 12,800 | 6,400 | 0.50 |")


def test_relay_round_trips_per_worker_rollout_and_per_learner_batch() -> None:
    windows = [window("loopback", 0, 10_240), window("loopback", 1, 10_240)]
    for round_index, trips in enumerate((4, 6)):
        netem = window("netem", round_index, 10_240)  # 10 worker rollouts
        windows.append(Window(**{**netem.__dict__, "batches": 5,
                                 "round_trips": {"workers": 10 * trips, "learner": 5 * (trips + 1)}}))
    (row,) = summarize(windows)
    assert (row.worker_round_trips, row.learner_round_trips) == (5.0, 6.0)
    assert format_table([row]).splitlines()[2].endswith("| 5.0 / 6.0 |")


def test_top_commands_per_worker_rollout_of_the_netem_side() -> None:
    windows = [window("netem", 0, 10_240), window("netem", 1, 20_480), window("loopback", 0, 1_024_000)]
    windows[1].commands["llen"] = 30  # 30 calls over the two windows' 30 rollouts
    assert top_commands(windows, top=3) == ["cartpole, 8 envs: evalsha 6.0, get 3.0, llen 1.0"]


def test_a_workload_measured_on_one_side_only_has_no_row() -> None:
    assert summarize([window("loopback", 0, 1280)]) == []


def test_arguments_are_checked() -> None:
    args = parse_args([])
    assert (args.workers, args.envs, args.rounds, args.link, args.delay_ms, args.rate) == (2, [8], 2, "auto", 1.0,
                                                                                           "1gbit")
    assert args.workloads == ["cartpole", "frames"]
    for wrong in (["--workers", "0"], ["--seconds", "0"], ["--delay-ms", "-1"], ["--workers", "300"],
                  ["--link", "wire"]):
        with pytest.raises(SystemExit):
            parse_args(wrong)


def test_relay_holds_bytes_each_way_and_passes_an_end_of_stream_on() -> None:
    delay = 0.05
    upstream = socket.create_server(("127.0.0.1", 0))
    front = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:  # upstream: echo until the relay half-closes, then close
        connection, _ = upstream.accept()
        with connection:
            while data := connection.recv(65536):
                connection.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    client = socket.create_connection(front.getsockname())
    accepted, _ = front.accept()
    round_trips = RoundTrips()
    relay_connection(accepted, upstream.getsockname(), delay, round_trips, "10.0.0.7")
    try:
        payload = bytes(range(256)) * 4096  # 1 MiB: chunks of the relay's reads come back in order
        started = time.monotonic()
        client.sendall(b"ping")
        assert client.recv(16) == b"ping"
        assert time.monotonic() - started >= 2 * delay  # held once each way
        client.sendall(b"a")
        client.sendall(b"b")  # sent ahead of the reply to "a": the same round trip
        received = b""
        while len(received) < 2:
            received += client.recv(16)
        assert received == b"ab" and round_trips.counts == {"10.0.0.7": 2}
        client.sendall(payload)
        client.shutdown(socket.SHUT_WR)
        received = bytearray()
        while data := client.recv(65536):
            received += data
        assert bytes(received) == payload  # and the upstream's close came back as the end of the stream
    finally:
        client.close()
        upstream.close()
        front.close()
