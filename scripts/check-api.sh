#!/usr/bin/env bash
# scripts/check-api.sh DLOCK_BINARY ST_BINARY — the "API conformance" stage of scripts/test.sh
# (C3-extensions E-16, DL-156..DL-158).
#
# Starts every service from DLOCK_BINARY on 127.0.0.1 (SQLite, authentication on with a
# throwaway credentials file, grants signed), checks that each one serves exactly its
# committed document at GET /v1/openapi.json (docs/api/<service>.json), then runs
# schemathesis (ST_BINARY, pinned in deploy/api-check-requirements.txt) against it with
# that document and a bearer credential. The checks: no 5xx (not_a_server_error), no status
# the document does not list for the operation (status_code_conformance), no content type
# it does not list (content_type_conformance), every body valid against the document's
# schema (response_schema_conformance: an error must be the envelope, with a code the
# document lists for that status). Before schemathesis, scripts/check-api-flow.py walks the
# success paths a random request cannot reach (a signed grant, claim, submit, post) and
# holds each answer to the same documents. Services, temp dir and data are removed on exit.
#
# Knobs: DLOCK_API_CHECK_EXAMPLES (test cases per operation, default 30),
#        DLOCK_API_CHECK_SEED (schemathesis seed, default 1),
#        DLOCK_API_CHECK_PHASES (schemathesis phases, default examples,coverage,fuzzing,stateful),
#        DLOCK_API_CHECK_RUN_SECONDS (time budget of one schemathesis run, default 20).
set -euo pipefail

DLOCK=${1:?usage: check-api.sh DLOCK_BINARY ST_BINARY}
ST=${2:?usage: check-api.sh DLOCK_BINARY ST_BINARY}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# Absolute: schemathesis runs from the temp dir.
abs() { printf '%s/%s' "$(cd "$(dirname "$1")" && pwd)" "$(basename "$1")"; }
DLOCK="$(abs "$DLOCK")"
ST="$(abs "$ST")"
EXAMPLES=${DLOCK_API_CHECK_EXAMPLES:-30}
SEED=${DLOCK_API_CHECK_SEED:-1}
PHASES=${DLOCK_API_CHECK_PHASES:-examples,coverage,fuzzing,stateful}
# Longest wait for a service's listening line.
START_SECONDS_MAX=30
# Time budget of one schemathesis run (the stage runs six: five services, two roles on the
# payment-resource).
RUN_SECONDS_MAX=${DLOCK_API_CHECK_RUN_SECONDS:-20}

mkdir -p "$ROOT/target"
WORK="$(mktemp -d "$ROOT/target/api-check.XXXXXX")"
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

WORKER="api-check-worker-token-000000000001"
OPERATOR="api-check-operator-token-0000000001"
READER="api-check-reader-token-00000000001"
printf 'worker %s\noperator %s\nreader %s\n' "$WORKER" "$OPERATOR" "$READER" >"$WORK/credentials"
chmod 600 "$WORK/credentials"
# A throwaway Ed25519 grant key (C3-extensions E-14): the seed (the last 32 bytes of the
# PKCS#8 DER) signs on the lock server, the public key (the last 32 bytes of the SPKI DER)
# verifies on the payment-resource and the proxy.
openssl genpkey -algorithm ed25519 -outform DER -out "$WORK/grant.der" 2>/dev/null
tail -c 32 "$WORK/grant.der" | base64 >"$WORK/grant.key"
GRANT_PUBLIC="$(openssl pkey -inform DER -in "$WORK/grant.der" -pubout -outform DER | tail -c 32 | base64)"
export DLOCK_AUTH_CREDENTIALS_FILE="$WORK/credentials"
export DLOCK_LOCK_GRANTS_SIGNING_KEY_FILE="$WORK/grant.key"
export DLOCK_PAYMENT_GRANTS_VERIFY_KEYS="$GRANT_PUBLIC"
export DLOCK_RAIL_PROXY_GRANTS_VERIFY_KEYS="$GRANT_PUBLIC"
export DLOCK_LOG=warn

# start NAME ARGS...: runs `dlock ARGS --listen 127.0.0.1:0`, waits for its listening line
# and sets ADDR to host:port.
start() {
    local name=$1 t0=$SECONDS
    shift
    # Created here, not by the child's redirection: the loop below may read before the
    # backgrounded child has opened them (a loaded machine), and a missing file is an error.
    : >"$WORK/$name.out"
    : >"$WORK/$name.err"
    "$DLOCK" "$@" --listen 127.0.0.1:0 >>"$WORK/$name.out" 2>>"$WORK/$name.err" &
    PIDS+=($!)
    ADDR=""
    while [ -z "$ADDR" ]; do
        ADDR="$(sed -n 's/.* listening on \(.*\)$/\1/p' "$WORK/$name.out" | head -n1 | tr -d '[:space:]')"
        if [ -z "$ADDR" ]; then
            if [ $((SECONDS - t0)) -ge "$START_SECONDS_MAX" ]; then
                cat "$WORK/$name.err" >&2
                echo "check-api: $name did not start within ${START_SECONDS_MAX}s" >&2
                exit 1
            fi
            sleep 0.2
        fi
    done
    echo "check-api: $name on $ADDR"
}

# served NAME ADDR: the served document equals docs/api/NAME.json.
served() {
    local name=$1 addr=$2
    curl -fsS -H "Authorization: Bearer $READER" "http://$addr/v1/openapi.json" -o "$WORK/$name.served.json"
    python3 - "$WORK/$name.served.json" "$ROOT/docs/api/$name.json" <<'PY'
import json, sys
served, committed = (json.load(open(p)) for p in sys.argv[1:])
if served != committed:
    sys.exit(f"check-api: the served document differs from {sys.argv[2]}; regenerate docs/api/")
PY
}

# fuzz NAME ADDR TOKEN: schemathesis against the service with its own document.
fuzz() {
    local name=$1 addr=$2 token=$3
    echo "check-api: schemathesis on $name ($EXAMPLES examples per operation, seed $SEED)"
    # From the temp dir: schemathesis keeps its example database in the working directory.
    (cd "$WORK" && "$ST" run "$ROOT/docs/api/$name.json" --url "http://$addr" \
        --header "Authorization: Bearer $token" \
        --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
        --phases "$PHASES" \
        --max-examples "$EXAMPLES" --seed "$SEED" --max-time "$RUN_SECONDS_MAX" \
        --workers 1 --no-color --warnings off)
}

LOCK_DB="sqlite://$WORK/lock.db"
PAY_DB="sqlite://$WORK/pay.db"

start rail-stub rail-stub --seed 1 --failure-rate 0 --decline-rate 0
STUB=$ADDR
start lock-server lock-server --database-url "$LOCK_DB" --delay-ms 0
LOCK=$ADDR
start payment-resource payment-resource --database-url "$PAY_DB"
PAY=$ADDR
start rail-proxy rail-proxy --database-url "$PAY_DB" --rail-url "http://$STUB"
PROXY=$ADDR
# The success paths random requests cannot reach (a signed grant, a claimed payout), each
# answer held to its document; before the executor starts, so no worker races the walk.
"$(dirname "$ST")/python" "$ROOT/scripts/check-api-flow.py" "$ROOT/docs/api" "$LOCK" "$PAY" "$PROXY" "$STUB" \
    "$WORKER" "$OPERATOR" "$READER"

DLOCK_EXECUTOR_AUTH_TOKEN="$WORKER" start executor executor --lock-url "http://$LOCK" \
    --payment-url "http://$PAY" --proxy-url "http://$PROXY" --owner-id api-check-executor
EXEC=$ADDR

for s in "rail-stub $STUB" "lock-server $LOCK" "payment-resource $PAY" "rail-proxy $PROXY" "executor $EXEC"; do
    set -- $s
    served "$1" "$2"
done

fuzz rail-stub "$STUB" "$READER"
fuzz lock-server "$LOCK" "$WORKER"
fuzz payment-resource "$PAY" "$OPERATOR"
fuzz payment-resource "$PAY" "$WORKER"
fuzz rail-proxy "$PROXY" "$WORKER"
fuzz executor "$EXEC" "$READER"
echo "check-api: every service answered within its document"
