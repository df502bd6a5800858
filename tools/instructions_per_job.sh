#!/usr/bin/env bash
# Instructions a server executes per durable job, counted by valgrind's
# callgrind: the same count for the same binary and load, whatever else
# the machine is doing, so a change of 1-2% shows where the CPU time of
# one run cannot tell it from noise. User space only: the kernel's share
# (fsync, sockets, wake-ups) is not in it.
#
# Each build serves two runs of the bench that differ only in the number
# of jobs (SMALL, then LARGE, at C=32, one lone job, no replays): the
# difference of the two totals over the difference of the jobs is the
# count per job, start-up and migrations cancelled out. Under callgrind the
# threads take turns, so group commits differ from a real run; the builds
# compared meet the same.
#
# Under load the count moves by 2-4% between runs of one binary, as the
# group commits come out differently. LONE=1 counts a lone client's jobs
# instead (one job, then SMALL and LARGE jobs one after another): each is
# a commit of its own, so the count repeats to a few hundred
# instructions, and it is the count of the one-client latency's path.
#
# usage: tools/instructions_per_job.sh BENCH LABEL=ONEJOB [LABEL=ONEJOB ...]
#   BENCH   target/release/examples/bench
#   ONEJOB  a release build of onejob (the first is the baseline)
# env: DOORS ("jobs chat"), SMALL (300), LARGE (1300), REPS (1), LONE (0)
set -euo pipefail

if [ $# -lt 2 ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
bench=$1
shift
doors=${DOORS:-jobs chat}
small=${SMALL:-300}
large=${LARGE:-1300}
reps=${REPS:-1}
if [ "$large" -le "$small" ]; then
    echo "LARGE ($large) must be more than SMALL ($small)" >&2
    exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for spec in "$@"; do
    label=${spec%%=*}
    bin=${spec#*=}
    [ -x "$bin" ] || { echo "$label: $bin is not an executable" >&2; exit 1; }
    printf '#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file="$CG_OUT" %q "$@"\n' \
        "$bin" >"$work/$label.sh"
    chmod +x "$work/$label.sh"
done

total() { # the instructions callgrind counted in one run
    local label=$1 door=$2 jobs=$3 rep=$4
    local out="$work/$label-$door-$jobs-$rep"
    local load=(--jobs "$jobs" --lone 1)
    [ "${LONE:-0}" = 1 ] && load=(--jobs 1 --lone "$jobs")
    CG_OUT="$out.cg" "$bench" --server-bin "$label=$work/$label.sh" --doors "$door" \
        "${load[@]}" --replay-secs 0 --rounds 1 --concurrency 32 >"$out.log" 2>&1 ||
        { echo "bench failed for $label ($door, $jobs jobs): $out.log" >&2; cat "$out.log" >&2; exit 1; }
    sed -n 's/^summary: //p' "$out.cg"
}

printf '%-6s %-10s %6s %16s %8s\n' door build rep "instr. per job" "÷ first"
for door in $doors; do
    for rep in $(seq 1 "$reps"); do
        first=
        for spec in "$@"; do
            label=${spec%%=*}
            a=$(total "$label" "$door" "$small" "$rep")
            b=$(total "$label" "$door" "$large" "$rep")
            per_job=$(( (b - a) / (large - small) ))
            first=${first:-$per_job}
            printf '%-6s %-10s %6s %16d %7.1f%%\n' "$door" "$label" "$rep" "$per_job" \
                "$(awk -v a="$per_job" -v b="$first" 'BEGIN { print 100 * a / b }')"
        done
    done
done
