"""Holds a lease in a process of its own, for test_processes.py and test_exit.py.

    hold.py URL SCOPE KEY MODE

Prints "token N" once the lease is held, then by MODE:
  exit        returns from the script with the attempt still open (atexit must release it)
  os_exit     os._exit(0): no atexit, no release; the lease must run out and be taken over
  pause       reads a line from stdin (the test SIGSTOPs and SIGCONTs the process meanwhile),
              then tries to complete and prints what happened
  busy_exit   also starts daemon threads that are inside idem when the process exits: one
              waiting for a busy key, one inside run()'s action, with on_event, stop
              callbacks and a fast heartbeat calling into Python all along
"""

import os
import sys
import threading
import time

import idem

url, scope, key, mode = sys.argv[1:5]
events = []
executor = idem.Executor(url, lease=0.5, heartbeat=0.02, on_event=lambda e: events.append(e.kind))
attempt = executor.begin(scope, key)
attempt.add_stop_callback(lambda: events.append("stop"))
print(f"token {attempt.token}", flush=True)

if mode == "exit":
    sys.exit(0)
if mode == "os_exit":
    os._exit(0)
if mode == "pause":
    sys.stdin.readline()
    lost = attempt.lease_lost
    try:
        attempt.complete("paused owner")
        print(f"completed lost={lost}", flush=True)
    except idem.LeaseLost as e:
        print(f"LeaseLost token={e.token} lost={lost}", flush=True)
    sys.exit(0)
if mode == "busy_exit":
    other = idem.Executor(url, initial_backoff=0.005, on_event=lambda e: events.append(e.kind))
    inside = threading.Event()

    def waiter():
        inside.set()
        try:
            other.run(scope, key, lambda a: "never", wait=3600)
        except idem.ShutDown:
            pass

    def runner():
        def action(a):
            a.add_stop_callback(lambda: events.append("runner stop"))
            while True:
                time.sleep(0.001)

        executor.run(scope, key + "-run", action)

    for target in (waiter, runner):
        threading.Thread(target=target, daemon=True).start()
    inside.wait()
    while executor.active_leases < 2:
        time.sleep(0.001)
    time.sleep(0.1)  # heartbeats and waits going on
    print("exiting", flush=True)
    sys.exit(0)
raise SystemExit(f"unknown mode {mode}")
