#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages walbox needs to build and test:
# PostgreSQL server binaries (for the throwaway clusters of `walbox demo` and
# the tests), OpenSSL headers, a C toolchain, and promtool (alert rule tests).
#
# Idempotent: does nothing when everything is installed. Non-interactive.
# Does not leave Debian's default "main" PostgreSQL cluster (or the
# Prometheus server) running: walbox starts its own throwaway clusters.
# Runs apt-get through sudo when not root.
set -euo pipefail

PACKAGES=(postgresql postgresql-contrib libssl-dev pkg-config build-essential prometheus)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

missing=()
for pkg in "${PACKAGES[@]}"; do
  installed "$pkg" || missing+=("$pkg")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all packages present: ${PACKAGES[*]}"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install-deps: apt-get not found; install these packages yourself: ${missing[*]}" >&2
  exit 1
fi
if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo); fi
echo "install-deps: installing ${missing[*]}"

# While apt-get runs: keep postgresql-common from creating the default
# cluster, and (unless the machine has its own policy) keep package scripts
# from starting services. Both are undone on exit.
cleanup=()
on_exit() { for path in "${cleanup[@]}"; do "${sudo[@]}" rm -f "$path"; done; }
trap on_exit EXIT
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
retry() {
  local attempt
  for attempt in 1 2 3 4 5; do
    "$@" && return 0
    echo "install-deps: '$*' failed (attempt $attempt of 5)" >&2
    sleep $((attempt * 5))
  done
  return 1
}
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
if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null; then
  # Only promtool is wanted: no Prometheus server now or at boot.
  "${sudo[@]}" systemctl disable --quiet prometheus 2>/dev/null || true
  if systemctl is-active --quiet prometheus 2>/dev/null; then
    "${sudo[@]}" systemctl stop prometheus
  fi
fi
echo "install-deps: done"
