#!/usr/bin/env bash
# Instructions per request, with callgrind (see benches/README.md,
# "instructions per request"): the release binary, `limits.workers: 1`, one
# wrk connection. Instrumentation is switched on after the warm-up and off
# after the measured run; the figure is the process's total `Ir` in that
# window divided by the requests wrk completed in it.
#
# Two measures (`MEASURE`):
#   proxy   the transparent path (no route): `GET /small` from an nginx
#           origin configured as in `benches/proxy/servers.rs`;
#   polls   a waiting visitor's status poll, as `benches/polls.rs` sets it
#           up: a route of capacity 1 over `/small/gated` held by one
#           confirmed pass, and `GET /__queuegate/status?route=bench` with
#           the cookie of the visitor waiting behind it. `TICKET` says which
#           ticket it sends: `joined` (the one it was given on arrival, as
#           the polls bench sends it) or `polled` (the one its first poll
#           gave back, as a browser sends it).
#
# Usage: benches/proxy/callgrind.sh   (after `cargo build --release`)
#        MEASURE=polls benches/proxy/callgrind.sh
#
# Environment:
#   MEASURE          proxy or polls (proxy)
#   TICKET           for polls: joined or polled (joined)
#   QUEUEGATE        the binary (target/release/queuegate)
#   NGINX            nginx (/usr/sbin/nginx)
#   WARMUP           seconds of warm-up before instrumenting (3)
#   DURATION         seconds measured (15)
#   CONNECTIONS      wrk connections (1)
#   KEEP             a path: the callgrind output is copied there, for
#                    `callgrind_annotate --inclusive=yes KEEP`
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
binary=${QUEUEGATE:-$here/../../target/release/queuegate}
nginx=${NGINX:-/usr/sbin/nginx}
warmup=${WARMUP:-3}
duration=${DURATION:-15}
connections=${CONNECTIONS:-1}
measure=${MEASURE:-proxy}
ticket=${TICKET:-joined}
[[ $measure == proxy || $measure == polls ]] || { echo "MEASURE is proxy or polls" >&2; exit 1; }
[[ $ticket == joined || $ticket == polled ]] || { echo "TICKET is joined or polled" >&2; exit 1; }
small_body="queuegate benchmark small response: one hundred bytes of plain text, returned by the origin server!"

for tool in valgrind callgrind_control callgrind_annotate wrk curl "$nginx"; do
    command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done
[[ -x $binary ]] || { echo "no binary at $binary: cargo build --release" >&2; exit 1; }

dir=$(mktemp -d -t queuegate-callgrind-XXXXXX)
# nginx's unprivileged workers must traverse it.
chmod 755 "$dir"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$dir"
}
trap cleanup EXIT

# A port nothing listens on (another process could take it before use; the
# readiness wait then fails with the log).
free_port() {
    local port
    for port in $(shuf -i 20000-60000 -n 100); do
        if [[ -z $(ss -Hltn "sport = :$port") ]]; then
            echo "$port"
            return
        fi
    done
    echo "no free port" >&2
    exit 1
}

# Waits until `url` answers 200, or fails with `log`.
wait_ready() {
    local url=$1 log=$2
    for _ in $(seq 1 600); do
        if [[ $(curl -s -o /dev/null -w '%{http_code}' "$url" || true) == 200 ]]; then
            return
        fi
        sleep 0.1
    done
    echo "not ready: $url" >&2
    cat "$log" >&2 || true
    exit 1
}

origin_port=$(free_port)
mkdir -p "$dir/origin/logs"
chmod 755 "$dir/origin"
cat >"$dir/origin/origin.conf" <<EOF
daemon off;
master_process on;
worker_processes 1;
pid $dir/origin/origin.pid;
error_log $dir/origin/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 100000;
    keepalive_timeout 75s;
    server {
        listen 127.0.0.1:$origin_port backlog=4096;
        default_type text/plain;
        location /small { return 200 "$small_body"; }
    }
}
EOF
"$nginx" -c "$dir/origin/origin.conf" -p "$dir/origin" </dev/null >/dev/null 2>"$dir/origin/logs/stderr.log" &
pids+=($!)
wait_ready "http://127.0.0.1:$origin_port/small" "$dir/origin/logs/stderr.log"

port=$(free_port)
admin_port=$(free_port)
routes=
if [[ $measure == polls ]]; then
    routes="routes:
  - name: bench
    match: { path_prefix: /small/gated }
    capacity: 1
    pass_ttl: 1h
    session_ttl: 2h"
fi
cat >"$dir/queuegate.yaml" <<EOF
listen:
  - addr: 127.0.0.1:$port
admin:
  addr: 127.0.0.1:$admin_port
limits:
  drain_timeout: 1s
  workers: 1
upstream:
  url: http://127.0.0.1:$origin_port
  pool: { max_idle_per_host: 512 }
store:
  backend: memory
keys:
  - { id: bench, env: QUEUEGATE_KEY_BENCH }
$routes
EOF
key=$("$binary" keygen)
QUEUEGATE_KEY_BENCH=$key RUST_LOG=warn valgrind --tool=callgrind --instr-atstart=no \
    --callgrind-out-file="$dir/callgrind.out" \
    "$binary" run -c "$dir/queuegate.yaml" </dev/null >"$dir/queuegate.log" 2>&1 &
queuegate=$!
pids=("$queuegate" "${pids[@]}")
base="http://127.0.0.1:$port"
wait_ready "$base/small" "$dir/queuegate.log"
body=$(curl -s "$base/small")
[[ $body == "$small_body" ]] || { echo "unexpected body: $body" >&2; exit 1; }

# The value of the route's cookie an answer sets (from `curl -i` output).
set_cookie() {
    tr -d '\r' | sed -n 's/^set-cookie: qg_bench=\([^;]*\).*/\1/Ip' | head -n 1
}

wrk_args=()
url="$base/small"
if [[ $measure == polls ]]; then
    pass=$(curl -s -i "$base/small/gated" | set_cookie)
    [[ -n $pass ]] || { echo "no pass for the first visitor" >&2; exit 1; }
    code=$(curl -s -o /dev/null -w '%{http_code}' -H "Cookie: qg_bench=$pass" "$base/small/gated")
    [[ $code == 200 ]] || { echo "the holder's return got $code" >&2; exit 1; }
    cookie=$(curl -s -i "$base/small/gated" | set_cookie)
    [[ -n $cookie ]] || { echo "no ticket for the second visitor" >&2; exit 1; }
    url="$base/__queuegate/status?route=bench"
    if [[ $ticket == polled ]]; then
        cookie=$(curl -s -i -H "Cookie: qg_bench=$cookie" "$url" | set_cookie)
        [[ -n $cookie ]] || { echo "the first poll wrote no ticket" >&2; exit 1; }
    fi
    answer=$(curl -s -H "Cookie: qg_bench=$cookie" "$url")
    [[ $answer == *'"state":"waiting"'* ]] || { echo "unexpected poll answer: $answer" >&2; exit 1; }
    echo "status answer: $answer"
    wrk_args=(-H "Cookie: qg_bench=$cookie")
fi

wrk -t1 -c"$connections" -d"${warmup}s" "${wrk_args[@]}" "$url" >/dev/null
callgrind_control -i on "$queuegate" >/dev/null 2>&1
wrk -t1 -c"$connections" -d"${duration}s" "${wrk_args[@]}" "$url" >"$dir/wrk.txt"
callgrind_control -i off "$queuegate" >/dev/null 2>&1
if grep -q -e 'Non-2xx' -e 'Socket errors' "$dir/wrk.txt"; then
    cat "$dir/wrk.txt" >&2
    exit 1
fi
requests=$(awk '/requests in/ { print $1 }' "$dir/wrk.txt")

# The output is written when the process exits.
kill -TERM "$queuegate"
wait "$queuegate" || true
pids=("${pids[@]:1}")
instructions=$(callgrind_annotate "$dir/callgrind.out" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
if [[ -n ${KEEP:-} ]]; then
    cp "$dir/callgrind.out" "$KEEP"
fi
echo "requests: $requests"
echo "instructions: $instructions"
echo "instructions per request: $((instructions / requests))"
