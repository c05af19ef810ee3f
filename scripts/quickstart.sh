#!/usr/bin/env bash
# scripts/quickstart.sh — the main job on the embedded default (SQLite under ./dlock-data).
#
# Builds dlock and starts four services on loopback: the lock-server (8081, lockdb), the
# payment-resource (8082, paydb), the rail-proxy (8083, the same paydb) and the hostile
# rail-stub (8084). It opens account acct-1 with 10 000 and creates three PENDING payouts
# A, B, C through the payment-resource, then walks the executor's protocol with curl:
#   1. worker-1 takes payout:acct-1 (T1), claims A, pays it at the rail       -> CLAIMED, ACKED
#      then takes a newer grant (T2) and posts A to the ledger                -> POSTED
#   2. worker-1 takes T3 and claims B, then stalls; an operator revokes its lock
#   3. worker-2 takes T4 > floor, re-claims B, pays it, posts it with T5      -> CLAIMED, ACKED, POSTED
#   4. worker-1 wakes and goes on with T3: the rail and the ledger refuse it  -> 409 FENCED_OUT (twice)
#   5. worker-2 (T6) tries to pay A again: never twice, whatever the token    -> 409 DUPLICATE_SUBMISSION
#   6. kill -9 the proxy and the payment-resource, start them again; worker-1
#      tries C with T3 at the resource and at the rail                        -> 409 FENCED_OUT (twice)
#   7. the rail's own call log: one call for A, one for B, none for C; the account's
#      balance equals its ledger sum.
# Every service authenticates its callers (C3-extensions E-13): the script writes a
# credentials file (mode 0600, one worker, one operator, one reader token) under its data
# dir and presents, on each call, the token of the role the endpoint needs.
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
"$ROOT/scripts/ensure-packages.sh" protoc:protobuf-compiler curl:curl openssl:openssl

echo "==> building dlock (release)"
cargo build --release --locked -p dlock
DLOCK="$ROOT/target/release/dlock"

DATA="$ROOT/dlock-data/quickstart"
rm -rf "$DATA"
mkdir -p "$DATA"
token() { od -An -tx1 -N32 /dev/urandom | tr -d ' \n'; }
WORKER=$(token)
OPERATOR=$(token)
READER=$(token)
(
    umask 077
    printf '# quickstart credentials (C3-extensions E-13)\nworker %s\noperator %s\nreader %s\n' \
        "$WORKER" "$OPERATOR" "$READER" >"$DATA/credentials"
)
export DLOCK_AUTH_CREDENTIALS_FILE="$DATA/credentials"
echo "==> credentials in $DATA/credentials (worker, operator, reader)"
DB="sqlite://$DATA/paydb.sqlite"
LOCKDB="sqlite://$DATA/lockdb.sqlite"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# The lock server signs every grant with an Ed25519 key; the resources trust its public key
# (C3-extensions E-14). openssl makes the pair: the 32-byte seed and public key are the last
# 32 bytes of the DER encodings.
openssl genpkey -algorithm ed25519 -out "$DATA/grant.pem" 2>/dev/null
(umask 077 && openssl pkey -in "$DATA/grant.pem" -outform DER | tail -c 32 | base64 >"$DATA/grant-signing.key")
GRANT_PUBLIC_KEY=$(openssl pkey -in "$DATA/grant.pem" -pubout -outform DER | tail -c 32 | base64)
export DLOCK_LOCK_GRANTS_SIGNING_KEY_FILE="$DATA/grant-signing.key"
export DLOCK_PAYMENT_GRANTS_VERIFY_KEYS="$GRANT_PUBLIC_KEY"
export DLOCK_RAIL_PROXY_GRANTS_VERIFY_KEYS="$GRANT_PUBLIC_KEY"

start_proxy() {
    "$DLOCK" rail-proxy --database-url "$DB" --listen 127.0.0.1:8083 --rail-url http://127.0.0.1:8084 \
        >>"$DATA/proxy.log" 2>&1 &
    PROXY_PID=$!
    PIDS+=("$PROXY_PID")
}
start_payment() {
    "$DLOCK" payment-resource --database-url "$DB" --listen 127.0.0.1:8082 >>"$DATA/payment-resource.log" 2>&1 &
    PAYMENT_PID=$!
    PIDS+=("$PAYMENT_PID")
}

wait_ready() { # url
    local deadline=$((SECONDS + 30))
    until curl -fsS "$1" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || { echo "quickstart: $1 not ready after 30 s; see $DATA/*.log" >&2; exit 1; }
        sleep 0.1
    done
}

echo "==> starting lock-server :8081 (lockdb $LOCKDB), payment-resource :8082 and rail-proxy :8083 (paydb $DB), rail-stub :8084"
"$DLOCK" migrate --database-url "$DB"
"$DLOCK" lock-server --database-url "$LOCKDB" --listen 127.0.0.1:8081 >>"$DATA/lock-server.log" 2>&1 &
PIDS+=("$!")
"$DLOCK" rail-stub --listen 127.0.0.1:8084 --seed 1 >>"$DATA/stub.log" 2>&1 &
PIDS+=("$!")
start_payment
start_proxy
wait_ready http://127.0.0.1:8081/health/ready
wait_ready http://127.0.0.1:8082/health/ready
wait_ready http://127.0.0.1:8083/health/ready

FAILED=0
field() { # json name -> the value of a top-level string or number field
    sed -nE "s/.*\"$2\":\"?([^\",}]*)\"?.*/\1/p" <<<"$1"
}
lock_call() { # method path owner [token] [body] -> prints the body, then the status on the last line
    local method=$1 path=$2 owner=$3 token=${4:-} body=${5:-}
    local bearer=$WORKER
    case "$path" in */revoke) bearer=$OPERATOR ;; esac
    local args=(-sS -X "$method" -w '\n%{http_code}' "http://127.0.0.1:8081$path" -H "X-Owner-Id: $owner"
        -H "Authorization: Bearer $bearer")
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
    local token
    token=$(field "${out%$'\n'*}" fencingToken)
    # The grant's signature, sent next to its token on every fenced write (by sig_args).
    field "${out%$'\n'*}" fencingSignature >"$DATA/sig-$token"
    echo "$token"
}
sig_of() { # token -> the lock server's signature of that grant ("" if none)
    cat "$DATA/sig-$1" 2>/dev/null || true
}
submit() { # label payout amount token owner expected-status expected-code
    local label=$1 payout=$2 amount=$3 token=$4 owner=$5 want_status=$6 want_code=$7 out status
    echo
    echo "--- $label"
    echo "curl -X POST localhost:8083/v1/rail/submissions -H 'X-Fencing-Token: $token' -H 'X-Owner-Id: $owner' -H 'X-Idempotency-Key: payout:$payout' ..."
    out=$(curl -sS -w '\n%{http_code}' http://127.0.0.1:8083/v1/rail/submissions \
        -H 'Content-Type: application/json' -H "X-Fencing-Token: $token" -H "X-Owner-Id: $owner" \
        -H "X-Fencing-Signature: $(sig_of "$token")" \
        -H "Authorization: Bearer $WORKER" \
        -H "X-Idempotency-Key: payout:$payout" \
        -d "{\"payoutId\":\"$payout\",\"accountId\":\"acct-1\",\"amountMinor\":$amount,\"currency\":\"EUR\",\"beneficiaryRef\":\"ben-1\"}")
    status=${out##*$'\n'}
    LAST_BODY=${out%$'\n'*}
    echo "$LAST_BODY"
    if [ "$status" = "$want_status" ] && grep -q "\"$want_code\"" <<<"$out"; then
        echo "=> $status $want_code, as it must be"
    else
        echo "=> UNEXPECTED: got $status, wanted $want_status $want_code" >&2
        FAILED=1
    fi
}

pay_call() { # method path [owner key token body] -> prints the body, then the status on the last line
    local method=$1 path=$2 owner=${3:-} key=${4:-} token=${5:-} body=${6:-}
    local bearer=$READER
    case "$method $path" in
        "POST /v1/accounts" | "POST /v1/payouts") bearer=$OPERATOR ;;
        POST\ */claim | POST\ */post) bearer=$WORKER ;;
    esac
    local args=(-sS -X "$method" -w '\n%{http_code}' "http://127.0.0.1:8082$path" -H "Authorization: Bearer $bearer")
    [ -n "$owner" ] && args+=(-H "X-Owner-Id: $owner")
    [ -n "$key" ] && args+=(-H "X-Idempotency-Key: $key")
    [ -n "$token" ] && args+=(-H "X-Fencing-Token: $token" -H "X-Fencing-Signature: $(sig_of "$token")")
    [ -n "$body" ] && args+=(-H 'Content-Type: application/json' -d "$body")
    curl "${args[@]}"
}
expect() { # label out want-status want-code
    local status=${2##*$'\n'}
    echo "${2%$'\n'*}"
    if [ "$status" = "$3" ] && grep -q "\"$4\"" <<<"$2"; then
        echo "=> $status $4, as it must be"
    else
        echo "=> UNEXPECTED ($1): got $status, wanted $3 $4" >&2
        FAILED=1
    fi
}
new_payout() { # amount -> payout id
    local out
    out=$(pay_call POST /v1/payouts ops "create-$1" "" "{\"accountId\":\"acct-1\",\"amountMinor\":$1,\"currency\":\"EUR\",\"beneficiaryRef\":\"ben-1\"}")
    field "${out%$'\n'*}" payoutId
}
claim() { # label payout token owner expected-state want-status want-code
    echo
    echo "--- $1"
    echo "curl -X POST localhost:8082/v1/payouts/$2/claim -H 'X-Fencing-Token: $3' -H 'X-Owner-Id: $4' -H 'X-Idempotency-Key: payout:$2' -d '{\"expectedState\":\"$5\"}'"
    expect "$1" "$(pay_call POST "/v1/payouts/$2/claim" "$4" "payout:$2" "$3" "{\"expectedState\":\"$5\"}")" "$6" "$7"
}
post() { # label payout token owner submission reference want-status want-code
    echo
    echo "--- $1"
    echo "curl -X POST localhost:8082/v1/payouts/$2/post -H 'X-Fencing-Token: $3' -H 'X-Owner-Id: $4' -H 'X-Idempotency-Key: payout:$2' -d '{\"railReference\":\"$6\",\"submissionId\":\"$5\",\"railOutcome\":\"ACKED\"}'"
    expect "$1" "$(pay_call POST "/v1/payouts/$2/post" "$4" "payout:$2" "$3" "{\"railReference\":\"$6\",\"submissionId\":\"$5\",\"railOutcome\":\"ACKED\"}")" "$7" "$8"
}
release() { # owner session token
    lock_call DELETE "/v1/locks/payout:acct-1?sessionId=$2" "$1" "$3" >/dev/null
}

echo
echo "--- 0. open account acct-1 with 10 000 (a balanced opening entry) and create payouts A, B, C"
expect "open acct-1" "$(pay_call POST /v1/accounts ops open-acct-1 "" '{"accountId":"acct-1","currency":"EUR","openingBalanceMinor":10000}')" 201 acct-1
A=$(new_payout 1250)
B=$(new_payout 990)
C=$(new_payout 4200)
echo "==> payouts A=$A, B=$B, C=$C, all PENDING on account acct-1"

echo
echo "--- 1. worker-1 opens a session and takes the lock payout:acct-1"
S1=$(open_session worker-1)
T1=$(acquire worker-1 "$S1")
claim "1a. worker-1 claims A with token $T1" "$A" "$T1" worker-1 PENDING 200 CLAIMED
submit "1b. worker-1 pays A with token $T1" "$A" 1250 "$T1" worker-1 200 ACKED
ACK_A=$LAST_BODY
release worker-1 "$S1" "$T1"
T2=$(acquire worker-1 "$S1")
post "1c. worker-1 posts A with a newer grant $T2 (each grant passes each fence once)" "$A" "$T2" worker-1 \
    "$(field "$ACK_A" submissionId)" "$(field "$ACK_A" railReference)" 200 POSTED
release worker-1 "$S1" "$T2"

echo
echo "--- 2. worker-1 takes the lock again and claims B; then it stalls (a GC pause) and an operator revokes its lock"
T3=$(acquire worker-1 "$S1")
claim "2a. worker-1 claims B with token $T3" "$B" "$T3" worker-1 PENDING 200 CLAIMED
out=$(lock_call POST /v1/locks/payout:acct-1/revoke operator "" "{\"operator\":\"alice\",\"reason\":\"worker-1 stalled mid-payout\",\"expectedToken\":$T3}")
echo "${out%$'\n'*}"
FLOOR=$(field "${out%$'\n'*}" newTokenFloor)
[ -n "$FLOOR" ] || { echo "=> UNEXPECTED revoke answer" >&2; FAILED=1; }

echo
echo "--- 3. worker-2 takes the lock: its token exceeds the floor $FLOOR"
S2=$(open_session worker-2)
T4=$(acquire worker-2 "$S2")
claim "3a. worker-2 re-claims B (recovery) with token $T4" "$B" "$T4" worker-2 CLAIMED 200 CLAIMED
submit "3b. worker-2 pays B with token $T4" "$B" 990 "$T4" worker-2 200 ACKED
ACK_B=$LAST_BODY
release worker-2 "$S2" "$T4"
T5=$(acquire worker-2 "$S2")
post "3c. worker-2 posts B with token $T5" "$B" "$T5" worker-2 \
    "$(field "$ACK_B" submissionId)" "$(field "$ACK_B" railReference)" 200 POSTED

submit "4a. worker-1 wakes and pays B with its dead token $T3: fenced before the rail" "$B" 990 "$T3" worker-1 409 FENCED_OUT
post "4b. worker-1 tries to post B with $T3: fenced at the ledger" "$B" "$T3" worker-1 \
    "$(field "$ACK_B" submissionId)" "$(field "$ACK_B" railReference)" 409 FENCED_OUT

release worker-2 "$S2" "$T5"
T6=$(acquire worker-2 "$S2")
submit "5. worker-2 takes token $T6 and tries to pay A again: never twice, whatever the token" "$A" 1250 "$T6" worker-2 409 DUPLICATE_SUBMISSION

echo
echo "--- 6. kill -9 the proxy and the payment-resource, start them again: fences live in paydb, not in processes"
kill -9 "$PROXY_PID" "$PAYMENT_PID"
wait "$PROXY_PID" "$PAYMENT_PID" 2>/dev/null || true
start_payment
start_proxy
wait_ready http://127.0.0.1:8082/health/ready
wait_ready http://127.0.0.1:8083/health/ready
claim "6a. worker-1 claims C with token $T3 after the restart" "$C" "$T3" worker-1 PENDING 409 FENCED_OUT
submit "6b. worker-1 pays C with token $T3 after the restart" "$C" 4200 "$T3" worker-1 409 FENCED_OUT

echo
echo "--- account acct-1 (GET localhost:8082/v1/accounts/acct-1)"
ACCT=$(curl -sS -H "Authorization: Bearer $READER" http://127.0.0.1:8082/v1/accounts/acct-1)
echo "$ACCT"
if [ "$(field "$ACCT" balanceMinor)" = 7760 ] && [ "$(field "$ACCT" ledgerSumMinor)" = 7760 ]; then
    echo "=> balance 10 000 - 1 250 - 990 = 7 760, equal to the sum of its ledger entries"
else
    echo "=> UNEXPECTED account" >&2
    FAILED=1
fi

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
echo "--- metrics (GET /metrics on :8081, :8082 and :8083; the payment-resource's restarted at step 6)"
for port in 8081 8082 8083; do
    curl -sS -H "Authorization: Bearer $READER" "http://127.0.0.1:$port/metrics" | grep -v '^#'
done

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
