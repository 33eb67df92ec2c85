#!/usr/bin/env bash
# Creates the compose stack's topics once the broker answers (automatic creation is off).
set -euo pipefail
topics=(/opt/kafka/bin/kafka-topics.sh --bootstrap-server kafka:9092 --create --if-not-exists)
# walbox's progress: one partition, compacted (the evidence that its slot existed), with small
# segments so that compaction keeps its end short (docs/operations.md, "The progress topic").
"${topics[@]}" --topic walbox.progress --partitions 1 --config cleanup.policy=compact --config segment.ms=600000 --config segment.bytes=16777216 --config min.cleanable.dirty.ratio=0.1 --config delete.retention.ms=600000
"${topics[@]}" --topic payments.events --partitions 6
# Rows walbox cannot publish (on_invalid = "dead_letter"), and records the inbox's effect refuses.
"${topics[@]}" --topic walbox.dead_letter --partitions 1
"${topics[@]}" --topic billing.inbox.dlq --partitions 1
