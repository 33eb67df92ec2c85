#!/usr/bin/env bash
# Where walbox's time goes while it drains a backlog of 100-row transactions: a `perf` profile
# of the first walbox drain of `cargo bench --bench e2e`'s drain section, summed by thread and
# by part of the relay (decoding, mapping, producing, librdkafka, libc, the kernel).
#
#   bash scripts/profile-drain.sh [mock|apache] [out-dir]
#
# mock (default) drains into librdkafka's mock cluster, apache into a single-node Apache Kafka
# broker (scripts/install-deps.sh installs both). The bench's own table (walbox against
# pg_recvlogical on an identical slot) lands in <out-dir>/results-<broker>.md, the profile's
# summary in <out-dir>/profile-<broker>.txt. Needs `perf` (Debian: linux-perf) and root or
# kernel.perf_event_paranoid <= 1. WALBOX_BENCH_ROWS (default 1,000,000) sets the backlog and
# WALBOX_BENCH_SECTIONS (default drain) what else the bench runs; the profile samples
# SECONDS_TO_SAMPLE (default 4) from the start of the first walbox drain, which is the first
# pair's (the bench's other three pairs run unobserved).
set -euo pipefail

broker=${1:-mock}
out=${2:-target/profile-drain}
seconds=${SECONDS_TO_SAMPLE:-4}
case "$broker" in
mock | apache) ;;
*)
    echo "usage: $0 [mock|apache] [out-dir]" >&2
    exit 2
    ;;
esac
command -v perf >/dev/null || {
    echo "perf is not installed (Debian: apt-get install linux-perf)" >&2
    exit 2
}
cd "$(dirname "$0")/.."
mkdir -p "$out"
out=$(cd "$out" && pwd)

# Build first, so the profile's window starts at the drain and not at the compiler.
cargo bench --features sandbox --bench e2e --no-run >&2

WALBOX_BENCH_KAFKA=$broker WALBOX_BENCH_SECTIONS=${WALBOX_BENCH_SECTIONS:-drain} \
    WALBOX_BENCH_ROWS=${WALBOX_BENCH_ROWS:-1000000} \
    WALBOX_BENCH_OUTPUT="$out/results-$broker.md" \
    cargo bench --features sandbox --bench e2e >"$out/bench-$broker.log" 2>&1 &
bench=$!
trap 'kill $bench 2>/dev/null || true' EXIT

# The first walbox drain of the run (the bench starts walbox as `walbox run`).
pid=
for _ in $(seq 1 1200); do
    pid=$(pgrep -n -f "release/walbox run" || true)
    [ -n "$pid" ] && break
    kill -0 $bench 2>/dev/null || {
        echo "the bench ended before walbox started: $out/bench-$broker.log" >&2
        exit 1
    }
    sleep 0.25
done
[ -n "$pid" ] || {
    echo "no walbox drain started within 5 minutes" >&2
    exit 1
}
perf record -F 999 -g -p "$pid" -o "$out/perf-$broker.data" -- sleep "$seconds" >/dev/null 2>&1
wait $bench
trap - EXIT

perf report -i "$out/perf-$broker.data" --no-children --sort comm,dso,sym -g none --stdio \
    --percent-limit 0 -t $'\t' 2>/dev/null |
    python3 "$(dirname "$0")/profile_summary.py" >"$out/profile-$broker.txt"
cat "$out/profile-$broker.txt"
grep -E "backlog drain|relay CPU" "$out/results-$broker.md" || true
