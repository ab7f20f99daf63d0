#!/usr/bin/env bash
# A rill fleet without Kubernetes: N `rill serve` replicas on this machine, plus sglang-router
# in front of them with prefix-aware (cache_aware) routing. See README.md next to this file.
#
#   deploy/sglang-router/run-fleet.sh            # 2 replicas, 1 thread each, router on :30000
#   N=4 THREADS=2 deploy/sglang-router/run-fleet.sh
#   WORKERS="http://10.0.0.5:8000 http://10.0.0.6:8000" N=0 deploy/sglang-router/run-fleet.sh
#
# Ctrl-C (or SIGTERM) stops the router, then sends each replica one SIGTERM: it drains (503 to
# new requests, running ones finish for up to SHUTDOWN_TIMEOUT seconds) and exits.
#
# Settings (environment variables):
#   N                 replicas to start here (default 2; 0 = only WORKERS)
#   RILL              rill binary (default: target/release/rill if built, else `rill` on PATH)
#   MODEL             --model (default smollm2); SERVED_NAME --served-model-name (smollm2-135m)
#   THREADS           --threads per replica (default 1)
#   KV_CACHE_MB       --kv-cache-mb per replica (default 256)
#   MAX_RUNNING       --max-running (default 16); MAX_QUEUE --max-queue (default 64)
#   HOST, BASE_PORT   replicas listen on HOST:BASE_PORT, HOST:BASE_PORT+1, ... (127.0.0.1, 8001)
#   KV_EVENTS         1: also publish KV events on tcp://HOST:(BASE_KV_PORT+i) (default 0;
#                     sglang-router does not read them, llm-d's EPP does)
#   BASE_KV_PORT      first KV-events port (default 5557)
#   SHUTDOWN_TIMEOUT  --shutdown-timeout (default 30)
#   PIN               1: pin replica i to cores [i*THREADS, (i+1)*THREADS) with taskset
#   WORKERS           extra worker URLs (replicas already running on other hosts)
#   ROUTER_HOST, ROUTER_PORT   where the router listens (127.0.0.1, 30000)
#   POLICY            router policy (default cache_aware)
#   PYTHON            Python with sglang-router installed (default python3)
#   LOG_DIR           replica and router logs (default ./fleet-logs)
set -euo pipefail

N=${N:-2}
if [[ -z "${RILL:-}" ]]; then
  here=$(cd "$(dirname "$0")/../.." && pwd)
  if [[ -x "$here/target/release/rill" ]]; then RILL="$here/target/release/rill"; else RILL=rill; fi
fi
MODEL=${MODEL:-smollm2}
SERVED_NAME=${SERVED_NAME:-smollm2-135m}
THREADS=${THREADS:-1}
KV_CACHE_MB=${KV_CACHE_MB:-256}
MAX_RUNNING=${MAX_RUNNING:-16}
MAX_QUEUE=${MAX_QUEUE:-64}
HOST=${HOST:-127.0.0.1}
BASE_PORT=${BASE_PORT:-8001}
KV_EVENTS=${KV_EVENTS:-0}
BASE_KV_PORT=${BASE_KV_PORT:-5557}
SHUTDOWN_TIMEOUT=${SHUTDOWN_TIMEOUT:-30}
PIN=${PIN:-0}
WORKERS=${WORKERS:-}
ROUTER_HOST=${ROUTER_HOST:-127.0.0.1}
ROUTER_PORT=${ROUTER_PORT:-30000}
POLICY=${POLICY:-cache_aware}
PYTHON=${PYTHON:-python3}
LOG_DIR=${LOG_DIR:-./fleet-logs}

command -v curl >/dev/null || { echo "run-fleet: curl is needed" >&2; exit 1; }
if ! "$PYTHON" -c 'import sglang_router' 2>/dev/null; then
  echo "run-fleet: sglang-router is not installed for $PYTHON (pip install sglang-router)" >&2
  exit 1
fi
if (( N > 0 )) && ! command -v "$RILL" >/dev/null && [[ ! -x "$RILL" ]]; then
  echo "run-fleet: rill binary '$RILL' not found (cargo build --release, or set RILL)" >&2
  exit 1
fi
mkdir -p "$LOG_DIR"

replica_pids=()
router_pid=""

stop_all() {
  trap - INT TERM EXIT
  if [[ -n "$router_pid" ]] && kill -0 "$router_pid" 2>/dev/null; then
    kill -TERM "$router_pid" 2>/dev/null || true
    wait "$router_pid" 2>/dev/null || true
  fi
  # One SIGTERM each: every replica drains (a second signal would make it exit at once).
  for pid in ${replica_pids[@]+"${replica_pids[@]}"}; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in ${replica_pids[@]+"${replica_pids[@]}"}; do
    wait "$pid" 2>/dev/null || true
  done
}
trap stop_all INT TERM EXIT

urls=()
if (( N > 0 )); then
  # Fetch the model once, so N replicas do not all download it at the same time.
  [[ -f "$MODEL" ]] || "$RILL" pull "$MODEL" >/dev/null

  # Each replica runs in its own session, so a Ctrl-C in this terminal reaches only this
  # script: rill treats a second signal as "exit at once", and the terminal's SIGINT plus the
  # SIGTERM sent by stop_all would be two. (Without job control a background job is not a
  # process-group leader, so setsid execs in place and $! stays the replica's pid.)
  session=()
  if command -v setsid >/dev/null; then
    session=(setsid)
  else
    echo "run-fleet: no setsid: Ctrl-C will stop replicas at once instead of draining them" >&2
  fi

  for (( i = 0; i < N; i++ )); do
    port=$(( BASE_PORT + i ))
    args=(serve --model "$MODEL" --served-model-name "$SERVED_NAME"
          --host "$HOST" --port "$port" --threads "$THREADS"
          --kv-cache-mb "$KV_CACHE_MB" --max-running "$MAX_RUNNING" --max-queue "$MAX_QUEUE"
          --shutdown-timeout "$SHUTDOWN_TIMEOUT" --replica-id "$HOST:$port")
    if [[ "$KV_EVENTS" == 1 ]]; then
      args+=(--kv-events "tcp://$HOST:$(( BASE_KV_PORT + i ))")
    fi
    launcher=(${session[@]+"${session[@]}"})
    if [[ "$PIN" == 1 ]]; then
      first=$(( i * THREADS )); last=$(( first + THREADS - 1 ))
      launcher+=(taskset -c "$first-$last")
    fi
    ${launcher[@]+"${launcher[@]}"} "$RILL" "${args[@]}" >"$LOG_DIR/replica-$port.log" 2>&1 &
    replica_pids+=($!)
    urls+=("http://$HOST:$port")
    echo "run-fleet: replica $i pid $! on http://$HOST:$port (log $LOG_DIR/replica-$port.log)"
  done
fi
for w in $WORKERS; do urls+=("$w"); done
if (( ${#urls[@]} == 0 )); then
  echo "run-fleet: no replicas (N=0 and WORKERS empty)" >&2
  exit 1
fi

# Start the router only once every replica is ready: /health answers 200 while a model is
# still loading, and the router registers a worker from that.
for url in "${urls[@]}"; do
  for (( t = 0; ; t++ )); do
    if curl -fs -o /dev/null --max-time 2 "$url/ready" 2>/dev/null; then break; fi
    for pid in ${replica_pids[@]+"${replica_pids[@]}"}; do
      kill -0 "$pid" 2>/dev/null || { echo "run-fleet: replica pid $pid exited; see $LOG_DIR" >&2; exit 1; }
    done
    (( t < 600 )) || { echo "run-fleet: $url not ready after 300 s" >&2; exit 1; }
    sleep 0.5
  done
  echo "run-fleet: $url ready"
done

# Router flags, and why (sglang-router 0.3.2 defaults in brackets):
#   --health-check-endpoint /ready [/health]: rill's /health stays 200 while draining; /ready
#       turns 503 at the first SIGTERM, so a draining replica leaves rotation.
#   --health-check-interval-secs 1 [60], --health-failure-threshold 1 [3]: leave within ~1 s.
#   --health-success-threshold 2 [2]: a replica back from a restart needs two good checks.
#   --retry-max-retries 3 [5], --retry-initial-backoff-ms 20 [50]: the 503s a replica answers
#       between its drain and the next health check are retried on another replica, so
#       clients never see them.
#   --balance-abs-threshold 8 [64]: cache_aware follows prefixes until worker loads differ by
#       more than this many in-flight requests (and by the relative factor 1.5); 64 suits
#       GPU servers, a CPU replica runs ~--max-running sequences at best.
#   --request-timeout-secs 600 [1800]: longest request (a long streamed answer on a CPU).
"$PYTHON" -m sglang_router.launch_router \
  --host "$ROUTER_HOST" --port "$ROUTER_PORT" \
  --worker-urls "${urls[@]}" \
  --policy "$POLICY" \
  --cache-threshold 0.3 \
  --balance-abs-threshold 8 \
  --balance-rel-threshold 1.5 \
  --health-check-endpoint /ready \
  --health-check-interval-secs 1 \
  --health-check-timeout-secs 2 \
  --health-failure-threshold 1 \
  --health-success-threshold 2 \
  --retry-max-retries 3 \
  --retry-initial-backoff-ms 20 \
  --retry-max-backoff-ms 1000 \
  --request-timeout-secs 600 \
  --shutdown-grace-period-secs "$SHUTDOWN_TIMEOUT" \
  --prometheus-host 127.0.0.1 --prometheus-port 29000 \
  >"$LOG_DIR/router.log" 2>&1 &
router_pid=$!
echo "run-fleet: router pid $router_pid on http://$ROUTER_HOST:$ROUTER_PORT (log $LOG_DIR/router.log)"
echo "run-fleet: try: curl -s http://$ROUTER_HOST:$ROUTER_PORT/v1/chat/completions -H 'content-type: application/json' \\"
echo "             -d '{\"model\": \"$SERVED_NAME\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 32}'"

# Run until the router exits or we are told to stop (the trap then drains the replicas).
wait "$router_pid" || true
router_pid=""
