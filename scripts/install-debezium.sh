#!/usr/bin/env bash
# Installs the Debezium rig of the tests' Debezium differential test
# (tests/debezium.rs, in the real-Kafka lane: scripts/real-kafka.sh): Kafka
# Connect's runtime (standalone mode, `org.apache.kafka.connect.cli.ConnectStandalone`)
# and the Debezium PostgreSQL connector with its Outbox Event Router, as listed
# and pinned in scripts/debezium/pom.xml, copied by Maven
# (`dependency:copy-dependencies`) into
# `${WALBOX_DEBEZIUM_CACHE:-/var/cache/walbox/debezium}/<version>/`:
#   connect/                              Connect's classpath (`java -cp 'connect/*'`)
#   plugins/debezium-connector-postgres/  the connector, on Connect's `plugin.path`
# Never inside the repository. Needs `java` and `mvn` (scripts/install-kafka.sh
# installs them; it runs this script).
#
# Idempotent: a marker file in the version's directory names the pom's
# checksum; with it present and matching, nothing is fetched.
#
# Upgrading Debezium: change `debezium.version` in scripts/debezium/pom.xml,
# and `kafka.version` there and in scripts/kafka/pom.xml to the new release's
# `version.kafka` (Debezium's pom names it), plus the default of
# `DEBEZIUM_VERSION` below (`WALBOX_DEBEZIUM_VERSION`, the cache directory the
# tests look in). Maven verifies each artifact's published checksum.
set -euo pipefail
umask 022

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
POM="$here/debezium/pom.xml"
DEBEZIUM_VERSION="${WALBOX_DEBEZIUM_VERSION:-3.6.1.Final}"
DEBEZIUM_CACHE="${WALBOX_DEBEZIUM_CACHE:-/var/cache/walbox/debezium}"
dest="$DEBEZIUM_CACHE/$DEBEZIUM_VERSION"
MARKER=.walbox-debezium

if ! grep -q "<debezium.version>$DEBEZIUM_VERSION</debezium.version>" "$POM"; then
  echo "install-debezium: $POM does not pin Debezium $DEBEZIUM_VERSION; set WALBOX_DEBEZIUM_VERSION to its debezium.version" >&2
  exit 1
fi
want="debezium@$DEBEZIUM_VERSION $(sha256sum "$POM" | cut -d' ' -f1)"
if [ "$(cat "$dest/$MARKER" 2>/dev/null)" = "$want" ]; then
  echo "install-debezium: Debezium $DEBEZIUM_VERSION present in $dest"
  exit 0
fi
for tool in java mvn; do
  if ! command -v "$tool" >/dev/null; then
    echo "install-debezium: $tool not found; run scripts/install-kafka.sh first" >&2
    exit 1
  fi
done

if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo); fi
tmp=$(mktemp -d /tmp/walbox-debezium.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

retry() {
  local attempt
  for attempt in 1 2 3 4 5; do
    "$@" && return 0
    echo "install-debezium: '$*' failed (attempt $attempt of 5)" >&2
    sleep $((attempt * 5))
  done
  return 1
}

copy() { # profile, output directory, more arguments
  local profile=$1 out=$2
  shift 2
  retry mvn -B -q -Dstyle.color=never --strict-checksums -f "$POM" -P "$profile" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$out" "$@"
}

echo "install-debezium: Kafka Connect and Debezium $DEBEZIUM_VERSION into $dest"
copy connect "$tmp/connect"
# Connect provides its API, the Kafka clients and SLF4J to plugins: not copied
# into the plugin's directory, where a second copy would shadow Connect's.
copy plugin "$tmp/plugins/debezium-connector-postgres" -DexcludeGroupIds=org.apache.kafka,org.slf4j
for jar in connect/connect-runtime-*.jar plugins/debezium-connector-postgres/debezium-connector-postgres-"$DEBEZIUM_VERSION".jar; do
  if ! compgen -G "$tmp/$jar" >/dev/null; then
    echo "install-debezium: Maven did not bring $jar; not installed" >&2
    exit 1
  fi
done
echo "$want" >"$tmp/$MARKER"
chmod -R a+rX "$tmp"
"${sudo[@]}" mkdir -p "$DEBEZIUM_CACHE"
"${sudo[@]}" rm -rf "$dest.new"
"${sudo[@]}" cp -a "$tmp" "$dest.new"
"${sudo[@]}" rm -rf "$dest"
"${sudo[@]}" mv "$dest.new" "$dest"
echo "install-debezium: done"
