#!/usr/bin/env bash
# Creates the compose stack's topics once the broker answers (automatic creation is off).
set -euo pipefail
topics=(/opt/kafka/bin/kafka-topics.sh --bootstrap-server kafka:9092 --create --if-not-exists)
# walbox's progress: one partition, compacted (the evidence that its slot existed).
"${topics[@]}" --topic walbox.progress --partitions 1 --config cleanup.policy=compact
"${topics[@]}" --topic payments.events --partitions 6
# Rows walbox cannot publish (on_invalid = "dead_letter"), and records the inbox's effect refuses.
"${topics[@]}" --topic walbox.dead_letter --partitions 1
"${topics[@]}" --topic billing.inbox.dlq --partitions 1
