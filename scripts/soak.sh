#!/usr/bin/env bash
# The mixed-fault soak on Apache Kafka (examples/soak): two walbox processes (one active, one
# hot standby) relay a steady stream of outbox events from a throwaway PostgreSQL to a
# three-node KRaft cluster (the jars that scripts/install-kafka.sh caches) while faults hit one
# after another: walbox SIGKILLed and SIGTERMed (the standby takes over), the Kafka node leading
# a partition killed and restarted, PostgreSQL restarted (fast and immediate), the active
# walbox partitioned from PostgreSQL, walbox cut off from every Kafka node. An independent
# read_committed consumer counts every event; the soak fails on any event missing, and in
# exactly-once mode on any event read twice.
#
#   bash scripts/soak.sh                          # the real-Kafka lane's run: 50 faults
#   bash scripts/soak.sh --faults 1000 --gap 0-1  # any of the example's arguments
#   SOAK_PROFILE=release bash scripts/soak.sh --minutes 60
#
# Builds walbox and the example with the test suite's features (debug, so the lane reuses
# its build) unless SOAK_PROFILE=release.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-kafka.sh >/dev/null

if [ "$#" -eq 0 ]; then
  set -- --faults 50 --gap 0-1
fi

profile=${SOAK_PROFILE:-debug}
if [ "$profile" = release ]; then
  cargo build --locked --release --features sandbox --bin walbox --example soak
else
  cargo build --locked --features failpoints --bin walbox --example soak
fi

start=$(date +%s)
"target/$profile/examples/soak" "$@"
echo "soak: passed in $(($(date +%s) - start)) s"
