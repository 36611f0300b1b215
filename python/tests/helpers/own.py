"""Owns a key in a process of its own until told how to end it, for test_asyncio.py.

    own.py URL SCOPE KEY

Takes the key with a one-hour lease (so that no waiter's poll is paced by its deadline),
prints "token N", then reads one line from stdin:
  complete VALUE   records VALUE as the key's result
  release          gives the key up
prints "done" and exits.
"""

import sys

import idem

url, scope, key = sys.argv[1:4]
executor = idem.Executor(url, lease=3600)
attempt = executor.begin(scope, key)
print(f"token {attempt.token}", flush=True)
command = sys.stdin.readline().split(maxsplit=1)
if command[:1] == ["complete"]:
    attempt.complete(command[1].strip())
elif command[:1] == ["release"]:
    attempt.release()
else:
    raise SystemExit(f"unknown command {command!r}")
print("done", flush=True)
executor.close()
