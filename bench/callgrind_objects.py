#!/usr/bin/python3
"""Sums a callgrind dump's own instructions (Ir) per object: the program, each shared library.

    callgrind_objects.py [--parts] CALLGRIND_OUT OPS

Prints the instructions per call (the dump's total divided by OPS) for each object, largest
first, as "name=value" words on one line, e.g. "total=41234 call_cost=9876 libc.so.6=...".
With --parts, a statically linked program (the `idem` tool, with the library and Boost in
it) is split further by the namespace of each function: idem::proxy, boost::beast,
boost::asio, idem (the rest of the library and its stores), other. Code the compiler inlined
counts in the function it was inlined into.
The cost of a call instruction's callee (the line after `calls=`) is the callee's, not the
caller's, and is skipped: every instruction is counted once, in the object that ran it.
bench/breakdown.sh uses it; the format is callgrind's (valgrind's docs, "Callgrind Format
Specification"), with name compression.
"""

import collections
import os
import sys


PARTS = ("idem::proxy", "boost::beast", "boost::asio", "idem::")


def part_of(function):
    """The part of PARTS the function's name names first, or "other"."""
    found = [(function.find(p), -len(p), p) for p in PARTS if p in function]
    if not found:
        return "other"
    return min(found)[2].rstrip(":")  # the earliest; at one place, the longest


def remember(names, spec):
    """Resolves a compressed "(id) name" or "(id)" spec, recording new names; returns the name."""
    if not spec.startswith("("):
        return spec
    ref, _, name = spec.partition(")")
    ref += ")"
    name = name.strip()
    if name:
        names[ref] = name
    return names.get(ref, ref)


def own_instructions_per_object(path, parts=False):
    names = {}  # "(id)" -> object path, for compressed names
    functions = {}  # the same for function names
    totals = collections.Counter()
    current = None
    function = ""
    skip_next_cost = False
    ir_column = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("events:"):
                ir_column = line.split()[1:].index("Ir")
                continue
            if line.startswith("ob="):
                current = remember(names, line[3:])
                continue
            if line.startswith("cob="):
                # A callee's object, named (and compressed) here for the first time.
                remember(names, line[4:])
                continue
            if line.startswith("fn="):
                function = remember(functions, line[3:])
                continue
            if line.startswith("cfn="):
                remember(functions, line[4:])
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
                where = os.path.basename(current or "?")
                if parts and not where.startswith("lib") and not where.startswith("ld-"):
                    where = f"{where}:{part_of(function)}"
                totals[where] += int(fields[1 + ir_column])
    return totals


def main():
    args = sys.argv[1:]
    parts = args[:1] == ["--parts"]
    if parts:
        args = args[1:]
    if len(args) != 2:
        sys.exit("usage: callgrind_objects.py [--parts] CALLGRIND_OUT OPS")
    ops = int(args[1])
    totals = own_instructions_per_object(args[0], parts)
    words = [f"total={sum(totals.values()) // ops}"]
    for name, ir in totals.most_common():
        if ir // ops > 0:
            words.append(f"{name}={ir // ops}")
    print(" ".join(words))


if __name__ == "__main__":
    main()
