#!/usr/bin/env bash
# Runs the version-sensitive integration tests on other PostgreSQL majors than
# Debian's (on which `cargo test` runs the whole suite): end to end with
# SIGKILLs and crash points, slot safety (alert levels, lost and dropped slots,
# idle advance, heartbeats, `walbox status`), the table-less outbox, connection
# and authentication, a publication that stops covering the outbox while walbox
# streams, and what differs between majors (`versions`).
#
#   bash scripts/test-matrix.sh            # 13 14 16 17 18
#   bash scripts/test-matrix.sh 13 18      # only these
#
# Each major's server binaries come from scripts/install-deps.sh (the version
# cache); the tests pick the major from WALBOX_TEST_PG. Prints the time each
# major took; exits non-zero if any failed, after running them all.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

FILTERS=(relay:: crash:: shards:: slot:: connection:: routing::table_less recovery::a_dropped_slot publication:: versions:: check:: failover:: promotion::)
majors=("$@")
[ "${#majors[@]}" -gt 0 ] || majors=(13 14 16 17 18)

failed=()
summary=()
for major in "${majors[@]}"; do
  echo "test-matrix: PostgreSQL $major: ${FILTERS[*]}"
  start=$(date +%s)
  if WALBOX_TEST_PG=$major cargo test --locked --features failpoints --test main -- "${FILTERS[@]}"; then
    result=passed
  else
    result=FAILED
    failed+=("$major")
  fi
  summary+=("PostgreSQL $major: $result in $(($(date +%s) - start)) s")
done
printf 'test-matrix: %s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "test-matrix: failed on PostgreSQL ${failed[*]}" >&2
  exit 1
fi
