#!/usr/bin/env bash
# The real-Kafka lane: runs the integration tests that a stand-in broker cannot
# prove against Apache Kafka itself (`WALBOX_TEST_KAFKA=apache`): one
# single-node KRaft broker, started by the test binary from the jars that
# scripts/install-kafka.sh puts in the Kafka cache, shared by every test with
# topics and groups of their own, and killed when the binary exits.
#
#   bash scripts/real-kafka.sh                    # the lane's modules (below)
#   bash scripts/real-kafka.sh exactly_once::     # only these test filters
#
# The lane: exactly-once (fencing, transaction markers, read_committed; the
# fault suite: SIGKILLs, a broker restart, a partition leader killed in a
# three-node cluster, cut PostgreSQL connections, a refused event, a hot standby
# handing the slot back), `walbox check`'s
# transactions probe, the
# inbox's consumer group (rebalances, restarts, the retention guard), the
# progress topic and the start-up decision read from it (also grown to
# millions of records: progress_topic::), `walbox audit`,
# SASL/SCRAM handshakes (plain and over TLS), every command on a cluster
# with ACLs (kafka_acls::), routing with topic creation,
# the progress topic's cleanup policy and segments in `walbox check`, a wrong
# SCRAM password in `walbox check`, the Debezium
# differential test (Kafka Connect standalone with the Debezium
# PostgreSQL connector, from scripts/install-debezium.sh; with Connect's
# JsonConverter and JSON expansion: debezium_converters::), the migration from
# Debezium to walbox on its slot (debezium_migration::), and the core
# relay's SIGKILL test, a timestamp the broker refuses, and exactly-once through a lagging
# promotion (PostgreSQL 17). Ignored tests (those needing a real
# broker) run too. Tests that inject broker faults need the mock cluster and
# say "external broker: … skipped" here. The whole lane (no filters) ends with
# the mixed-fault soak's short run (scripts/soak.sh: 50 faults on a
# three-node cluster).
#
# The broker logs to a file; its last lines are printed when a test fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-kafka.sh >/dev/null
bash scripts/install-debezium.sh >/dev/null

whole_lane=false
if [ "$#" -eq 0 ]; then
  whole_lane=true
  set -- exactly_once:: exactly_once_faults:: exactly_once_history:: exactly_once_window:: exactly_once_refusals:: \
    ha::a_process_taking_its_slot_back inbox:: progress:: progress_topic:: audit:: \
    kafka_security:: kafka_acls:: routing:: debezium:: debezium_converters:: debezium_migration:: \
    relay::sigkill_at_random_points failures::a_timestamp_the_broker promotion::exactly_once \
    check_kafka::exactly_once_probes check_kafka::a_transaction_log_needing \
    check_kafka::the_progress_topic_must_be_compacted check_kafka::the_progress_topic_needs_small_segments \
    check_kafka::a_wrong_scram_password check::everything_passes
fi

log=$(mktemp -t walbox-kafka-broker.XXXXXX.log)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
if ! WALBOX_TEST_KAFKA=apache WALBOX_TEST_KAFKA_LOG="$log" \
  cargo test --locked --features failpoints --test main -- --include-ignored "$@"; then
  echo "real-kafka: tests failed; the Apache Kafka broker's log ($log), last 50 lines:" >&2
  tail -n 50 "$log" >&2
  trap - EXIT
  exit 1
fi
if $whole_lane; then
  bash scripts/soak.sh --faults 50 --gap 0-1
fi
echo "real-kafka: lane passed in $(($(date +%s) - start)) s"
