#!/usr/bin/env bash
# A local Ray head node for `ray job submit` (dashboard and job API on 127.0.0.1 only).
#   cluster/local.sh start [extra `ray start` options]    cluster/local.sh stop
# Then: RAY_AUTH_MODE=disabled ray job submit --address http://127.0.0.1:8265 --working-dir . \
#         --runtime-env cluster/runtime_env.yaml -- python -m jobs.cli answer --questions ... --output ...
# This Ray turns token auth on by default; this head turns it off (RAY_AUTH_MODE=disabled for `ray start`
# and for the client). Only the dashboard and job API are bound to 127.0.0.1: the GCS, raylet and agents
# listen on every interface (loopback-only would need Ray's single-machine switch, which keeps worker
# nodes out), so run it where no other machine reaches, or keep auth on.
# A second Ray on the same machine needs its own ports: RAY_DASHBOARD_PORT, RAY_GCS_PORT and
# --dashboard-agent-listen-port / --dashboard-agent-grpc-port / --runtime-env-agent-port /
# --metrics-export-port (else its job agent does not start: "No available agent to submit job").
set -euo pipefail
cd "$(dirname "$0")/.."
RAY=${RAY:-.venv/bin/ray}
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} RAY_USAGE_STATS_ENABLED=0
case "${1:-}" in
  start)
    shift
    "$RAY" start --head --dashboard-host=127.0.0.1 --dashboard-port="${RAY_DASHBOARD_PORT:-8265}" \
      --port="${RAY_GCS_PORT:-6379}" --disable-usage-stats "$@"
    ;;
  stop) "$RAY" stop ;;
  *) echo "usage: $0 start [ray start options] | stop" >&2; exit 2 ;;
esac
