#!/usr/bin/env bash
# scripts/quickstart.sh — the main job on the embedded default (SQLite under ./dlock-data).
#
# Builds dlock, starts the hostile rail-stub and the rail-proxy on loopback (8084, 8083),
# puts two CLAIMED payouts into paydb, and walks through the fence with curl:
#   1. token 42 for payout A          -> 200 ACKED          (the rail pays once)
#   2. token 41 for payout B          -> 409 FENCED_OUT     (stale holder; the rail never hears of it)
#   3. token 43 for payout A again    -> 409 DUPLICATE_SUBMISSION (never twice, whatever the token)
#   4. the proxy is killed and restarted, token 41 again -> still 409 FENCED_OUT
#                                        (the mark lives in paydb, not in the process)
#   5. the rail's own call log: exactly one call, for payout A.
# It exits non-zero if any answer differs. `--keep` leaves both services running
# afterwards (Ctrl-C stops them).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

KEEP=0
[ "${1:-}" = "--keep" ] && KEEP=1
command -v cargo >/dev/null || { echo "quickstart: cargo not found (install Rust with rustup)" >&2; exit 1; }
command -v curl >/dev/null || { echo "quickstart: curl not found (apt-get install curl)" >&2; exit 1; }

echo "==> building dlock (release)"
cargo build --release --locked -p dlock
DLOCK="$ROOT/target/release/dlock"

DATA="$ROOT/dlock-data/quickstart"
rm -rf "$DATA"
mkdir -p "$DATA"
DB="sqlite://$DATA/paydb.sqlite"
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

echo "==> starting rail-stub on 127.0.0.1:8084 and rail-proxy on 127.0.0.1:8083 (paydb: $DB)"
"$DLOCK" migrate --database-url "$DB"
"$DLOCK" rail-stub --listen 127.0.0.1:8084 --seed 1 >>"$DATA/stub.log" 2>&1 &
PIDS+=("$!")
start_proxy
wait_ready http://127.0.0.1:8083/health/ready

A=$("$DLOCK" dev seed-payout --database-url "$DB" --account acct-1 --amount-minor 1250 --currency EUR)
B=$("$DLOCK" dev seed-payout --database-url "$DB" --account acct-1 --amount-minor 990 --currency EUR)
echo "==> payouts A=$A (12.50 EUR) and B=$B (9.90 EUR), both CLAIMED on account acct-1"

FAILED=0
submit() { # label payout amount token expected-status expected-code
    local label=$1 payout=$2 amount=$3 token=$4 want_status=$5 want_code=$6 out status
    echo
    echo "--- $label"
    echo "curl -X POST localhost:8083/v1/rail/submissions -H 'X-Fencing-Token: $token' -H 'X-Owner-Id: worker-1' -H 'X-Idempotency-Key: payout:$payout' ..."
    out=$(curl -sS -w '\n%{http_code}' http://127.0.0.1:8083/v1/rail/submissions \
        -H 'Content-Type: application/json' -H "X-Fencing-Token: $token" -H 'X-Owner-Id: worker-1' \
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

submit "1. token 42 for payout A: strictly above the (empty) mark, forwarded once" "$A" 1250 42 200 ACKED
submit "2. token 41 for payout B: a stale holder, fenced before the rail" "$B" 990 41 409 FENCED_OUT
submit "3. token 43 for payout A again: already submitted, whatever the token" "$A" 1250 43 409 DUPLICATE_SUBMISSION

echo
echo "--- 4. kill -9 the proxy and start it again: the mark is in paydb"
kill -9 "$PROXY_PID"
wait "$PROXY_PID" 2>/dev/null || true
start_proxy
wait_ready http://127.0.0.1:8083/health/ready
submit "4. token 41 for payout B after the restart" "$B" 990 41 409 FENCED_OUT

echo
echo "--- 5. the rail's own record (GET localhost:8084/calls)"
CALLS=$(curl -sS http://127.0.0.1:8084/calls)
echo "$CALLS"
if [ "$(grep -o '"clientRef"' <<<"$CALLS" | wc -l)" -eq 1 ] && grep -q "$A" <<<"$CALLS"; then
    echo "=> one call, for payout A: nothing stale and nothing twice reached the rail"
else
    echo "=> UNEXPECTED rail calls" >&2
    FAILED=1
fi

echo
echo "--- metrics (GET localhost:8083/metrics)"
curl -sS http://127.0.0.1:8083/metrics | grep -v '^#'

if [ "$FAILED" -ne 0 ]; then
    echo "quickstart: FAILED; logs in $DATA" >&2
    exit 1
fi
echo
echo "quickstart: every answer as the contract requires. paydb: $DATA/paydb.sqlite"
if [ "$KEEP" -eq 1 ]; then
    echo "services keep running (--keep); Ctrl-C to stop"
    wait
fi
