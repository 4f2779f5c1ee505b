#!/usr/bin/env bash
# apt-get update, retried every 5 s for up to 5 minutes while another apt holds the package lists' lock: unlike
# apt-get install, apt-get update does not wait for that lock (DPkg::Lock::Timeout covers dpkg's only; apt 2.6).
# CI installs chromium while the compose smoke test sets up Docker, both with apt. Output is appended to LOG.
# Usage: scripts/apt-update.sh LOG
set -u
log="$1"
waited=0
until timeout 300 apt-get -o DPkg::Lock::Timeout=240 update -qq >>"$log" 2>&1; do
  tail -3 "$log" | grep -q "Could not get lock" && [ "$waited" -lt 300 ] || exit 1
  sleep 5
  waited=$((waited + 5))
done
