#!/usr/bin/python3
"""Sums a callgrind dump's own instructions (Ir) per object: the program, each shared library.

    callgrind_objects.py CALLGRIND_OUT OPS

Prints the instructions per call (the dump's total divided by OPS) for each object, largest
first, as "name=value" words on one line, e.g. "total=41234 call_cost=9876 libc.so.6=...".
The cost of a call instruction's callee (the line after `calls=`) is the callee's, not the
caller's, and is skipped: every instruction is counted once, in the object that ran it.
bench/breakdown.sh uses it; the format is callgrind's (valgrind's docs, "Callgrind Format
Specification"), with name compression.
"""

import collections
import os
import sys


def own_instructions_per_object(path):
    names = {}  # "(id)" -> object path, for compressed names
    totals = collections.Counter()
    current = None
    skip_next_cost = False
    ir_column = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("events:"):
                ir_column = line.split()[1:].index("Ir")
                continue
            if line.startswith("ob="):
                spec = line[3:]
                if spec.startswith("("):
                    ref, _, name = spec.partition(")")
                    ref += ")"
                    name = name.strip()
                    if name:
                        names[ref] = name
                    current = names.get(ref, ref)
                else:
                    current = spec
                continue
            if line.startswith("cob="):
                # A callee's object, named (and compressed) here for the first time.
                spec = line[4:]
                if spec.startswith("("):
                    ref, _, name = spec.partition(")")
                    if name.strip():
                        names[ref + ")"] = name.strip()
                continue
            if line.startswith("calls="):
                skip_next_cost = True
                continue
            if not line or not (line[0].isdigit() or line[0] in "+-*"):
                continue
            if skip_next_cost:
                skip_next_cost = False
                continue
            fields = line.split()
            if len(fields) > 1 + ir_column:
                totals[os.path.basename(current or "?")] += int(fields[1 + ir_column])
    return totals


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: callgrind_objects.py CALLGRIND_OUT OPS")
    ops = int(sys.argv[2])
    totals = own_instructions_per_object(sys.argv[1])
    words = [f"total={sum(totals.values()) // ops}"]
    for name, ir in totals.most_common():
        if ir // ops > 0:
            words.append(f"{name}={ir // ops}")
    print(" ".join(words))


if __name__ == "__main__":
    main()
