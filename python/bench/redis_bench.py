"""idem's run() on Redis against the same round trips written by hand with redis-py, and
against the SET NX + GET pattern many Python libraries use, in one process, in one run.

    IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379/0 \\
      PYTHONPATH=build/release/python /usr/bin/python3 python/bench/redis_bench.py

For 1 and 8 threads, fresh keys and replays, it measures calls per second of:

- idem:       executor.run(scope, key, action) (BytesCodec, a 100-byte result).
- by hand:    the Redis store's own round trips with redis-py: its acquire script, then its
              complete script (EVALSHA, the same scripts read from
              src/stores/redis/redis_scripts.h, the same keys and arguments); a replay is the
              acquire script alone. What a careful Python implementation of the same
              guarantees would send.
- SET NX:     SET key "in-progress" NX PX lease, then SET key result PX ttl; a replay is the
              SET NX that fails, then a GET. No fencing token, no takeover, no heartbeat.

Cases take turns (round-robin, ROUNDS rounds) so that a noisy neighbour hits all alike; the
table gives medians and idem's ratio to each. The machine may be shared: compare ratios.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import struct
import sys
import threading
import time
import uuid
from pathlib import Path

import redis

import idem

ROOT = Path(__file__).resolve().parents[2]
PAYLOAD = b"r" * 100
LEASE_MS = 30_000
TTL_MS = 3_600_000


def scripts() -> dict:
    text = (ROOT / "src/stores/redis/redis_scripts.h").read_text()
    found = dict(re.findall(r'ScriptSource k\w+Script\{"(\w+)", R"lua\((.*?)\)lua"\}', text, re.S))
    return {"acquire": found["acquire"], "complete": found["complete"]}


def escape(b: bytes) -> bytes:
    return b.replace(b"%", b"%25").replace(b":", b"%3A").replace(b"{", b"%7B").replace(b"}", b"%7D")


def record_key(prefix: bytes, scope: bytes, key: bytes) -> bytes:
    return prefix + b"{" + escape(scope) + b":" + escape(key) + b"}"


class ByHand:
    """The Redis store's acquire and complete, written with redis-py."""

    NO_FINGERPRINT = b"\x00" + struct.pack(">I", 0)

    def __init__(self, client: redis.Redis) -> None:
        s = scripts()
        self.acquire_script = client.register_script(s["acquire"])
        self.complete_script = client.register_script(s["complete"])

    def run(self, scope: bytes, key: bytes, action) -> tuple:
        k = record_key(b"idem:", scope, key)
        # The acquire script also keeps the store's token key (docs/stores/redis.md, "Tokens").
        reply = self.acquire_script(
            keys=[k, b"idem:tokens"],
            args=[LEASE_MS, TTL_MS, self.NO_FINGERPRINT],
        )
        if isinstance(reply, list):
            raise RuntimeError("busy")
        kind = reply[0]
        if kind == ord("C"):
            (length,) = struct.unpack_from(">I", reply, 38)
            return reply[42 + length :], True
        (token,) = struct.unpack_from(">Q", reply, 1)
        value = action(token)
        if self.complete_script(keys=[k], args=[token, TTL_MS, value]) != 1:
            raise RuntimeError("lease lost")
        return value, False


class SetNx:
    """The common pattern: SET NX a marker, run, SET the result; a replay GETs it."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def run(self, scope: bytes, key: bytes, action) -> tuple:
        k = b"setnx:" + scope + b":" + key
        if self.client.set(k, b"in-progress", nx=True, px=LEASE_MS):
            value = action(0)
            self.client.set(k, value, px=TTL_MS)
            return value, False
        value = self.client.get(k)
        if value == b"in-progress":
            raise RuntimeError("busy")
        return value, True


def measure(threads: int, seconds: float, call) -> float:
    """Calls per second of call(thread, i) from `threads` threads for `seconds`."""
    counts = [0] * threads
    stop = threading.Event()
    start = threading.Barrier(threads + 1)

    def worker(t: int) -> None:
        start.wait()
        n = 0
        while not stop.is_set():
            call(t, n)
            n += 1
        counts[t] = n

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for p in pool:
        p.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for p in pool:
        p.join()
    return sum(counts) / (time.perf_counter() - began)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=os.environ.get("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,8")
    ap.add_argument("--connections", type=int, default=2, help="the idem store's connections")
    ap.add_argument("--require-server", action="store_true",
                    help="for the ctest smoke run: without IDEM_TEST_REDIS_URL, skip (exit 0), or "
                    "fail under IDEM_REQUIRE_SERVERS=1")
    args = ap.parse_args()
    if args.require_server and not os.environ.get("IDEM_TEST_REDIS_URL"):
        if os.environ.get("IDEM_REQUIRE_SERVERS") == "1":
            raise SystemExit("IDEM_REQUIRE_SERVERS=1 but IDEM_TEST_REDIS_URL is not set")
        print("IDEM_TEST_REDIS_URL is not set: skipped")
        return

    sep = "&" if "?" in args.url else "?"
    executor = idem.Executor(f"{args.url}{sep}connections={args.connections}", codec=idem.BytesCodec())
    client = redis.Redis.from_url(args.url, max_connections=64)
    by_hand = ByHand(client)
    setnx = SetNx(client)
    run_id = uuid.uuid4().hex[:8].encode()
    action_idem = lambda attempt: PAYLOAD  # noqa: E731
    action_raw = lambda token: PAYLOAD  # noqa: E731
    replay_keys = [f"replay-{i}".encode() for i in range(64)]

    def fresh(kind: str, threads: int, rnd: int):
        scope = b"bench-" + run_id + b"-" + kind.encode() + b"-%d-%d" % (threads, rnd)
        if kind == "idem":
            return lambda t, n: executor.run(scope, b"%d-%d" % (t, n), action_idem)
        impl = by_hand if kind == "by hand" else setnx
        return lambda t, n: impl.run(scope, b"%d-%d" % (t, n), action_raw)

    def replay(kind: str, threads: int, rnd: int):
        scope = b"bench-" + run_id + b"-replay-" + kind.encode()
        if kind == "idem":
            for k in replay_keys:
                executor.run(scope, k, action_idem)
            return lambda t, n: executor.run(scope, replay_keys[(t * 7 + n) % 64], action_idem)
        impl = by_hand if kind == "by hand" else setnx
        for k in replay_keys:
            impl.run(scope, k, action_raw)
        return lambda t, n: impl.run(scope, replay_keys[(t * 7 + n) % 64], action_raw)

    kinds = ["idem", "by hand", "SET NX"]
    rows = []
    for threads in [int(x) for x in args.threads.split(",")]:
        for mode, make in (("fresh", fresh), ("replay", replay)):
            rates = {k: [] for k in kinds}
            for rnd in range(args.rounds):
                for kind in kinds:  # taking turns
                    rates[kind].append(measure(threads, args.seconds, make(kind, threads, rnd)))
            med = {k: statistics.median(v) for k, v in rates.items()}
            rows.append((mode, threads, med))
            print(
                f"{mode:6} {threads} thread(s): idem {med['idem']:8.0f}/s  by hand {med['by hand']:8.0f}/s"
                f"  SET NX {med['SET NX']:8.0f}/s", file=sys.stderr, flush=True,
            )

    print()
    print("| work | threads | idem run() (calls/s) | by hand, same round trips (calls/s) | idem / by hand "
          "| SET NX + GET (calls/s) | idem / SET NX |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for mode, threads, med in rows:
        print(f"| {mode} | {threads} | {med['idem']:.0f} | {med['by hand']:.0f} | "
              f"{med['idem'] / med['by hand']:.2f} | {med['SET NX']:.0f} | {med['idem'] / med['SET NX']:.2f} |")
    executor.close()


if __name__ == "__main__":
    main()
