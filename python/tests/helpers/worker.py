"""A worker process for test_processes.py: runs every key of a scope once through its own
executor, noting each run (key and pid) in a shared file.

    worker.py URL SCOPE KEYS RUNS_FILE
"""

import os
import sys
import time

import idem

url, scope, keys, runs_file = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
executor = idem.Executor(url, initial_backoff=0.005)
fd = os.open(runs_file, os.O_WRONLY | os.O_APPEND)


def action(key):
    def run(attempt):
        os.write(fd, f"{key} {os.getpid()} {attempt.token}\n".encode())
        time.sleep(0.002)
        return key

    return run


replays = 0
for i in range(keys):
    key = f"k{i}"
    r = executor.run(scope, key, action(key), wait=60)
    assert r.value == key, r
    replays += r.replayed
print(f"replays {replays}", flush=True)
executor.close()
