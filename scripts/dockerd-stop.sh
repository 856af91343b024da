#!/usr/bin/env bash
# Stop the Docker engine started by scripts/dockerd-start.sh (only that one, by its pid file).
set -euo pipefail
PIDFILE=${AGENTGYM_DOCKERD_PIDFILE:-/tmp/agentgym-dockerd.pid}
[ -f "$PIDFILE" ] || { echo "no $PIDFILE: nothing to stop"; exit 0; }
PID=$(cat "$PIDFILE")
if kill -0 "$PID" 2>/dev/null; then
  kill "$PID"
  for _ in $(seq 1 40); do kill -0 "$PID" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$PID" 2>/dev/null && kill -9 "$PID"
fi
rm -f "$PIDFILE"
echo "dockerd stopped"
