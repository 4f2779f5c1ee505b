"""compress/decompress from many threads at once, as a SEED actor's threads and its inference requests do: every
payload comes back whole. One shared zstd compressor crashed such a process (SIGSEGV), so the threads run in a
child process whose end the test reads."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.children import REPO_ROOT, worker_env

SCRIPT = textwrap.dedent("""
    import threading
    import numpy as np
    from rqrl.engine.compression import compress, decompress

    frames = np.zeros((16, 4, 84, 84), np.uint8)
    frames[:, :, 20:30] = np.random.default_rng(0).integers(0, 255, (16, 4, 10, 84))  # compresses, not to nothing
    payloads = [(frames + index).tobytes() for index in range(8)]
    failures = []

    def work(index):
        try:
            for _ in range(200):
                payload = payloads[index % 8]
                assert bytes(decompress(compress(payload), limit=10**8)) == payload
        except Exception as error:
            failures.append(repr(error))

    threads = [threading.Thread(target=work, args=(index,)) for index in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print("failures", len(failures), failures[:2])
""")


def test_threads_compressing_at_once_each_get_their_payload_back() -> None:
    completed = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, env=worker_env(), capture_output=True,
                               text=True, timeout=120)
    assert completed.returncode == 0, f"exit {completed.returncode}: {completed.stderr[-2000:]}"
    assert completed.stdout.strip() == "failures 0 []", completed.stdout
