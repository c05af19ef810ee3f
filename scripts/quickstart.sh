#!/usr/bin/env bash
# scripts/quickstart.sh — the main job on the embedded default (SQLite under ./dlock-data).
#
# Builds dlock and starts three services on loopback: the lock-server (8081, lockdb), the
# hostile rail-stub (8084) and the rail-proxy (8083, paydb). It puts three CLAIMED payouts
# A, B, C on account acct-1 into paydb, and walks through the fence with curl:
#   1. worker-1 takes the lock payout:acct-1 (token T1) and pays A          -> 200 ACKED
#   2. worker-1 stalls; an operator revokes its lock (the floor rises)
#   3. worker-2 takes the lock (token T2 > floor) and pays B                -> 200 ACKED
#   4. worker-1 wakes and pays C with its dead token T1                     -> 409 FENCED_OUT
#   5. worker-2 re-takes the lock (T3) and tries A again                    -> 409 DUPLICATE_SUBMISSION
#   6. kill -9 the proxy, start it again; worker-1 tries C again with T1    -> 409 FENCED_OUT
#   7. the rail's own call log: exactly one call for A and one for B, nothing for C.
# It exits non-zero if any answer differs. `--keep` leaves the services running afterwards
# (Ctrl-C stops them).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

KEEP=0
[ "${1:-}" = "--keep" ] && KEEP=1
command -v cargo >/dev/null || { echo "quickstart: cargo not found (install Rust with rustup)" >&2; exit 1; }
# Debian packages the build and the walk-through need: protoc (etcd-client's build script
# compiles etcd's .proto files) and curl.
missing=()
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v curl >/dev/null 2>&1 || missing+=(curl)
if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing ${missing[*]} from Debian packages"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    command -v apt-get >/dev/null 2>&1 || { echo "quickstart: need ${missing[*]} and apt-get is not available" >&2; exit 1; }
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

echo "==> building dlock (release)"
cargo build --release --locked -p dlock
DLOCK="$ROOT/target/release/dlock"

DATA="$ROOT/dlock-data/quickstart"
rm -rf "$DATA"
mkdir -p "$DATA"
DB="sqlite://$DATA/paydb.sqlite"
LOCKDB="sqlite://$DATA/lockdb.sqlite"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

start_proxy() {
    "$DLOCK" rail-proxy --database-url "$DB" --listen 127.0.0.1:8083 --rail-url http://127.0.0.1:8084 \
        >>"$DATA/proxy.log" 2>&1 &
    PROXY_PID=$!
    PIDS+=("$PROXY_PID")
}

wait_ready() { # url
    local deadline=$((SECONDS + 30))
    until curl -fsS "$1" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || { echo "quickstart: $1 not ready after 30 s; see $DATA/*.log" >&2; exit 1; }
        sleep 0.1
    done
}

echo "==> starting lock-server :8081 (lockdb $LOCKDB), rail-stub :8084, rail-proxy :8083 (paydb $DB)"
"$DLOCK" migrate --database-url "$DB"
"$DLOCK" lock-server --database-url "$LOCKDB" --listen 127.0.0.1:8081 >>"$DATA/lock-server.log" 2>&1 &
PIDS+=("$!")
"$DLOCK" rail-stub --listen 127.0.0.1:8084 --seed 1 >>"$DATA/stub.log" 2>&1 &
PIDS+=("$!")
start_proxy
wait_ready http://127.0.0.1:8081/health/ready
wait_ready http://127.0.0.1:8083/health/ready

A=$("$DLOCK" dev seed-payout --database-url "$DB" --account acct-1 --amount-minor 1250 --currency EUR)
B=$("$DLOCK" dev seed-payout --database-url "$DB" --account acct-1 --amount-minor 990 --currency EUR)
C=$("$DLOCK" dev seed-payout --database-url "$DB" --account acct-1 --amount-minor 4200 --currency EUR)
echo "==> payouts A=$A, B=$B, C=$C, all CLAIMED on account acct-1"

FAILED=0
field() { # json name -> the value of a top-level string or number field
    sed -nE "s/.*\"$2\":\"?([^\",}]*)\"?.*/\1/p" <<<"$1"
}
lock_call() { # method path owner [token] [body] -> prints the body, then the status on the last line
    local method=$1 path=$2 owner=$3 token=${4:-} body=${5:-}
    local args=(-sS -X "$method" -w '\n%{http_code}' "http://127.0.0.1:8081$path" -H "X-Owner-Id: $owner")
    [ -n "$token" ] && args+=(-H "X-Fencing-Token: $token")
    [ -n "$body" ] && args+=(-H 'Content-Type: application/json' -d "$body")
    curl "${args[@]}"
}
open_session() { # owner -> session id
    local out
    out=$(lock_call POST /v1/sessions "$1" "" '{"ttlMillis":30000}')
    field "${out%$'\n'*}" sessionId
}
acquire() { # owner session -> token
    local out
    out=$(lock_call POST /v1/locks/payout:acct-1/acquire "$1" "" "{\"sessionId\":\"$2\",\"ttlMillis\":30000,\"waitMillis\":5000}")
    echo "    acquire by $1: ${out%$'\n'*}" >&2
    field "${out%$'\n'*}" fencingToken
}
submit() { # label payout amount token owner expected-status expected-code
    local label=$1 payout=$2 amount=$3 token=$4 owner=$5 want_status=$6 want_code=$7 out status
    echo
    echo "--- $label"
    echo "curl -X POST localhost:8083/v1/rail/submissions -H 'X-Fencing-Token: $token' -H 'X-Owner-Id: $owner' -H 'X-Idempotency-Key: payout:$payout' ..."
    out=$(curl -sS -w '\n%{http_code}' http://127.0.0.1:8083/v1/rail/submissions \
        -H 'Content-Type: application/json' -H "X-Fencing-Token: $token" -H "X-Owner-Id: $owner" \
        -H "X-Idempotency-Key: payout:$payout" \
        -d "{\"payoutId\":\"$payout\",\"accountId\":\"acct-1\",\"amountMinor\":$amount,\"currency\":\"EUR\",\"beneficiaryRef\":\"ben-1\"}")
    status=${out##*$'\n'}
    echo "${out%$'\n'*}"
    if [ "$status" = "$want_status" ] && grep -q "\"$want_code\"" <<<"$out"; then
        echo "=> $status $want_code, as it must be"
    else
        echo "=> UNEXPECTED: got $status, wanted $want_status $want_code" >&2
        FAILED=1
    fi
}

echo
echo "--- 1. worker-1 opens a session and takes the lock payout:acct-1"
S1=$(open_session worker-1)
T1=$(acquire worker-1 "$S1")
submit "1. worker-1 pays A with token $T1" "$A" 1250 "$T1" worker-1 200 ACKED

echo
echo "--- 2. worker-1 stalls (a GC pause); an operator revokes its lock"
out=$(lock_call POST /v1/locks/payout:acct-1/revoke operator "" "{\"operator\":\"alice\",\"reason\":\"worker-1 stalled mid-payout\",\"expectedToken\":$T1}")
echo "${out%$'\n'*}"
FLOOR=$(field "${out%$'\n'*}" newTokenFloor)
[ -n "$FLOOR" ] || { echo "=> UNEXPECTED revoke answer" >&2; FAILED=1; }

echo
echo "--- 3. worker-2 takes the lock: its token exceeds the floor $FLOOR"
S2=$(open_session worker-2)
T2=$(acquire worker-2 "$S2")
submit "3. worker-2 pays B with token $T2" "$B" 990 "$T2" worker-2 200 ACKED
submit "4. worker-1 wakes and pays C with its dead token $T1: fenced before the rail" "$C" 4200 "$T1" worker-1 409 FENCED_OUT

lock_call DELETE "/v1/locks/payout:acct-1?sessionId=$S2" worker-2 "$T2" >/dev/null
T3=$(acquire worker-2 "$S2")
submit "5. worker-2 re-takes the lock (token $T3) and tries A again: never twice, whatever the token" "$A" 1250 "$T3" worker-2 409 DUPLICATE_SUBMISSION

echo
echo "--- 6. kill -9 the proxy and start it again: the mark is in paydb, not in the process"
kill -9 "$PROXY_PID"
wait "$PROXY_PID" 2>/dev/null || true
start_proxy
wait_ready http://127.0.0.1:8083/health/ready
submit "6. worker-1 tries C again with token $T1 after the restart" "$C" 4200 "$T1" worker-1 409 FENCED_OUT

echo
echo "--- 7. the rail's own record (GET localhost:8084/calls)"
CALLS=$(curl -sS http://127.0.0.1:8084/calls)
echo "$CALLS"
if [ "$(grep -o '"clientRef"' <<<"$CALLS" | wc -l)" -eq 2 ] && grep -q "$A" <<<"$CALLS" && grep -q "$B" <<<"$CALLS" \
    && ! grep -q "$C" <<<"$CALLS"; then
    echo "=> one call for A, one for B, none for C: nothing stale and nothing twice reached the rail"
else
    echo "=> UNEXPECTED rail calls" >&2
    FAILED=1
fi

echo
echo "--- metrics (GET localhost:8083/metrics and localhost:8081/metrics)"
curl -sS http://127.0.0.1:8083/metrics | grep -v '^#'
curl -sS http://127.0.0.1:8081/metrics | grep -v '^#'

if [ "$FAILED" -ne 0 ]; then
    echo "quickstart: FAILED; logs in $DATA" >&2
    exit 1
fi
echo
echo "quickstart: every answer as the contract requires. Data: $DATA"
if [ "$KEEP" -eq 1 ]; then
    echo "services keep running (--keep); Ctrl-C to stop"
    wait
fi
