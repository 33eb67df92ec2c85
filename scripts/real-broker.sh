#!/usr/bin/env bash
# Runs walbox's integration tests against a real Kafka-protocol broker instead of
# librdkafka's mock cluster: tansu (a Kafka-compatible broker in Rust, from the
# Rust package registry, pinned below), in memory, on loopback.
#
#   bash scripts/real-broker.sh                 # the whole integration suite, ignored tests included
#   bash scripts/real-broker.sh routing:: inbox::  # only these test filters
#   bash scripts/real-broker.sh --install       # only build and install the broker
#
# What this adds to `cargo test` on the mock cluster: the tests marked #[ignore]
# because the mock cluster does not implement an API (topic creation,
# `CreateTopics`), and the paths that take another branch on a real broker (the
# inbox's retention guard reads DescribeConfigs). Tests that inject faults need
# the mock cluster and skip themselves here (they print "external broker: …").
#
# Not part of CI: the broker's first build takes 15–30 minutes on 2 cores. It is
# installed once into $WALBOX_TANSU_ROOT (default /var/cache/walbox/tansu, next to
# the PostgreSQL version cache) and reused. Every run starts a fresh broker (memory
# storage) on $WALBOX_TANSU_PORT (default 19092) and stops it on exit; its log is
# printed when a test fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TANSU_VERSION=0.6.0
ROOT=${WALBOX_TANSU_ROOT:-/var/cache/walbox/tansu}
PORT=${WALBOX_TANSU_PORT:-19092}
BIN=$ROOT/bin/tansu

install_broker() {
  if [ -x "$BIN" ] && [ "$(cat "$ROOT/version" 2>/dev/null)" = "$TANSU_VERSION" ]; then
    return
  fi
  echo "real-broker: building tansu $TANSU_VERSION (15–30 minutes the first time)"
  cargo install tansu --version "=$TANSU_VERSION" --features dynostore --locked \
    --root "$ROOT" --target-dir "$ROOT/build"
  echo "$TANSU_VERSION" >"$ROOT/version"
  rm -rf "$ROOT/build"
}

install_broker
[ "${1:-}" = "--install" ] && exit 0

log=$(mktemp -t tansu.XXXXXX.log)
"$BIN" broker \
  --listener-url "tcp://127.0.0.1:$PORT" \
  --advertised-listener-url "tcp://127.0.0.1:$PORT" \
  --storage-engine memory://tansu/ >"$log" 2>&1 &
broker=$!
trap 'kill "$broker" 2>/dev/null || true; wait "$broker" 2>/dev/null || true' EXIT

# Bounded wait for the listener (the broker starts in well under a second).
for _ in $(seq 1 100); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    break
  fi
  if ! kill -0 "$broker" 2>/dev/null; then
    echo "real-broker: tansu exited at start-up:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.1
done
echo "real-broker: tansu $TANSU_VERSION listening on 127.0.0.1:$PORT (log: $log)"

export WALBOX_TEST_KAFKA_BROKERS="127.0.0.1:$PORT"
if ! cargo test --locked --features failpoints --test main -- --include-ignored "$@"; then
  echo "real-broker: tests failed; the broker's log ($log), last 50 lines:" >&2
  tail -n 50 "$log" >&2
  exit 1
fi
