#!/usr/bin/env bash
# Installs the Apache Kafka broker of the tests' real-Kafka lane
# (`WALBOX_TEST_KAFKA=apache`, scripts/real-kafka.sh): the jars of
# org.apache.kafka:kafka_2.13 and a log4j2 binding, as listed and pinned in
# scripts/kafka/pom.xml, copied by Maven (`dependency:copy-dependencies`) into
# `${WALBOX_KAFKA_CACHE:-/var/cache/walbox/kafka}/<version>/libs`. Never inside
# the repository. The tests run the broker from there with `java -cp 'libs/*'`
# (no binary distribution, no scripts of Kafka's).
#
# Installs Debian's JRE (default-jre-headless) and Maven when `java` or `mvn`
# is missing. Idempotent: a marker file in the version's directory names the
# pom's checksum; with it present and matching, nothing is fetched.
#
# Upgrading Kafka: change `kafka.version` in scripts/kafka/pom.xml (and the
# default of `KAFKA_VERSION` below, which names the cache directory the tests
# look in: `WALBOX_KAFKA_VERSION`), then run this script. Maven downloads the
# new artifacts from Maven Central and verifies each one's published checksum
# (`--strict-checksums`: a mismatch fails the install instead of warning). The
# old version's directory stays until removed by hand. walbox pins the Kafka
# that the Debezium release of its Kafka Connect tests builds against
# (Debezium's `version.kafka`), so upgrade both together.
set -euo pipefail
umask 022

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
POM="$here/kafka/pom.xml"
KAFKA_VERSION="${WALBOX_KAFKA_VERSION:-4.3.0}"
KAFKA_CACHE="${WALBOX_KAFKA_CACHE:-/var/cache/walbox/kafka}"
dest="$KAFKA_CACHE/$KAFKA_VERSION"
MARKER=.walbox-kafka

if ! grep -q "<kafka.version>$KAFKA_VERSION</kafka.version>" "$POM"; then
  echo "install-kafka: $POM does not pin Kafka $KAFKA_VERSION; set WALBOX_KAFKA_VERSION to its kafka.version" >&2
  exit 1
fi
want="kafka_2.13@$KAFKA_VERSION $(sha256sum "$POM" | cut -d' ' -f1)"
if [ "$(cat "$dest/$MARKER" 2>/dev/null)" = "$want" ]; then
  echo "install-kafka: Apache Kafka $KAFKA_VERSION present in $dest"
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo); fi
tmp=$(mktemp -d /tmp/walbox-kafka.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

retry() {
  local attempt
  for attempt in 1 2 3 4 5; do
    "$@" && return 0
    echo "install-kafka: '$*' failed (attempt $attempt of 5)" >&2
    sleep $((attempt * 5))
  done
  return 1
}

missing=()
command -v java >/dev/null || missing+=(default-jre-headless)
command -v mvn >/dev/null || missing+=(maven)
if [ "${#missing[@]}" -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    echo "install-kafka: apt-get not found; install these yourself: ${missing[*]}" >&2
    exit 1
  fi
  echo "install-kafka: installing ${missing[*]}"
  apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=300)
  retry "${apt[@]}" update
  retry "${apt[@]}" install -y --no-install-recommends "${missing[@]}"
fi

echo "install-kafka: Apache Kafka $KAFKA_VERSION into $dest"
retry mvn -B -q -Dstyle.color=never --strict-checksums -f "$POM" dependency:copy-dependencies \
  -DincludeScope=runtime -DoutputDirectory="$tmp/libs"
if [ ! -f "$tmp/libs/kafka_2.13-$KAFKA_VERSION.jar" ]; then
  echo "install-kafka: Maven did not bring kafka_2.13-$KAFKA_VERSION.jar; not installed" >&2
  exit 1
fi
echo "$want" >"$tmp/$MARKER"
chmod -R a+rX "$tmp"
"${sudo[@]}" mkdir -p "$KAFKA_CACHE"
"${sudo[@]}" rm -rf "$dest.new"
"${sudo[@]}" cp -a "$tmp" "$dest.new"
"${sudo[@]}" rm -rf "$dest"
"${sudo[@]}" mv "$dest.new" "$dest"
echo "install-kafka: done"
