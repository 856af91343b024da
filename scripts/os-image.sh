#!/usr/bin/env bash
# Build the local image agentgym/OS-v0 runs its tasks in, from the host's own Debian packages
# (no registry, no network). Prints its tag (agentgym-os:<hash>); a no-op when it exists.
# Usage: scripts/os-image.sh   (needs a running Docker engine: scripts/dockerd-start.sh)
set -euo pipefail
PY=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
exec "$PY" -m agentgym.envs.code.os_image
