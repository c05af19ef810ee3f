#!/usr/bin/env bash
# deploy/local/up.sh — dlock as production runs it, on one machine, from Debian packages:
# the normal release binary (target/release/dlock), one process per service, each under
# a supervisor that restarts it on failure (as systemd's Restart=on-failure would):
#
#   etcd-1..3            a real 3-member etcd cluster (etcd-server), 127.0.0.1
#   postgres             a real PostgreSQL (postgresql), 127.0.0.1, databases paydb, lockdb
#   lock-server-1, -2    on the etcd cluster (one prefix, one signing key)
#   lock-server-pg       on PostgreSQL (database lockdb), a lock service of its own: no
#                        signing key, so no resource admits its grants; the real run's
#                        lock-set workload takes its locks there (docs/real-runs.md)
#   payment-resource     on paydb
#   rail-proxy-1, -2     on paydb, in front of the rail-stub
#   rail-stub            the hostile simulated rail (the record of what was paid)
#   executor-1..3        executor-1 -> lock-server-1 + rail-proxy-1,
#                        executor-2 -> lock-server-2 + rail-proxy-2,
#                        executor-3 -> lock-server-1 + rail-proxy-2
#   reconciler           `dlock reconcile` every --reconcile-interval seconds (log only)
#
# Everything lives under one temp dir (--dir, default a fresh mktemp dir): data, logs,
# pids, secrets (deploy/make-secrets.sh). On exit (Ctrl-C, SIGTERM, a failed start) every
# process is stopped and the dir removed, unless --keep.
#
# Usage: deploy/local/up.sh [--dir DIR] [--keep] [--netns] [--restart-sec S]
#                           [--reconcile-interval S] [--profile P] [--config FILE]
#                           [--trace-dir DIR] [--faketime-dir DIR]
#                           [--credentials-extra FILE]
#   --netns          executor-3 runs in its own network namespace, joined to the host by a
#                    veth pair; the dlock services then listen on the host end of that pair
#                    (host-local addresses, lock servers apart from the rest) so a route
#                    change inside the namespace can cut executor-3 off from the lock
#                    servers alone (the real run, docs/real-runs.md). Needs root.
#   --restart-sec S  supervisor's pause before restarting a failed process (default 3).
#   --profile P      DLOCK_PROFILE of every process (default production).
#   --config FILE    DLOCK_CONFIG of every process: any key not set below.
#   --trace-dir DIR  each dlock process appends its protocol events to DIR/<name>.jsonl
#                    (DLOCK_TRACE_FILE: the incident-trace schema on the host's monotonic
#                    clock; the real run merges them, docs/real-runs.md).
#   --faketime-dir DIR  each dlock process runs with Debian's libfaketimeMT preloaded,
#                    reading its wall-clock offset from DIR/<name> (re-read every second;
#                    "+0" at start; the monotonic clock is never faked): a wall-clock
#                    offset or step is a write to that file (real/src/mechanism.rs).
#   --credentials-extra FILE  lines appended to the generated credentials file before any
#                    service starts (`<role> <token> [owners=...]`, C3-extensions E-13): the
#                    real run's forger adds its two owner-bound worker credentials.
#   LOCAL_DLOCK_BIN  the binary to run (default target/release/dlock).
# Settings: every DLOCK_* variable in the environment reaches every process; the ones
# this script sets (wiring, secrets) are listed in $DIR/cluster.env. Chaos (the rail's
# failure rate, executor stalls) is off unless set, e.g.
#   DLOCK_RAIL_STUB_FAILURE_RATE=0.02 DLOCK_EXECUTOR_CHAOS_PAUSE_RATE=0.02 deploy/local/up.sh
#
# When everything is ready it writes $DIR/cluster.env (URLs, pid files, log paths; shell
# syntax, read by the real run) and cluster.json (the same, as JSON), prints it, and runs
# until Ctrl-C or SIGTERM.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

DIR=""
KEEP=0
NETNS=0
RESTART_SEC=3
RECONCILE_INTERVAL=30
PROFILE="${DLOCK_PROFILE:-production}"
CONFIG=""
TRACE_DIR=""
FAKETIME_DIR=""
CREDENTIALS_EXTRA=""
LIBFAKETIME_MT=/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1
while [ $# -gt 0 ]; do
    case "$1" in
        --dir) DIR=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --netns) NETNS=1; shift ;;
        --restart-sec) RESTART_SEC=$2; shift 2 ;;
        --reconcile-interval) RECONCILE_INTERVAL=$2; shift 2 ;;
        --profile) PROFILE=$2; shift 2 ;;
        --config) CONFIG=$(realpath "$2"); shift 2 ;;
        --trace-dir) TRACE_DIR=$2; shift 2 ;;
        --faketime-dir) FAKETIME_DIR=$2; shift 2 ;;
        --credentials-extra) CREDENTIALS_EXTRA=$(realpath "$2"); shift 2 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "up.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
done

SERVICE_TIMEOUT_S=60
say() { printf 'up.sh: %s\n' "$*"; }
die() { printf 'up.sh: error: %s\n' "$*" >&2; exit 1; }
is_root() { [ "$(id -u)" -eq 0 ]; }
stamp() { date -u +%H:%M:%S.%3N; }

# ------------------------------------------------------------------------------------
# Packages: what scripts/test.sh's ensure_packages installs. Named, never guessed.
# ------------------------------------------------------------------------------------
pg_bin_dir() {
    local d
    for d in /usr/lib/postgresql/*/bin; do
        if [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && [ -x "$d/pg_ctl" ]; then echo "$d"; fi
    done | sort -V | tail -n 1
}
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found: install the Debian package $2 (scripts/test.sh installs it: ensure_packages)"; }
need etcd etcd-server
need curl curl
need openssl openssl
need python3 python3
need psql postgresql
need pg_isready postgresql
[ -n "$(pg_bin_dir)" ] || die "no PostgreSQL server under /usr/lib/postgresql/*/bin: install the Debian package postgresql"
if [ "$NETNS" = 1 ]; then
    need ip iproute2
    is_root || die "--netns needs root (ip netns, veth)"
fi
if [ -n "$FAKETIME_DIR" ]; then
    [ -e "$LIBFAKETIME_MT" ] || die "$LIBFAKETIME_MT not found: install the Debian package libfaketime"
fi
DLOCK="${LOCAL_DLOCK_BIN:-$ROOT/target/release/dlock}"
[ -x "$DLOCK" ] || die "$DLOCK not found: cargo build --release --locked -p dlock"

# ------------------------------------------------------------------------------------
# Layout and cleanup.
# ------------------------------------------------------------------------------------
if [ -z "$DIR" ]; then
    # Under /tmp: the postgres OS user must reach its data dir.
    DIR="$(mktemp -d /tmp/dlock-local.XXXXXX)"
else
    mkdir -p "$DIR"
    DIR="$(realpath "$DIR")"
    [ -z "$(ls -A "$DIR")" ] || die "$DIR is not empty"
fi
chmod 755 "$DIR"
LOGS="$DIR/logs"
RUN="$DIR/run"
mkdir -p "$LOGS" "$RUN" "$DIR/data"
for d in TRACE_DIR FAKETIME_DIR; do
    if [ -n "${!d}" ]; then mkdir -p "${!d}"; printf -v "$d" '%s' "$(realpath "${!d}")"; fi
done

SUPERVISED=()   # names, in start order
SUP_PIDS=()     # their supervisor loops
PG_PID=""
PG_BIN=""
NS=""
VETH=""
cleanup() {
    local rc=$?
    set +e
    trap - INT TERM
    touch "$RUN/stopping"
    say "stopping (rc $rc)"
    # Reverse start order: executors, services, etcd. SIGCONT too: a stopped process
    # holds its SIGTERM until it runs again.
    local i name pid
    for ((i = ${#SUPERVISED[@]} - 1; i >= 0; i--)); do
        name=${SUPERVISED[$i]}
        pid=$(cat "$RUN/$name.pid" 2>/dev/null)
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            # PostgreSQL's fast shutdown is SIGINT (SIGTERM waits for every session).
            if [ "$name" = postgres ]; then kill -INT "$pid" 2>/dev/null; else kill -TERM "$pid" 2>/dev/null; fi
            kill -CONT "$pid" 2>/dev/null
            local deadline=$((SECONDS + 10))
            while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
            kill -KILL "$pid" 2>/dev/null
        fi
    done
    # A supervisor may be sleeping before a restart: end it (it starts nothing more, the
    # stop file is there; one stopped by a fault is continued first). Never a bare `wait`.
    for pid in "${SUP_PIDS[@]}" ${RECONCILER_PID:-}; do kill -CONT "$pid" 2>/dev/null; kill -TERM "$pid" 2>/dev/null; done
    for pid in "${SUP_PIDS[@]}" ${RECONCILER_PID:-}; do wait "$pid" 2>/dev/null; done
    # PostgreSQL (supervised, started first, so stopped last by the loop above).
    if [ -e "$DIR/pg/data/postmaster.pid" ]; then
        as_pg "$PG_BIN/pg_ctl" -D "$DIR/pg/data" stop -m fast -w -t 30 >/dev/null 2>&1
    fi
    if [ -n "$VETH" ]; then ip link del "$VETH" 2>/dev/null; fi
    if [ -n "$NS" ]; then ip netns del "$NS" 2>/dev/null; fi
    if [ "$KEEP" = 1 ]; then
        say "kept $DIR (--keep): logs in $LOGS"
    else
        rm -rf "$DIR"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------------------------
# Addresses and ports.
# ------------------------------------------------------------------------------------
HOST_IP=127.0.0.1   # payment-resource, rail-proxies, rail-stub
LOCK_IP=127.0.0.1   # lock servers
if [ "$NETNS" = 1 ]; then
    # A /24 of 10.213.0.0/16 that no interface uses yet.
    used=$(ip -4 -o addr show | awk '{print $4}')
    sub=""
    for n in $(seq $(($$ % 200 + 20)) 254) $(seq 20 254); do
        grep -q "^10\.213\.$n\." <<<"$used" || { sub=$n; break; }
    done
    [ -n "$sub" ] || die "no free 10.213.N.0/24 for the namespace"
    NS="dlock-$$"
    VETH="dlk$$h"
    HOST_IP="10.213.$sub.1"
    LOCK_IP="10.213.$sub.5"
    NS_IP="10.213.$sub.2"
    # The partition's next hop: an address nobody answers ARP for, so a cut drops
    # packets silently (a real partition: timeouts, not refusals).
    NS_VOID_IP="10.213.$sub.3"
    ip netns add "$NS"
    ip link add "$VETH" type veth peer name "dlk$$n"
    ip link set "dlk$$n" netns "$NS"
    ip addr add "$HOST_IP/24" dev "$VETH"
    ip addr add "$LOCK_IP/24" dev "$VETH"
    ip link set "$VETH" up
    ip -n "$NS" addr add "$NS_IP/24" dev "dlk$$n"
    ip -n "$NS" link set "dlk$$n" up
    ip -n "$NS" link set lo up
    NS_DEV="dlk$$n"
    say "network namespace $NS ($NS_IP) joined by veth $VETH ($HOST_IP, $LOCK_IP)"
fi

USED_PORTS=" "
port_is_free() { # addr port
    python3 - "$1" "$2" <<'PY' 2>/dev/null
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
try:
    s.bind((sys.argv[1], int(sys.argv[2])))
except OSError:
    sys.exit(1)
finally:
    s.close()
PY
}
# Below the kernel's ephemeral range (ip_local_port_range, 32768.. by default), so no
# outgoing connection takes a picked port before its service binds it; a per-run base.
PORT_MIN=20000
PORT_MAX=$(($(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768) - 1))
[ "$PORT_MAX" -gt $((PORT_MIN + 1000)) ] || PORT_MAX=32767
NEXT_PORT=$((PORT_MIN + ($$ * 37) % (PORT_MAX - PORT_MIN)))
PICKED=""
pick_port() { # addr: sets PICKED
    local port=$NEXT_PORT
    while :; do
        port=$((port + 1))
        [ $port -le $PORT_MAX ] || port=$PORT_MIN
        case "$USED_PORTS" in *" $port "*) continue ;; esac
        if port_is_free 127.0.0.1 "$port" && port_is_free "$1" "$port"; then
            USED_PORTS="$USED_PORTS$port "
            PICKED=$port
            NEXT_PORT=$port
            return 0
        fi
    done
}

wait_until() { # what log seconds cmd...: on a timeout, the end of that log and the events
    local what=$1 log=$2 secs=$3
    shift 3
    local deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $deadline ]; then
            { echo "--- last lines of $LOGS/$log.log"; tail -n 30 "$LOGS/$log.log"
              echo "--- $RUN/events.log"; cat "$RUN/events.log"; } >&2 2>/dev/null
            die "$what not ready after ${secs}s (logs in $LOGS)"
        fi
        sleep 0.1
    done
}

# ------------------------------------------------------------------------------------
# Supervision: one background loop per process, like systemd's Restart=on-failure with
# RestartSec=$RESTART_SEC. $RUN/<name>.pid always holds the current pid; every exit and
# restart is appended to $RUN/events.log.
# ------------------------------------------------------------------------------------
supervise() { # name cmd...
    local name=$1
    shift
    SUPERVISED+=("$name")
    (
        trap - EXIT
        n=0
        while :; do
            [ -e "$RUN/stopping" ] && exit 0
            "$@" >>"$LOGS/$name.log" 2>&1 &
            pid=$!
            echo "$pid" >"$RUN/$name.pid.tmp" && mv "$RUN/$name.pid.tmp" "$RUN/$name.pid"
            n=$((n + 1))
            echo "$(stamp) $name start #$n pid $pid" >>"$RUN/events.log"
            rc=0
            wait "$pid" || rc=$?
            [ -e "$RUN/stopping" ] && exit 0
            echo "$(stamp) $name exit pid $pid rc $rc" >>"$RUN/events.log"
            [ "$rc" -eq 0 ] && exit 0
            sleep "$RESTART_SEC"
        done
    ) &
    SUP_PIDS+=($!)
    echo "$!" >"$RUN/$name.sup"
}

# A dlock process: `dlock_proc NAME VAR=VALUE... dlock SUBCOMMAND`, supervised, with its
# trace file (--trace-dir) and its fake wall clock (--faketime-dir) when asked.
dlock_proc() { # name env-assignments... -- cmd...
    local name=$1
    shift
    local extra=()
    if [ -n "$TRACE_DIR" ]; then extra+=("DLOCK_TRACE_FILE=$TRACE_DIR/$name.jsonl"); fi
    if [ -n "$FAKETIME_DIR" ]; then
        [ -e "$FAKETIME_DIR/$name" ] || echo "+0" >"$FAKETIME_DIR/$name"
        extra+=("LD_PRELOAD=$LIBFAKETIME_MT" "FAKETIME_TIMESTAMP_FILE=$FAKETIME_DIR/$name"
            "FAKETIME_DONT_FAKE_MONOTONIC=1" "FAKETIME_CACHE_DURATION=1")
    fi
    supervise "$name" env "${extra[@]}" "$@"
}

# ------------------------------------------------------------------------------------
# Secrets: deploy/make-secrets.sh (credentials, executor token, grant keys).
# ------------------------------------------------------------------------------------
SECRETS="$DIR/secrets"
"$ROOT/deploy/make-secrets.sh" "$SECRETS" >/dev/null
if [ -n "$CREDENTIALS_EXTRA" ]; then
    [ -r "$CREDENTIALS_EXTRA" ] || die "--credentials-extra $CREDENTIALS_EXTRA: not readable"
    cat "$CREDENTIALS_EXTRA" >>"$SECRETS/credentials"
fi
READER_TOKEN_FILE="$SECRETS/reader-token"
OPERATOR_TOKEN_FILE="$SECRETS/operator-token"
(umask 077
    awk '$1 == "reader" {print $2}' "$SECRETS/credentials" >"$READER_TOKEN_FILE"
    awk '$1 == "operator" {print $2}' "$SECRETS/credentials" >"$OPERATOR_TOKEN_FILE")
export DLOCK_PROFILE="$PROFILE"
export DLOCK_AUTH_CREDENTIALS_FILE="$SECRETS/credentials"
[ -n "$CONFIG" ] && export DLOCK_CONFIG="$CONFIG"
# The etcd members must not read ETCD_* variables of this environment.
ETCD_UNSET=()
for v in $(compgen -e); do case "$v" in ETCD_*) ETCD_UNSET+=(-u "$v") ;; esac; done

# ------------------------------------------------------------------------------------
# PostgreSQL (as scripts/test.sh's start_pg: initdb as the postgres user, trust auth on
# loopback, no durability: a throwaway cluster).
# ------------------------------------------------------------------------------------
as_pg() { if is_root; then runuser -u postgres -- "$@"; else "$@"; fi; }
PG_BIN="$(pg_bin_dir)"
mkdir -p "$DIR/pg"
if is_root; then
    id postgres >/dev/null 2>&1 || die "OS user postgres missing (it comes with the Debian package postgresql)"
    chown postgres:postgres "$DIR/pg"
fi
chmod 700 "$DIR/pg"
as_pg "$PG_BIN/initdb" -D "$DIR/pg/data" -U postgres -A trust -E UTF8 --locale=C --no-sync \
    >"$LOGS/initdb.log" 2>&1 || { cat "$LOGS/initdb.log" >&2; die "initdb failed"; }
pick_port 127.0.0.1
PG_PORT=$PICKED
cat >>"$DIR/pg/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$DIR/pg'
fsync = off
synchronous_commit = on
full_page_writes = off
max_connections = 200
EOF
# synchronous_commit stays on: a commit is acknowledged only once its WAL is written, so a
# kill -9 of PostgreSQL (the real run's crash) loses no acknowledged commit. Off, it lost an
# intent the proxy had already forwarded, and the payout was paid twice (docs/testing/bugs.md
# B20). fsync and full_page_writes guard against the machine losing power, which no fault
# here injects: the OS keeps what a killed process wrote.
touch "$LOGS/postgres.log"
is_root && chown postgres "$LOGS/postgres.log"
# Supervised like every process (a kill -9 is followed by a restart and crash recovery);
# as root through setpriv, which execs, so the pid file holds the postmaster itself.
if is_root; then
    supervise postgres setpriv --reuid=postgres --regid=postgres --init-groups "$PG_BIN/postgres" -D "$DIR/pg/data"
else
    supervise postgres "$PG_BIN/postgres" -D "$DIR/pg/data"
fi
wait_until "PostgreSQL on 127.0.0.1:$PG_PORT" postgres $SERVICE_TIMEOUT_S pg_isready -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -t 1
PG_PID=$(cat "$RUN/postgres.pid")
psql -q "postgres://postgres@127.0.0.1:$PG_PORT/postgres" -v ON_ERROR_STOP=1 -c 'create database paydb' >/dev/null
PAYDB_URL="postgres://postgres@127.0.0.1:$PG_PORT/paydb"
psql -q "postgres://postgres@127.0.0.1:$PG_PORT/postgres" -v ON_ERROR_STOP=1 -c 'create database lockdb' >/dev/null
LOCKDB_URL="postgres://postgres@127.0.0.1:$PG_PORT/lockdb"
say "PostgreSQL ready on 127.0.0.1:$PG_PORT (pid $PG_PID)"

# ------------------------------------------------------------------------------------
# etcd: three members on loopback.
# ------------------------------------------------------------------------------------
ETCD_CLIENT=()
ETCD_PEER=()
for i in 1 2 3; do
    pick_port 127.0.0.1; ETCD_CLIENT+=("http://127.0.0.1:$PICKED")
    pick_port 127.0.0.1; ETCD_PEER+=("http://127.0.0.1:$PICKED")
done
INITIAL_CLUSTER="etcd-1=${ETCD_PEER[0]},etcd-2=${ETCD_PEER[1]},etcd-3=${ETCD_PEER[2]}"
for i in 1 2 3; do
    supervise "etcd-$i" env "${ETCD_UNSET[@]}" etcd --name "etcd-$i" \
        --data-dir "$DIR/data/etcd-$i" \
        --listen-client-urls "${ETCD_CLIENT[$((i - 1))]}" \
        --advertise-client-urls "${ETCD_CLIENT[$((i - 1))]}" \
        --listen-peer-urls "${ETCD_PEER[$((i - 1))]}" \
        --initial-advertise-peer-urls "${ETCD_PEER[$((i - 1))]}" \
        --initial-cluster "$INITIAL_CLUSTER" \
        --initial-cluster-state new \
        --initial-cluster-token "dlock-local-$$"
done
etcd_healthy() { curl -fsS --max-time 2 "$1/health" 2>/dev/null | grep -q '"health":[ ]*"true"'; }
for i in 1 2 3; do
    wait_until "etcd-$i at ${ETCD_CLIENT[$((i - 1))]}" "etcd-$i" $SERVICE_TIMEOUT_S etcd_healthy "${ETCD_CLIENT[$((i - 1))]}"
done
ETCD_ENDPOINTS="$(IFS=,; echo "${ETCD_CLIENT[*]}")"
say "etcd cluster ready: $ETCD_ENDPOINTS"

# ------------------------------------------------------------------------------------
# dlock services.
# ------------------------------------------------------------------------------------
"$DLOCK" migrate --db paydb --database-url "$PAYDB_URL" >>"$LOGS/migrate.log" 2>&1 \
    || { tail -n 20 "$LOGS/migrate.log" >&2; die "dlock migrate failed"; }
"$DLOCK" migrate --db lockdb --database-url "$LOCKDB_URL" >>"$LOGS/migrate.log" 2>&1 \
    || { tail -n 20 "$LOGS/migrate.log" >&2; die "dlock migrate (lockdb) failed"; }

ready() { curl -fsS --max-time 2 "$1/health/ready" >/dev/null 2>&1; }

pick_port "$LOCK_IP"; LOCK_URLS=("http://$LOCK_IP:$PICKED")
pick_port "$LOCK_IP"; LOCK_URLS+=("http://$LOCK_IP:$PICKED")
pick_port "$LOCK_IP"; LOCK_PG_URL="http://$LOCK_IP:$PICKED"
pick_port "$HOST_IP"; PAYMENT_URL="http://$HOST_IP:$PICKED"
pick_port "$HOST_IP"; PROXY_URLS=("http://$HOST_IP:$PICKED")
pick_port "$HOST_IP"; PROXY_URLS+=("http://$HOST_IP:$PICKED")
pick_port "$HOST_IP"; STUB_URL="http://$HOST_IP:$PICKED"

for i in 1 2; do
    dlock_proc "lock-server-$i" env \
        DLOCK_LOCK_SERVER_LISTEN="${LOCK_URLS[$((i - 1))]#http://}" \
        DLOCK_LOCK_SERVER_BACKEND=etcd \
        DLOCK_LOCK_SERVER_ETCD_ENDPOINTS="$ETCD_ENDPOINTS" \
        DLOCK_LOCK_SERVER_ETCD_PREFIX=/dlock \
        DLOCK_LOCK_GRANTS_SIGNING_KEY_FILE="$SECRETS/grant-signing.key" \
        "$DLOCK" lock-server
done
dlock_proc lock-server-pg env \
    DLOCK_LOCK_SERVER_LISTEN="${LOCK_PG_URL#http://}" \
    DLOCK_LOCK_SERVER_BACKEND=postgres \
    DLOCK_LOCK_SERVER_DATABASE_URL="$LOCKDB_URL" \
    "$DLOCK" lock-server
dlock_proc rail-stub env DLOCK_RAIL_STUB_LISTEN="${STUB_URL#http://}" "$DLOCK" rail-stub
dlock_proc payment-resource env \
    DLOCK_PAYMENT_RESOURCE_LISTEN="${PAYMENT_URL#http://}" \
    DLOCK_PAYMENT_RESOURCE_DATABASE_URL="$PAYDB_URL" \
    DLOCK_PAYMENT_GRANTS_VERIFY_KEYS_FILE="$SECRETS/grant-verify.keys" \
    "$DLOCK" payment-resource
for i in 1 2; do
    dlock_proc "rail-proxy-$i" env \
        DLOCK_RAIL_PROXY_LISTEN="${PROXY_URLS[$((i - 1))]#http://}" \
        DLOCK_RAIL_PROXY_DATABASE_URL="$PAYDB_URL" \
        DLOCK_RAIL_PROXY_RAIL_URL="$STUB_URL" \
        DLOCK_RAIL_PROXY_GRANTS_VERIFY_KEYS_FILE="$SECRETS/grant-verify.keys" \
        "$DLOCK" rail-proxy
done
for pair in "lock-server-1 ${LOCK_URLS[0]}" "lock-server-2 ${LOCK_URLS[1]}" "lock-server-pg $LOCK_PG_URL" \
    "rail-stub $STUB_URL" \
    "payment-resource $PAYMENT_URL" "rail-proxy-1 ${PROXY_URLS[0]}" "rail-proxy-2 ${PROXY_URLS[1]}"; do
    wait_until "${pair%% *} at ${pair#* }" "${pair%% *}" $SERVICE_TIMEOUT_S ready "${pair#* }"
done
say "services ready"

# Executors: executor-N -> lock server / proxy as in the header. executor-3 in the
# namespace with --netns.
EXEC_LOCK=("${LOCK_URLS[0]}" "${LOCK_URLS[1]}" "${LOCK_URLS[0]}")
EXEC_PROXY=("${PROXY_URLS[0]}" "${PROXY_URLS[1]}" "${PROXY_URLS[1]}")
EXEC_URLS=()
for i in 1 2 3; do
    ip_of=$HOST_IP
    wrap=()
    if [ "$NETNS" = 1 ] && [ "$i" = 3 ]; then
        ip_of=$NS_IP
        wrap=(ip netns exec "$NS")
    fi
    pick_port "$HOST_IP"
    EXEC_URLS+=("http://$ip_of:$PICKED")
    dlock_proc "executor-$i" "${wrap[@]}" env \
        DLOCK_EXECUTOR_LISTEN="$ip_of:$PICKED" \
        DLOCK_EXECUTOR_LOCK_URL="${EXEC_LOCK[$((i - 1))]}" \
        DLOCK_EXECUTOR_PAYMENT_URL="$PAYMENT_URL" \
        DLOCK_EXECUTOR_PROXY_URL="${EXEC_PROXY[$((i - 1))]}" \
        DLOCK_EXECUTOR_OWNER_ID="executor-$i" \
        DLOCK_EXECUTOR_AUTH_TOKEN_FILE="$SECRETS/executor-token" \
        "$DLOCK" executor
done
for i in 1 2 3; do
    wait_until "executor-$i at ${EXEC_URLS[$((i - 1))]}" "executor-$i" $SERVICE_TIMEOUT_S ready "${EXEC_URLS[$((i - 1))]}"
done
say "executors ready"

# The reconciler: detective, log only (the real run runs the judging one itself).
(
    trap - EXIT
    while [ ! -e "$RUN/stopping" ]; do
        sleep "$RECONCILE_INTERVAL"
        rc=0
        "$DLOCK" reconcile --database-url "$PAYDB_URL" --rail-url "$STUB_URL" >"$RUN/reconcile.last" 2>&1 || rc=$?
        echo "$(stamp) reconcile rc $rc" >>"$LOGS/reconciler.log"
        [ $rc -eq 0 ] || cat "$RUN/reconcile.last" >>"$LOGS/reconciler.log"
    done
) &
RECONCILER_PID=$!

q() { printf '%q' "$1"; }
{
    echo "# dlock local cluster (deploy/local/up.sh); shell syntax"
    echo "DIR=$(q "$DIR")"
    echo "DLOCK=$(q "$DLOCK")"
    echo "LOGS=$(q "$LOGS")"
    echo "RUN=$(q "$RUN")"
    echo "PAYDB_URL=$(q "$PAYDB_URL")"
    echo "ETCD_ENDPOINTS=$(q "$ETCD_ENDPOINTS")"
    echo "ETCD_URLS=(${ETCD_CLIENT[*]})"
    echo "LOCK_URLS=(${LOCK_URLS[*]})"
    echo "LOCK_PG_URL=$LOCK_PG_URL"
    echo "LOCKDB_URL=$(q "$LOCKDB_URL")"
    echo "PAYMENT_URL=$PAYMENT_URL"
    echo "PROXY_URLS=(${PROXY_URLS[*]})"
    echo "STUB_URL=$STUB_URL"
    echo "EXEC_URLS=(${EXEC_URLS[*]})"
    echo "CREDENTIALS_FILE=$(q "$SECRETS/credentials")"
    echo "READER_TOKEN_FILE=$(q "$READER_TOKEN_FILE")"
    echo "OPERATOR_TOKEN_FILE=$(q "$OPERATOR_TOKEN_FILE")"
    echo "PROCESSES=(${SUPERVISED[*]})"
    echo "RESTART_SEC=$RESTART_SEC"
    echo "NETNS=$(q "$NS")"
    echo "NETNS_DEV=$(q "${NS_DEV:-}")"
    echo "NETNS_VOID_IP=$(q "${NS_VOID_IP:-}")"
    echo "LOCK_IP=$LOCK_IP"
    echo "UP_PID=$$"
    echo "PG_DATA=$(q "$DIR/pg/data")"
    echo "TRACE_DIR=$(q "$TRACE_DIR")"
    echo "FAKETIME_DIR=$(q "$FAKETIME_DIR")"
    echo "HOST_IP=$HOST_IP"
    echo "NS_IP=$(q "${NS_IP:-}")"
} >"$DIR/cluster.env.tmp"
# The same, as JSON, for tools that read JSON.
jlist() { local out="" x; for x in "$@"; do out="$out${out:+, }\"$x\""; done; echo "[$out]"; }
cat >"$DIR/cluster.json" <<JSON
{
  "payment_url": "$PAYMENT_URL",
  "stub_url": "$STUB_URL",
  "lock_urls": $(jlist "${LOCK_URLS[@]}"),
  "lock_pg_url": "$LOCK_PG_URL",
  "proxy_urls": $(jlist "${PROXY_URLS[@]}"),
  "exec_urls": $(jlist "${EXEC_URLS[@]}"),
  "etcd_urls": $(jlist "${ETCD_CLIENT[@]}"),
  "reader_token_file": "$READER_TOKEN_FILE",
  "operator_token_file": "$OPERATOR_TOKEN_FILE"
}
JSON
mv "$DIR/cluster.env.tmp" "$DIR/cluster.env"

echo
say "cluster up in $DIR (profile $PROFILE)"
printf '  %-18s %-28s %-8s %s\n' process url pid log
row() { printf '  %-18s %-28s %-8s %s\n' "$1" "$2" "$(cat "$RUN/$1.pid")" "$LOGS/$1.log"; }
for i in 1 2 3; do row "etcd-$i" "${ETCD_CLIENT[$((i - 1))]}"; done
printf '  %-18s %-28s %-8s %s\n' postgres "$PAYDB_URL" "$PG_PID" "$LOGS/postgres.log"
row lock-server-1 "${LOCK_URLS[0]}"
row lock-server-2 "${LOCK_URLS[1]}"
row lock-server-pg "$LOCK_PG_URL"
row payment-resource "$PAYMENT_URL"
row rail-proxy-1 "${PROXY_URLS[0]}"
row rail-proxy-2 "${PROXY_URLS[1]}"
row rail-stub "$STUB_URL"
for i in 1 2 3; do row "executor-$i" "${EXEC_URLS[$((i - 1))]}"; done
printf '  %-18s every %ss       %-8s %s\n' reconciler "$RECONCILE_INTERVAL" "$RECONCILER_PID" "$LOGS/reconciler.log"
say "credentials (worker, operator, reader) in $SECRETS/credentials; settings in $DIR/cluster.env"
say "restarts are logged in $RUN/events.log; Ctrl-C stops everything"
while :; do
    sleep 1 &
    wait $! || true
done
