#!/usr/bin/env bash
# A local Ray head node for `ray job submit`, with token auth on (dashboard and job API on 127.0.0.1).
#   cluster/local.sh start [extra `ray start` options]    cluster/local.sh stop [--all]
# Then: RAY_AUTH_MODE=token ray job submit --address http://127.0.0.1:8265 --working-dir . \
#         --runtime-env cluster/runtime_env.yaml -- python -m jobs.cli answer --questions ... --output ...
# The token is RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token (made on the first
# start, readable by its owner only, kept for the next); a client or worker node needs it and
# RAY_AUTH_MODE=token (worker: RAY_AUTH_TOKEN=<the file's text> ray start --address ...). Why on: the
# GCS, raylet and agents listen on every interface (loopback-only would need Ray's single-machine
# switch, which keeps worker nodes out), and without a token anyone reaching them runs code here.
# RAY_AUTH_MODE=disabled turns it off, for a machine no other one reaches.
# A second Ray on the same machine needs its own ports: RAY_DASHBOARD_PORT, RAY_GCS_PORT and
# --dashboard-agent-listen-port / --dashboard-agent-grpc-port / --runtime-env-agent-port /
# --metrics-export-port (else its job agent does not start: "No available agent to submit job").
# `stop` stops the head on RAY_GCS_PORT (default 6379, as `start` gave it) and what belongs to it, no
# other Ray on the machine (cluster/stop_head.py); `stop --all` is `ray stop`: every Ray here, anyone's.
set -euo pipefail
cd "$(dirname "$0")/.."
RAY=${RAY:-.venv/bin/ray}
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token} RAY_USAGE_STATS_ENABLED=0
case "${1:-}" in
  start)
    shift
    token_file=${RAY_AUTH_TOKEN_PATH:-${HOME:-~}/.ray/auth_token}
    if [ "$RAY_AUTH_MODE" = token ] && [ -z "${RAY_AUTH_TOKEN:-}" ] && [ ! -s "$token_file" ]; then
      # 32 random bytes in hex, as `ray get-auth-token --generate` makes (which writes ~/.ray only)
      mkdir -p "$(dirname "$token_file")"
      (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$token_file")
      chmod 600 "$token_file"  # an empty file that was there keeps its mode through the write
    fi
    "$RAY" start --head --dashboard-host=127.0.0.1 --dashboard-port="${RAY_DASHBOARD_PORT:-8265}" \
      --port="${RAY_GCS_PORT:-6379}" --disable-usage-stats "$@"
    ;;
  stop)
    if [ "${2:-}" = --all ]; then
      "$RAY" stop
    else
      "$(dirname "$(command -v "$RAY")")/python" cluster/stop_head.py "${RAY_GCS_PORT:-6379}"
    fi
    ;;
  *) echo "usage: $0 start [ray start options] | stop [--all]" >&2; exit 2 ;;
esac
