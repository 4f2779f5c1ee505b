"""Smoke runs of the benchmark scripts at a tiny size: they run to the end and print their tables.
No timed assertion: the numbers are the scripts' business, not the tests'."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.children import REPO_ROOT, worker_env


def run_benchmark(script: str, *arguments: str, timeout: float = 240) -> str:
    completed = subprocess.run([sys.executable, f"benchmarks/{script}", *arguments], cwd=REPO_ROOT,
                               env=worker_env(), capture_output=True, text=True, timeout=timeout)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout


@pytest.mark.timeout(300)
def test_actors_throughput_prints_rqrl_reference_and_loop_for_each_configuration() -> None:
    out = run_benchmark("actors_throughput.py", "--seconds", "0.3", "--warmup", "0", "--rounds", "1",
                        "--workers", "1", "--actors-per-worker", "2", "3", "--rollout-steps", "8",
                        "--quiet-wait", "0")
    assert "| workers | envs per worker | rqrl steps/s | reference steps/s | rqrl / reference |" in out
    rows = [line for line in out.splitlines() if line.startswith("| 1 | 2 |") or line.startswith("| 1 | 3 |")]
    assert len(rows) == 4, out  # the summary and the per-round row of each configuration
    for row in rows:
        rates = [cell.strip().replace(",", "") for cell in row.strip("|").split("|")][2:4]
        assert all(float(rate) > 0 for rate in rates), row


@pytest.mark.timeout(300)
def test_actors_throughput_alternating_prints_paired_ratios_and_the_references_autoresets() -> None:
    out = run_benchmark("actors_throughput.py", "--seconds", "0.3", "--warmup", "0", "--alternate", "2",
                        "--workers", "1", "--actors-per-worker", "2", "--rollout-steps", "8")
    rows = [line for line in out.splitlines() if line.startswith("| 1 | 2 |")]
    assert len(rows) == 1, out
    cells = [cell.strip().replace(",", "") for cell in rows[0].strip("|").split("|")]
    assert float(cells[2]) > 0 and float(cells[3]) > 0, rows[0]  # rqrl and reference steps/s
    assert cells[5] in ("0/2", "1/2", "2/2"), rows[0]  # pairs at or above 0.9
    assert 0 < float(cells[6].rstrip("%")) < 100, rows[0]  # CartPole's episodes end: some autoreset steps
    assert out.count("1x2: ") == 1 and len(out.split("1x2: ")[1].split(",")) == 2, out  # one ratio per pair


@pytest.mark.timeout(200)
def test_rollout_loop_prints_loop_and_reference_per_env() -> None:
    out = run_benchmark("rollout_loop.py", "--envs", "2", "--env-ids", "CartPole-v1", "--steps", "8",
                        "--rollouts", "3", "--rounds", "1")
    rows = [line for line in out.splitlines() if line.startswith("| CartPole-v1 | 2 |")]
    assert len(rows) == 1, out
    cells = [cell.strip().replace(",", "") for cell in rows[0].strip("|").split("|")]
    assert float(cells[2]) > 0 and float(cells[3]) > 0 and float(cells[4]) > 0, rows[0]


@pytest.mark.timeout(300)
def test_request_frames_prints_bytes_cpu_and_round_trips_of_both_requests() -> None:
    out = run_benchmark("request_frames.py", "--threads", "2", "--steps", "6", "--seconds", "0.3", "--rounds", "1",
                        "--repeats", "1", "--sources", "random", "--models", "mean-pixel")
    encoding = {line.split("|")[2].strip(): [cell.strip().replace(",", "") for cell in line.strip("|").split("|")]
                for line in out.splitlines() if line.startswith("| random |")}
    whole, frames = encoding["whole stacks (before)"], encoding["frames the server lacks (now)"]
    assert float(frames[2]) < 0.5 * float(whole[2]), out  # one new frame of four, after the first step
    assert all(float(cell) > 0 for cell in (*whole[3:5], *frames[3:5])), out
    trips = [[cell.strip().replace(",", "") for cell in line.strip("|").split("|")]
             for line in out.splitlines() if line.startswith("| mean-pixel | random |")]
    assert len(trips) == 2 and all(float(row[3]) > 0 for row in trips), out
    assert float(trips[1][5]) > 0, out  # the ratio


@pytest.mark.timeout(300)
def test_server_batch_prints_the_servers_cpu_for_both_requests() -> None:
    out = run_benchmark("server_batch.py", "--clients", "2", "--threads", "2", "--steps", "4", "--repeats", "1",
                        "--sources", "random")
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("| random | . |")]
    assert len(rows) == 1 and float(rows[0][2]) > 0 and float(rows[0][3]) > 0, out


@pytest.mark.timeout(300)
def test_inference_prints_round_trips_and_the_seed_comparison() -> None:
    out = run_benchmark("inference.py", "--seconds", "0.3", "--batch-sizes", "2", "--threads", "2", "--envs", "2",
                        "--hidden", "8")
    rows = [line for line in out.splitlines() if line.startswith("| 2 | 2 |")]
    assert len(rows) == 1, out
    cells = [cell.strip().replace(",", "") for cell in rows[0].strip("|").split("|")]
    assert float(cells[2]) > 0 and float(cells[4]) > 0, rows[0]  # p50 latency, inferences/s
    assert 1 <= float(cells[6]) <= 2, rows[0]  # observations per request: the two threads ask alone or together
    seed_rows = [line for line in out.splitlines() if line.startswith("| 8 |")]
    assert len(seed_rows) == 1, out
    cells = [cell.strip().replace(",", "") for cell in seed_rows[0].strip("|").split("|")]
    seed, per_request, per_actor = map(float, cells[1:4])
    assert seed > 0 and per_actor > 0 and 1 <= per_request <= 2, seed_rows[0]


@pytest.mark.timeout(300)
def test_scale_prints_linear_ratio_and_redis_cost_per_worker_count() -> None:
    out = run_benchmark("scale.py", "--workers", "1", "2", "--seconds", "0.5", "--warmup", "0",
                        "--rollout-steps", "8", "--actors-per-worker", "2", "--step-ms", "1")
    for workers in ("1", "2"):
        rows = [line for line in out.splitlines() if line.startswith(f"| {workers} |")]
        assert len(rows) == 2, out  # the scaling row and the Redis-cost row
        scaling = [cell.strip().replace(",", "") for cell in rows[0].strip("|").split("|")]
        assert float(scaling[1]) > 0 and float(scaling[2]) > 0, rows[0]
        cost = [cell.strip().replace(",", "") for cell in rows[1].strip("|").split("|")]
        assert float(cost[1]) > 0 and "eval" in cost[-1], rows[1]


@pytest.mark.timeout(300)
def test_pop_ahead_prints_both_settings_and_their_ratio_for_each_training_step() -> None:
    out = run_benchmark("pop_ahead.py", "--envs", "2", "--seconds", "0.5", "--warmup", "0", "--rollout-steps", "8",
                        "--train-ms", "0", "20")
    rows = [line for line in out.splitlines() if line.startswith("| sleep")]
    assert [row.split("|")[1].strip() for row in rows] == ["sleep 0 ms", "sleep 20 ms"], out
    for row in rows:
        off, on, ratio, collect_off, collect_on = (float(cell.strip().replace(",", ""))
                                                   for cell in row.strip("|").split("|")[1:])
        assert off > 0 and on > 0 and ratio == pytest.approx(on / off, abs=0.01), row
        assert collect_off >= 0 and collect_on >= 0, row


@pytest.mark.timeout(120)
def test_pop_ahead_with_a_cuda_update_and_no_gpu_says_so() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: --train cuda runs")
    completed = subprocess.run([sys.executable, "benchmarks/pop_ahead.py", "--train", "cuda"], cwd=REPO_ROOT,
                               env=worker_env(), capture_output=True, text=True, timeout=60)
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert "--train cuda needs a CUDA GPU that torch can see" in completed.stderr


@pytest.mark.timeout(300)
def test_image_obs_prints_rates_and_bytes_per_step() -> None:
    out = run_benchmark("image_obs.py", "--envs", "2", "--seconds", "0.5", "--warmup", "0", "--rollout-steps", "8")
    rows = [line for line in out.splitlines() if line.startswith("| 2 |")]
    assert len(rows) == 3, out  # rates and bytes, CPU per step by role, then where the workers' time went
    shares = [cell.strip() for cell in rows[2].strip("|").split("|")][1:]
    assert len(shares) == 7 and all(cell == "-" or 0 <= float(cell) <= 100 for cell in shares[:5]), rows[2]
    cells = [float(cell.strip().replace(",", "")) for cell in rows[0].strip("|").split("|")]
    cpu = [float(cell.strip().replace(",", "")) for cell in rows[1].strip("|").split("|")]
    assert all(value > 0 for value in cpu[1:4]), rows[1]  # workers, learner and redis-server all used CPU
    assert cells[1] > 0 and cells[2] > 0, rows[0]
    assert 0.25 < cells[5] < 0.6, rows[0]  # each frame crosses once: about a quarter of a 4-frame stack per step


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="needs the atari extra")
def test_atari_step_prints_both_sides_per_env() -> None:
    out = run_benchmark("atari_step.py", "--env", "ALE/Pong-v5", "--steps", "50", "--rounds", "2")
    rows = [line for line in out.splitlines() if line.startswith("| ALE/Pong-v5 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["RGB screen (before)", "RAM (now)"], out
    assert float(rows[0].split("|")[5]) == 1.0 and float(rows[1].split("|")[3]) > 0, rows


def test_frame_bytes_prints_bytes_and_cpu_per_encoding() -> None:
    out = run_benchmark("frame_bytes.py", "--env", "random", "--envs", "2", "--rollout-steps", "16", "--rollouts", "1")
    rows = {line.split("|")[2].strip(): line for line in out.splitlines() if line.startswith("| random 84x84")}
    assert {"raw", "unique frames", "unique frames + zstd"} <= set(rows), out
    per_step = {name: float(line.split("|")[3].replace(",", "")) for name, line in rows.items()}
    assert per_step["raw"] > 28_224 > 3 * per_step["unique frames"], per_step


@pytest.mark.timeout(200)
def test_record_cost_prints_each_stage_per_record() -> None:
    out = run_benchmark("record_cost.py", "--envs", "2", "--steps", "8", "--repeats", "1")
    rows = [line for line in out.splitlines() if line.startswith("| this tree |")]
    assert len(rows) == 1, out
    cells = [float(cell.strip().replace(",", "")) for cell in rows[0].strip("|").split("|")[1:]]
    assert len(cells) == 10 and all(value > 0 for value in cells), rows[0]


@pytest.mark.timeout(200)
def test_sampler_throughput_prints_rqrl_and_plain_for_each_process_count() -> None:
    out = run_benchmark("sampler_throughput.py", "--processes", "1", "--workers", "2", "--num-samples", "100",
                        "--iterations", "1", "--max-episode-length", "50")
    assert "| processes | logical workers | rqrl steps/s | plain steps/s | rqrl / plain |" in out
    rows = [line for line in out.splitlines() if line.startswith("| 1 | 2 |")]
    assert len(rows) == 1, out
    cells = [cell.strip().replace(",", "") for cell in rows[0].strip("|").split("|")]
    assert float(cells[2]) > 0 and float(cells[3]) > 0 and float(cells[4]) > 0, rows[0]


@pytest.mark.slow  # about 30 s: two trainings (Redis and workers, then in-process), however tiny
@pytest.mark.timeout(200)
def test_train_cartpole_prints_ppo_next_to_its_single_process_baseline() -> None:
    out = run_benchmark("train_cartpole.py", "--env", "tests.fixtures:RqrlGuessSign-v0", "--variants", "ppo",
                        "ppo-baseline", "--seeds", "0", "--budget", "500")
    assert "| learner and sampling | solved |" in out
    assert len([line for line in out.splitlines() if line.startswith("| PPO, ")]) == 2, out


@pytest.mark.slow  # about 30 s: an IMPALA run and a 3-second DQN run, each with its own Redis and processes
@pytest.mark.timeout(200)
def test_train_cartpole_prints_dqn_and_the_impala_bottleneck_with_a_config_file(tmp_path) -> None:
    config = tmp_path / "impala.json"  # env and budget from the file; its settings reach IMPALA's run only
    config.write_text(json.dumps({"algo": "impala", "env_id": "tests.fixtures:RqrlGuessSign-v0",
                                  "total_env_steps": 2000, "batch_size": 2, "reward_scale": 0.5}))
    out = run_benchmark("train_cartpole.py", "--config", str(config), "--variants", "rqrl", "dqn", "--seeds", "0",
                        "--workers", "1", "--run-dir", str(tmp_path), "--dqn-seconds", "3")
    impala_config = json.loads((tmp_path / "rqrl-0" / "config.json").read_text())
    assert impala_config["env_id"] == "tests.fixtures:RqrlGuessSign-v0" and impala_config["workers"] == 1
    assert (impala_config["batch_size"], impala_config["reward_scale"]) == (2, 0.5)
    assert impala_config["total_env_steps"] == 2000 and (tmp_path / "rqrl-0" / "metrics.csv").exists()
    assert json.loads((tmp_path / "dqn-0" / "config.json").read_text())["batch_size"] != 2  # DQN's own default
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ") and "," in line}
    impala = rows["IMPALA, rqrl (Redis, local workers)"]
    assert impala.rstrip(" |").split("|")[-1].strip() in ("workers", "learner", "balanced"), impala
    assert rows["DQN, rqrl SEED (Redis, central inference)"].rstrip(" |").endswith("-"), rows


@pytest.mark.timeout(200)
def test_profile_sampler_prints_the_worker_cpu_per_step_and_its_top_functions() -> None:
    out = run_benchmark("profile_sampler.py", "--workers", "2", "--num-samples", "100", "--iterations", "1",
                        "--top", "5")
    assert "us per returned step" in out and "(run_worker)" in out, out
    out = run_benchmark("profile_sampler.py", "--workers", "2", "--num-samples", "100", "--iterations", "1",
                        "--cpu-only")
    assert "us per returned step" in out and "ncalls" not in out, out


@pytest.mark.timeout(200)
def test_queue_bytes_prints_redis_cpu_per_megabyte_for_each_entry_size() -> None:
    out = run_benchmark("queue_bytes.py", "--sizes-mb", "0.01", "0.05", "--megabytes", "0.5")
    for size in ("0.01", "0.05"):
        rows = [line for line in out.splitlines() if line.startswith(f"| {size} |")]
        assert len(rows) == 1, out
        cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
        assert all(float(cell) >= 0 for cell in cells[1:4]) and float(cells[4]) > 0, rows[0]


@pytest.mark.timeout(300)
def test_actors_per_job_prints_both_splits_and_their_ratio() -> None:
    out = run_benchmark("actors_per_job.py", "--workers", "1", "--actors", "2", "--seconds", "1", "--rounds", "1")
    assert "| 1 (before) |" in out and "| auto (now) |" in out and "auto / 1 = " in out


@pytest.mark.timeout(120)
def test_tag_cost_prints_both_tags_for_each_blob() -> None:
    out = run_benchmark("tag_cost.py", "--seconds", "0.02", "--rounds", "1")
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| blob")]
    assert [row[0] for row in rows] == ["CartPole entry", "Atari entry, zstd", "random frames entry",
                                        "Nature CNN weights"], out
    assert all(float(row[2].replace(",", "")) > 0 and float(row[3].replace(",", "")) > 0 for row in rows), out


@pytest.mark.timeout(300)
def test_weights_broadcast_prints_publish_fetch_and_redis_cost_for_each_model() -> None:
    out = run_benchmark("weights_broadcast.py", "--seconds", "1", "--readers", "2", "--every-ms", "200")
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in out.splitlines() if line.startswith("| ") and not line.startswith("| model")}
    assert set(rows) == {"nature-cnn", "mlp"}, out
    assert float(rows["nature-cnn"][1]) > 6 > float(rows["mlp"][1]), "the models' megabytes"
    assert all(int(row[4]) > 0 and float(row[6]) > 0 for row in rows.values()), "no fetch was made or counted"


@pytest.mark.timeout(120)
def test_send_cost_prints_both_packers_for_each_command_and_size() -> None:
    out = run_benchmark("send_cost.py", "--count", "2", "--repeats", "1")
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| command")]
    assert [(row[0], row[1]) for row in rows] == [(command, size) for command in ("RPUSH in MULTI", "SET")
                                                  for size in ("0.25", "1", "6.75")], out
    assert all(float(row[2]) > 0 and float(row[3]) > 0 for row in rows), out
    assert "redis-py's default packer here:" in out


@pytest.mark.timeout(300)
def test_ppo_throughput_prints_each_side_against_the_sampler() -> None:
    out = run_benchmark("ppo_throughput.py", "--n-workers", "2", "--num-samples", "300", "--iterations", "2",
                        "--epochs", "1", "--processes", "1")
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert {"sampler", "ppo, sample ahead", "ppo, sample ahead, prefix only", "ppo, in turn"} <= set(rows), out
    assert float(rows["sampler"].split("|")[3]) == 1.0
    assert all(float(rows[side].split("|")[2].replace(",", "")) > 0 for side in rows if side != "side"), out


@pytest.mark.timeout(60)
def test_run_curve_prints_a_row_per_window_of_a_runs_metrics(tmp_path) -> None:
    lines = ["env_steps,seconds,updates,mean_return,episodes",  # a row a second; returns from the 4th
             *(f"{100 * second},{second}.5,{second},{'' if second < 3 else -21 + second / 10},{second // 3}"
               for second in range(12))]
    (tmp_path / "metrics.csv").write_text("\n".join(lines) + "\n")
    out = run_benchmark("run_curve.py", str(tmp_path), "--window", "5")
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("| ") and line[2].isdigit()]
    assert [row[1:] for row in rows] == [  # 0-5 s, 5-10 s, 10-11.5 s: steps, steps/s, updates, episodes, return
        ["400", "89", "4", "1", "-20.6"], ["900", "100", "9", "3", "-20.1"], ["1,100", "100", "11", "3", "-19.9"]], out
    # minutes, each window from its start to its last row, in one precision ("0.0833333-0.2" read as overlapping)
    assert [row[0] for row in rows] == ["0.00-0.07", "0.08-0.16", "0.17-0.19"], out


def network_benchmark_unavailable() -> str | None:
    """Why benchmarks/network.py cannot run here (not root, no ip or tc, no namespaces), or None where it can."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "benchmarks/network.py needs root on Linux (network namespaces)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "benchmarks/network.py needs ip and tc (iproute2) on PATH"
    completed = subprocess.run([sys.executable, "benchmarks/network.py", "--check"], cwd=REPO_ROOT, env=worker_env(),
                               capture_output=True, text=True, timeout=60)
    return None if completed.returncode == 0 else f"benchmarks/network.py --check: {completed.stdout.strip()}"


@pytest.mark.timeout(300)
def test_network_prints_loopback_and_namespaces_side_by_side_and_leaves_nothing() -> None:
    reason = network_benchmark_unavailable()
    if reason is not None:
        pytest.skip(reason)
    out = run_benchmark("network.py", "--workers", "1", "--envs", "2", "--seconds", "0.5", "--warmup", "0",
                        "--rounds", "1", "--rollout-steps", "8")
    rows = [line for line in out.splitlines() if line.startswith(("| CartPole-v1", "| 84x84x4"))]
    assert len(rows) == 2, out
    for row in rows:
        cells = [cell.strip().replace(",", "") for cell in row.strip("|").split("|")]
        assert float(cells[2]) > 0 and float(cells[3]) > 0, row  # loopback and netem steps/s
        ping_loopback, ping_netem = map(float, cells[9].split(" / "))
        assert ping_netem > 1.0 > ping_loopback, row  # 2 ms round trip through the link, well under 1 on loopback
    frames_in = float(rows[1].split("|")[7].split("/")[0].replace(",", ""))
    assert 84 * 84 <= frames_in < 84 * 84 * 4, rows[1]  # each new frame crosses into Redis once, not each stack
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "rqrl-bench-" not in listed, listed


@pytest.mark.timeout(300)
def test_stop_without_redis_prints_each_familys_stop_and_what_reached_its_caller() -> None:
    out = run_benchmark("stop_without_redis.py", "--families", "maze", "seed", "ppo")
    assert "| family | stop | seconds to return | what reached the caller |" in out
    families = ("| maze", "| seed", "| ppo")
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith(families)}
    assert set(rows) == {"maze", "seed", "ppo"}, out
    assert "| returned |" in rows["maze"] and "| KeyboardInterrupt |" in rows["seed"], out
    assert "| returned |" in rows["ppo"], out  # train() writes its checkpoint and returns, interrupted
