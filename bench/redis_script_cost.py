"""The server's time inside the Redis store's acquire script, this tree's against another
revision's, taking turns on one server: a replay (a completed key) and a fresh acquire (a
new key each call). It reads INFO commandstats (usec per EVALSHA), so it measures the
script on the server, not the client or the round trip.

    IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379/0 \\
      /usr/bin/python3 bench/redis_script_cost.py --old main [--rounds 9]

Run it from the repository's top folder (the old scripts come from `git show`). Prints, per
case and revision, the microseconds per call of each round and their median. The machine may
be shared: compare the two revisions of one run.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import subprocess
from pathlib import Path

import redis

SCRIPTS = "src/stores/redis/redis_scripts.h"
NO_FINGERPRINT = b"\x00\x00\x00\x00\x00"


def scripts(text: str) -> dict:
    return dict(re.findall(r'ScriptSource k\w+Script\{"(\w+)", R"lua\((.*?)\)lua"\}', text, re.S))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="the revision to compare with (git)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=20000, help="calls per case and round")
    args = ap.parse_args()
    client = redis.Redis.from_url(os.environ.get("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
    sources = {
        "old": scripts(subprocess.run(["git", "show", f"{args.old}:{SCRIPTS}"], check=True,
                                      capture_output=True, text=True).stdout),
        "new": scripts(Path(SCRIPTS).read_text()),
    }
    sha = {rev: {name: client.script_load(body) for name, body in s.items()}
           for rev, s in sources.items()}
    # The new acquire takes the store's token key too; the old one ignores a second key.
    prefix = b"idem-script-cost:"

    def keys(k: bytes) -> list:
        return [prefix + k, prefix + b"tokens"]

    for rev in sha:  # completed keys for the replays, written by each revision's scripts
        for i in range(100):
            k = keys(f"done:{rev}:{i}".encode())
            h = client.evalsha(sha[rev]["acquire"], 2, *k, 30000, 600000, NO_FINGERPRINT, 600000)
            token = int.from_bytes(h[1:9], "big")
            assert client.evalsha(sha[rev]["complete"], 1, k[0], token, 600000, b"p" * 32) == 1
    fresh = itertools.count()

    def measure(rev: str, case: str) -> float:
        client.config_resetstat()
        for _ in range(args.calls // 1000):
            p = client.pipeline(transaction=False)
            for i in range(1000):
                k = keys(f"done:{rev}:{i % 100}".encode() if case == "replay"
                         else f"fresh:{next(fresh)}".encode())
                p.evalsha(sha[rev]["acquire"], 2, *k, 30000, 60000, NO_FINGERPRINT, 60000)
            p.execute()
        stat = client.info("commandstats")["cmdstat_evalsha"]
        return stat["usec"] / stat["calls"]

    results: dict = {}
    for _ in range(args.rounds):
        for rev in ("old", "new"):
            for case in ("replay", "fresh acquire"):
                results.setdefault((case, rev), []).append(measure(rev, case))
    for (case, rev), values in sorted(results.items()):
        print(f"{case:14} {rev} ({args.old if rev == 'old' else 'this tree'}): median "
              f"{statistics.median(values):.2f} us per call; rounds "
              + " ".join(f"{v:.2f}" for v in values))
    for key in client.scan_iter(match=prefix + b"*", count=1000):
        client.unlink(key)


if __name__ == "__main__":
    main()
