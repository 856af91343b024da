#!/usr/bin/env bash
# Start a Docker engine for the sandbox tests (no bridge, no iptables: containers run with
# --network none anyway). Idempotent: does nothing if `docker info` already answers.
# Usage: scripts/dockerd-start.sh   (needs root; logs to ${AGENTGYM_DOCKERD_LOG:-/tmp/agentgym-dockerd.log})
set -euo pipefail
LOG=${AGENTGYM_DOCKERD_LOG:-/tmp/agentgym-dockerd.log}
PIDFILE=${AGENTGYM_DOCKERD_PIDFILE:-/tmp/agentgym-dockerd.pid}
if docker info >/dev/null 2>&1; then
  echo "dockerd already running"; exit 0
fi
command -v dockerd >/dev/null || { echo "dockerd not found: apt-get install -y docker.io" >&2; exit 1; }
nohup dockerd --bridge=none --iptables=false --ip6tables=false >"$LOG" 2>&1 &
echo $! >"$PIDFILE"
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then echo "dockerd started (pid $(cat "$PIDFILE"))"; exit 0; fi
  sleep 0.5
done
echo "dockerd did not come up; see $LOG" >&2
tail -20 "$LOG" >&2
exit 1
