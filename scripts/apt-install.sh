#!/usr/bin/env bash
# Install Debian packages with apt-get (as root), waiting for another apt or dpkg to finish
# rather than failing at once: on a freshly booted machine unattended-upgrades often holds
# apt's locks for minutes.
#   scripts/apt-install.sh PACKAGE...
# TRAINPORT_APT_WAIT_SECONDS (default 900) bounds the wait for each apt-get run.
set -euo pipefail

wait_s=${TRAINPORT_APT_WAIT_SECONDS:-900}

# apt-get waits for the dpkg lock when given DPkg::Lock::Timeout (saying so once a second),
# but `update` takes the package lists' lock without waiting: a run that failed on a lock is
# retried until the same deadline. Either way the wait is told once, on stderr; apt's output
# of the last run is left in apt_out.
apt_out=""
told=""
apt_get() {
  local deadline=$((SECONDS + wait_s))
  while ! apt_out=$(apt-get -o "DPkg::Lock::Timeout=$wait_s" -q "$@" 2>&1 | tell_wait); do
    if ! grep -qE "Could not get lock|Unable to lock" <<<"$apt_out" || [ "$SECONDS" -ge "$deadline" ]; then
      return 1
    fi
    [ -n "$told" ] || say_wait "$(grep -m1 -E "Could not get lock|Unable to lock" <<<"$apt_out")"
    told=1
    sleep 2
  done
}

say_wait() {
  echo "another apt or dpkg is running; waiting up to ${wait_s} s for it ($1)" >&2
}

# Passes apt's output through, telling the first "Waiting for cache lock" line on stderr.
tell_wait() {
  local line seen="$told"
  while IFS= read -r line; do
    printf '%s\n' "$line"
    if [ -z "$seen" ] && [[ $line == "Waiting for cache lock"* ]]; then
      say_wait "${line#Waiting for cache lock: }"
      seen=1
    fi
  done
}

# Stale package lists are the usual reason an install fails on a fresh machine: update them
# and try once more, showing apt's own error if that fails too.
if ! apt_get install -y "$@"; then
  apt_get update && apt_get install -y "$@" || {
    printf '%s\n' "$apt_out" >&2
    exit 1
  }
fi
