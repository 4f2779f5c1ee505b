"""The peers report (benchmarks/peers/run.py): medians, paired ratios to rqrl, and peers that are missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.peers.run import (
    ATARI_PEERS,
    PEERS,
    Results,
    build_table,
    command,
    install_status,
    median_ratio,
    parse_args,
)


def results_of(rates: dict[str, dict[int, list[float | None]]]) -> Results:
    results = Results(envs_per_worker=[8, 32], systems=list(rates))
    for system, by_envs in rates.items():
        for envs, values in by_envs.items():
            for value in values:
                results.add(system, envs, value)
    return results


def rows(table: str) -> dict[str, list[str]]:
    return {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")]
                                          for line in table.splitlines() if line.startswith("| ") and "--" not in line)}


def test_table_has_a_row_per_e_with_median_rates_and_paired_ratios_to_rqrl() -> None:
    results = results_of({
        "rqrl": {8: [100.0, 200.0, 400.0], 32: [1000.0, 1000.0, 1000.0]},
        "reference": {8: [200.0, 200.0, 200.0], 32: [2000.0, 1500.0, 1000.0]},
        "pufferlib": {8: [100.0, 50.0, 400.0], 32: [500.0, 2000.0, 250.0]},
    })
    table = build_table(results)
    by_e = rows(table)
    assert by_e["E (envs per worker)"] == ["E (envs per worker)", "rqrl steps/s", "reference steps/s",
                                           "reference / rqrl", "PufferLib steps/s", "PufferLib / rqrl"]
    # E=8: pufferlib's per-round ratios are 1.0, 0.25, 1.0: median 1.00, not the ratio of the medians (100 / 200)
    assert by_e["8"] == ["8", "200", "200", "1.00", "100", "1.00"]
    assert by_e["32"] == ["32", "1,000", "1,500", "1.50", "500", "0.50"]


def test_missing_and_failed_peers_are_named_with_their_reason() -> None:
    results = results_of({"rqrl": {8: [100.0], 32: [100.0]}, "torchrl": {8: [None], 32: [80.0]}})
    results.failures["torchrl"] = ["E=8: exit code 1: boom"]
    results.not_installed["sample_factory"] = "pip install sample-factory gymnasium failed (ERROR: no wheel)"
    table = build_table(results)
    assert rows(table)["8"] == ["8", "100", "n/a", "n/a"]
    assert rows(table)["32"] == ["32", "100", "80", "0.80"]
    assert "- Sample Factory: did not install: pip install sample-factory gymnasium failed (ERROR: no wheel)" in table
    assert "- TorchRL: failed to run: E=8: exit code 1: boom" in table


def test_ratio_skips_rounds_where_either_side_failed() -> None:
    results = results_of({"rqrl": {8: [100.0, None, 100.0]}, "rllib": {8: [50.0, 10.0, None]}})
    assert median_ratio(results, "rllib", 8) == 0.5
    assert median_ratio(results, "rllib", 32) is None


def test_install_status_reads_what_install_sh_left(tmp_path: Path) -> None:
    (tmp_path / "rllib").mkdir()
    (tmp_path / "rllib" / "STATUS").write_text("ok python 3.11.7, torch 2.13.0+cpu, ray 2.60.0\n")
    (tmp_path / "pufferlib").mkdir()
    (tmp_path / "pufferlib" / "STATUS").write_text("failed: pip install pufferlib gymnasium failed (ERROR: x)\n")
    assert install_status("rllib", tmp_path) == (True, "python 3.11.7, torch 2.13.0+cpu, ray 2.60.0")
    assert install_status("pufferlib", tmp_path) == (False, "pip install pufferlib gymnasium failed (ERROR: x)")
    assert install_status("torchrl", tmp_path) == (False, "not installed (run benchmarks/peers/install.sh)")


def test_atari_workload_runs_its_own_peers_and_tells_every_script() -> None:
    args = parse_args(["--workload", "atari", "--envs-per-worker", "8"])
    assert args.peers == list(ATARI_PEERS) == ["sample_factory", "rllib", "envpool"]
    assert command("envpool", 8, args)[-2:] == ["--workload", "atari"]
    assert parse_args([]).peers == list(PEERS)  # the CartPole workload keeps its peers


def test_peers_atari_policy_is_image_obs_conv_policy_weight_for_weight() -> None:
    torch = pytest.importorskip("torch")
    from benchmarks.image_obs import ConvPolicy
    from benchmarks.peers.harness import ATARI_ACTIONS, make_conv_policy

    ours, theirs = ConvPolicy(n_actions=ATARI_ACTIONS).state_dict(), make_conv_policy().state_dict()
    assert list(ours) == list(theirs)
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)


def test_steps_per_cpu_second_get_their_own_table_where_measured() -> None:
    results = Results(envs_per_worker=[8], systems=["rqrl", "envpool"])
    results.add("rqrl", 8, 100.0, 400.0)
    results.add("envpool", 8, 200.0, 200.0)
    table = build_table(results)
    second = table[table.index("Env steps per CPU second"):]
    assert "| E (envs per worker) | rqrl steps/CPU s | EnvPool steps/CPU s | EnvPool / rqrl |" in second
    assert "| 8 | 400 | 200 | 0.50 |" in second
    assert "| 8 | 100 | 200 | 2.00 |" in table  # steps/s first
    assert "per CPU second" not in build_table(results_of({"rqrl": {8: [100.0]}}))
