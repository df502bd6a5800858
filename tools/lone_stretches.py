#!/usr/bin/env python3
"""Where a lone job's time goes, read off the server's system calls.

A lone job (one client, one job at a time) is, on the server's async
worker: the client's request read, the create's commit (its WAL write and
fdatasync), the provider's request written, the provider's answer read,
the finish's commit, and the answer written. The stretches between those
calls are onejob's own work (or the provider's, or the disk's), and this
prints the median and p90 of each over every job the trace holds.

Record during the bench's lone phase, then feed perf's text to this:

    bench --server-bin new=BIN --doors jobs --jobs 100 --lone 30000 &
    # once the lone phase runs (the server's pid is in the bench's header):
    perf record -p PID -o lone.data \\
        -e syscalls:sys_enter_recvfrom -e syscalls:sys_enter_writev \\
        -e syscalls:sys_enter_pwrite64 -e syscalls:sys_enter_fdatasync \\
        -e syscalls:sys_exit_fdatasync -- sleep 3
    perf script -i lone.data -F tid,time,event,trace | python3 tools/lone_stretches.py

Each traced call costs a little, so every stretch reads somewhat longer
than it is; compare stretches of one trace, or two builds traced alike.
"""

import re
import statistics
import sys

STRETCHES = [
    "request read -> the create's fdatasync",
    "the create's fdatasync",
    "-> the provider request written",
    "the provider (its answer read)",
    "-> the finish's fdatasync",
    "the finish's fdatasync",
    "-> the answer written",
]

LINE = re.compile(r"^\s*(\d+)\s+([\d.]+):\s+syscalls:sys_(enter|exit)_(\w+):\s*(.*)$")
FD = re.compile(r"fd: (0x[0-9a-f]+)")


def events(lines):
    """(tid, seconds, name, fd) for each traced call, in the trace's order."""
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        tid, at, side, call, rest = m.groups()
        fd = FD.search(rest)
        yield tid, float(at), f"{side}_{call}", int(fd.group(1), 16) if fd else None


def jobs(trace):
    """Each lone job's ten calls, on one thread, in the order a job makes them.

    recvfrom(client) pwrite fdatasync> <fdatasync writev(provider)
    recvfrom(provider) pwrite fdatasync> <fdatasync writev(client)
    """
    shape = [
        "enter_recvfrom", "enter_pwrite64", "enter_fdatasync", "exit_fdatasync",
        "enter_writev", "enter_recvfrom", "enter_pwrite64", "enter_fdatasync",
        "exit_fdatasync", "enter_writev",
    ]
    by_thread = {}
    for tid, at, name, fd in trace:
        if name in shape:
            by_thread.setdefault(tid, []).append((at, name, fd))
    for calls in by_thread.values():
        i = 0
        while i + len(shape) <= len(calls):
            window = calls[i : i + len(shape)]
            names = [name for _, name, _ in window]
            client, provider = window[0][2], window[4][2]
            if (
                names == shape
                and client is not None
                and provider is not None
                and client != provider
                and window[5][2] == provider
                and window[9][2] == client
            ):
                yield [at for at, _, _ in window]
                i += len(shape)
            else:
                i += 1


def main():
    found = list(jobs(events(sys.stdin)))
    if not found:
        sys.exit("no lone job found: was the trace taken during the lone phase, with the five events?")
    # The ten calls' times: t0 request read, t1 create's pwrite, t2/t3 its
    # fdatasync, t4 provider request, t5 answer read, t6 finish's pwrite,
    # t7/t8 its fdatasync, t9 answer written.
    spans = [(0, 2), (2, 3), (3, 4), (4, 5), (5, 7), (7, 8), (8, 9)]
    print(f"{len(found)} lone jobs; µs, median / p90")
    total_own = []
    for name, (a, b) in zip(STRETCHES, spans):
        values = sorted((t[b] - t[a]) * 1e6 for t in found)
        p90 = values[int(len(values) * 0.9)]
        print(f"  {name:<42} {statistics.median(values):7.0f} / {p90:.0f}")
    for t in found:
        total_own.append(((t[2] - t[0]) + (t[4] - t[3]) + (t[7] - t[5]) + (t[9] - t[8])) * 1e6)
    print(f"  {'onejob own, the four stretches summed':<42} {statistics.median(total_own):7.0f}")


if __name__ == "__main__":
    main()
