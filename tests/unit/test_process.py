"""rqrl.process: SIGTERM raised like Ctrl-C, and the watchdog that ends a clean-up that hangs."""

import signal
import subprocess
import sys
import textwrap
import time

from tests.processes import worker_env

HANGING_CLEANUP = textwrap.dedent("""
    import sys, time
    from rqrl.process import Terminated, terminate_like_ctrl_c

    terminate_like_ctrl_c(grace_seconds={grace})
    print("ready", flush=True)
    try:
        time.sleep(60)
    except Terminated:
        print("terminated", flush=True)
        {cleanup}
    print("clean exit", flush=True)
    sys.exit(143)
""")


def run_and_terminate(grace: float, cleanup: str) -> tuple[subprocess.CompletedProcess, float]:
    """Start the script, SIGTERM it once it is ready; returns its result and how long it took after SIGTERM."""
    code = HANGING_CLEANUP.format(grace=grace, cleanup=cleanup)
    process = subprocess.Popen([sys.executable, "-c", code], env=worker_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        signal_sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=30)
        took = time.monotonic() - signal_sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    return subprocess.CompletedProcess(process.args, process.returncode, "ready\n" + stdout, stderr), took


def test_a_clean_up_that_hangs_is_ended_by_the_watchdog_with_every_stack():
    result, took = run_and_terminate(grace=1.0, cleanup="time.sleep(120)  # a clean-up stuck for good")
    assert result.returncode == 143, result.stderr
    assert "terminated" in result.stdout and "clean exit" not in result.stdout, result.stdout
    assert "did not finish within 1 s" in result.stderr, result.stderr
    assert "Current thread" in result.stderr or "Thread 0x" in result.stderr, result.stderr
    assert '"<string>", line' in result.stderr, "the main thread's stack names where it hung: " + result.stderr
    assert took < 20, took


def test_a_clean_up_that_finishes_is_not_cut_short_and_a_second_sigterm_is_ignored():
    result, _ = run_and_terminate(grace=5.0, cleanup="import os; os.kill(os.getpid(), signal_number); "
                                                     "time.sleep(0.5)".replace("signal_number", "15"))
    assert result.returncode == 143, result.stderr
    assert result.stdout.splitlines() == ["ready", "terminated", "clean exit"], result.stdout
    assert "did not finish" not in result.stderr, result.stderr
