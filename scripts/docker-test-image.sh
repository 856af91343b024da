#!/usr/bin/env bash
# Build the local image the docker sandbox uses in tests: an empty root filesystem (the sandbox
# bind-mounts the host's /usr /lib /lib64 /bin read-only into it). No registry needed.
# Usage: scripts/docker-test-image.sh [TAG]   (default tag: agentgym-empty:latest)
set -euo pipefail
TAG=${1:-agentgym-empty:latest}
if docker image inspect "$TAG" >/dev/null 2>&1; then echo "$TAG exists"; exit 0; fi
tar cf - --files-from /dev/null | docker import - "$TAG" >/dev/null
echo "built $TAG"
