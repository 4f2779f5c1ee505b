"""rqrl.engine.process: SIGTERM raised like Ctrl-C, the watchdog that ends a hanging clean-up, SIGUSR1's stacks."""

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.children import worker_env

HANGING_CLEANUP = textwrap.dedent("""
    import sys, time
    from rqrl.engine.process import terminate_like_ctrl_c

    terminate_like_ctrl_c(grace_seconds={grace})
    try:
        print("ready", flush=True)  # inside the try: the signal may come at once
        time.sleep(60)
    except KeyboardInterrupt as error:
        print(type(error).__name__, flush=True)
        {cleanup}
    print("clean exit", flush=True)
    sys.exit(3)
""")


def run_and_signal(grace: float, cleanup: str, signum: int = signal.SIGTERM, ignore_sigint: bool = False,
                   wait: float = 30.0) -> tuple[subprocess.CompletedProcess, float]:
    """Start the script, send ``signum`` once it is ready; returns its result and how long it took after (inf
    if it still ran ``wait`` seconds later, and was killed)."""
    code = HANGING_CLEANUP.format(grace=grace, cleanup=cleanup)
    if ignore_sigint:  # what nohup and a script's background job do before exec
        code = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n" + code
    process = subprocess.Popen([sys.executable, "-c", code], env=worker_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        signal_sent = time.monotonic()
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=wait)
        took = time.monotonic() - signal_sent
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate(timeout=5)
        took = float("inf")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    return subprocess.CompletedProcess(process.args, process.returncode, "ready\n" + stdout, stderr), took


@pytest.mark.parametrize(("signum", "raised", "code"), [(signal.SIGTERM, "Terminated", 143),
                                                        (signal.SIGINT, "KeyboardInterrupt", 130)])
def test_a_clean_up_that_hangs_is_ended_by_the_watchdog_with_every_stack(signum, raised, code):
    result, took = run_and_signal(grace=1.0, cleanup="time.sleep(120)  # a clean-up stuck for good", signum=signum)
    assert result.returncode == code, result.stderr
    assert result.stdout.splitlines() == ["ready", raised], result.stdout
    assert f"clean-up after {signal.Signals(signum).name} did not finish within 1 s" in result.stderr, result.stderr
    assert "Current thread" in result.stderr or "Thread 0x" in result.stderr, result.stderr
    assert '"<string>", line' in result.stderr, "the main thread's stack names where it hung: " + result.stderr
    assert took < 20, took


def test_a_clean_up_that_finishes_is_not_cut_short_and_a_second_sigterm_is_ignored():
    result, _ = run_and_signal(grace=5.0, cleanup="import os; os.kill(os.getpid(), 15); time.sleep(0.5)")
    assert result.returncode == 3, result.stderr
    assert result.stdout.splitlines() == ["ready", "Terminated", "clean exit"], result.stdout
    assert "did not finish" not in result.stderr, result.stderr


def test_a_second_ctrl_c_cuts_the_clean_up_short():
    result, took = run_and_signal(grace=30.0, cleanup="import os; os.kill(os.getpid(), 2); time.sleep(20)",
                                  signum=signal.SIGINT)
    assert result.returncode != 0 and "KeyboardInterrupt" in result.stderr, result.stderr
    assert "clean exit" not in result.stdout and "did not finish" not in result.stderr, result
    assert took < 15, took


def test_a_sigint_ignored_from_the_start_stays_ignored():
    result, took = run_and_signal(grace=1.0, cleanup="", signum=signal.SIGINT, ignore_sigint=True,
                                  wait=3.0)
    assert took == float("inf"), "the script ran on through SIGINT until killed"
    assert result.stdout.splitlines() == ["ready"], result.stdout


def test_sigusr1_prints_every_thread_and_the_process_runs_on():
    result, took = run_and_signal(grace=5.0, cleanup="", signum=signal.SIGUSR1, wait=3.0)
    # faulthandler prints and returns, so the script sleeps on until killed: the stacks came without stopping it
    assert took == float("inf"), result
    assert '"<string>", line' in result.stderr and "KeyboardInterrupt" not in result.stdout, result


def test_a_zombie_learner_counts_as_gone_for_the_orphan_watchdog():
    from rqrl.engine.process import _alive

    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _alive(exited.pid):  # exits, and stays a zombie: nobody waits on it
            time.sleep(0.05)
        assert not _alive(exited.pid), "an exited, unreaped process counted as alive"
        assert _alive(running.pid)
    finally:
        running.kill()
        running.wait(5)
        exited.wait(5)
    assert not _alive(exited.pid)
