#!/usr/bin/env bash
# scripts/test.sh — THE command that runs every dlock test, on a fresh Debian 12
# machine, from nothing. CI runs it through .ci/run.
#
# What it does, in order:
#   1. Installs missing system packages with apt (needs root):
#        postgresql (server), etcd-server (`etcd`), protobuf-compiler (`protoc`,
#        for etcd-client's build script), pkg-config, curl (etcd health checks),
#        libfaketime (two lock servers with their wall clocks 40 s apart,
#        crates/dlock/tests/faketime_replicas.rs), chromium and fonts-dejavu-core (the
#        timeline's headless browser test,
#        crates/dlock-timeline/tests/browser.rs), prometheus (`promtool`, for the alert
#        rules of deploy/observability/), python3-venv (the manifest checker's venv);
#        for the real run also iproute2 (`ip`: its network namespace), nftables (`nft`: its
#        partitions and lossy links), openssl (deploy/make-secrets.sh), and etcd-server,
#        postgresql, curl even when reused.
#      `apt-get update` runs once, and only if something is missing.
#   2. Starts a throwaway PostgreSQL and a throwaway etcd on 127.0.0.1, on free
#      ports, in temp dirs (etcd's on /dev/shm when writable: no fsync stalls), and exports
#        DLOCK_TEST_PG_URL=postgres://postgres@127.0.0.1:PORT/postgres
#        DLOCK_TEST_ETCD_ENDPOINTS=http://127.0.0.1:PORT
#      Both are stopped, and their temp dirs removed, on exit (whatever the exit).
#      If either variable is already set, that service is reused, not started.
#   2b. Points TMPDIR at a fresh dir on /dev/shm (tmpfs) when it is writable and has
#      TEST_TMP_SHM_KB_MIN free: the tests' scratch (their SQLite files, the services'
#      data dirs, the etcds some tests start) then syncs for free, so one test's fsyncs
#      cannot stall another's window on a shared disk. Removed on exit.
#   3. Runs, failing fast, with a banner per stage:
#        cargo fmt --all -- --check
#        cargo clippy --workspace --all-targets --locked -- -D warnings
#        book: mdbook (pinned, MDBOOK_VERSION below, installed once from crates.io into
#          target/tools with `cargo install --locked`) builds docs/ into target/book; the
#          book's links are checked by crates/dlock-testkit/tests/docs_links.rs (test stage)
#        cargo build --release --locked -p dlock   (searched by crates/dlock/tests/release_build.rs)
#        cargo build --release --locked -p dlock-real   (apart: dlock keeps its own features)
#        real run: `dlock-real run --seed $DLOCK_REAL_SEED --duration $DLOCK_REAL_DURATION`
#          (docs/real-runs.md: the release binaries on a real 3-member etcd and PostgreSQL of
#          their own, 1 200 payouts under a seeded nemesis in the simulation's fault
#          vocabulary, judged by the simulation's oracle; needs root), then every planted
#          bug a real run plants (`dlock-real plants`), each of which must be caught
#        cargo nextest run --workspace --locked --no-fail-fast "$@"
#          (+ cargo test --doc, since nextest does not run doctests)
#          or, without cargo-nextest: cargo test --workspace --locked "$@"
#        promtool check rules / promtool test rules (deploy/observability/prometheus/)
#        deploy manifests: kubernetes-validate (pinned, deploy/validate-requirements.txt, in
#          target/deploy-venv) on deploy/k8s/*.yaml, scripts/check-compose.py on the compose file
#        API conformance: scripts/check-api.sh — each service from the release binary,
#          schemathesis (pinned, deploy/api-check-requirements.txt, in target/api-check-venv)
#          against it with its own docs/api/<service>.json
#        fuzz: builds fuzz/ (its own workspace, fuzz/Cargo.lock) on the stable toolchain with
#          libFuzzer's coverage instrumentation (FUZZ_RUSTFLAGS below, fuzz/README.md) and
#          runs every target for FUZZ_SECONDS_PER_TARGET from its committed seed corpus
#          (fuzz/corpus/<target>/); a crash or a failed property fails the build
#        RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR=target/sim cargo clippy ... -D warnings
#        RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR=target/sim cargo test --workspace --locked --profile sim
#          (with INSTA_UPDATE=no: a changed scenario trace snapshot fails, as under CI=true)
#   4. Prints the total wall time.
#
# Usage:
#   ./scripts/test.sh [FILTER...]    extra args go to the main test run only
#                                    (a nextest / cargo test name filter)
#
# Environment knobs:
#   DLOCK_SKIP_LINT=1            skip the fmt and clippy stages (both builds)
#   DLOCK_SKIP_SIM=1             skip the madsim stages
#   DLOCK_SKIP_FUZZ=1            skip the fuzz stage
#   DLOCK_SKIP_BOOK=1            skip the book stage (no mdbook install, no build)
#   DLOCK_SKIP_REAL_RUN=1        skip the real run (real/, docs/real-runs.md; it needs root)
#   DLOCK_REAL_SEED              the real run's seed (default 1: CI replays one schedule)
#   DLOCK_REAL_DURATION          the real run's fault phase (default 60s; the soak is 30m)
#   FUZZ_SECONDS_PER_TARGET      seconds of libFuzzer per fuzz target (default 5, a smoke; the
#                                stage runs the targets one after the other)
#   DLOCK_SKIP_BROWSER=1         do not install chromium; the browser tests (the timeline's,
#                                the console's) then print that they skipped (without this
#                                knob a missing chromium fails them)
#   DLOCK_TEST_ONLY_SERVICES=1   start (or reuse) PostgreSQL and etcd, print their URLs,
#                                check them (psql 'select 1', etcd /health), stop them
#                                and exit 0 — runs no cargo at all
#   DLOCK_TEST_PG_URL            reuse this PostgreSQL admin URL instead of starting one
#                                (the tests create one fresh database per test from it)
#   DLOCK_TEST_ETCD_ENDPOINTS    reuse these etcd endpoints instead of starting one
#   DLOCK_TEST_TMP_ON_DISK=1     keep the tests' scratch under the inherited TMPDIR (a disk)
#   DLOCK_TEST_SERVICE_TIMEOUT   seconds to wait for each service to be ready (default 60)
#   MADSIM_TEST_NUM              seeds per madsim test (default 32; each seed is a full
#                                simulated run: raise it to thousands for a soak)
#   DLOCK_SIM_SEEDS              seeds of the swarm campaign (sim/tests/campaign.rs,
#                                default 2000); `cargo xtask sim run` for big campaigns
set -euo pipefail

T_START=$SECONDS
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

SERVICE_TIMEOUT="${DLOCK_TEST_SERVICE_TIMEOUT:-60}"

banner() { printf '\n==== %s ====\n' "$*"; }
note() { printf 'test.sh: %s\n' "$*"; }
die() { printf 'test.sh: error: %s\n' "$*" >&2; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }

# --------------------------------------------------------------------------------------
# Cleanup: stop whatever this script started, remove temp dirs, report wall time.
# --------------------------------------------------------------------------------------
PG_BIN=""
PG_TMP=""
PG_PID=""
ETCD_TMP=""
ETCD_PID=""
TEST_TMP=""

as_pg() {
    # initdb/postgres refuse to run as root: run them as the postgres OS user then.
    if is_root; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

stop_pg() {
    if [ -n "$PG_PID" ]; then
        if kill -0 "$PG_PID" 2>/dev/null; then
            as_pg "$PG_BIN/pg_ctl" -D "$PG_TMP/data" stop -m fast -w -t 30 >/dev/null 2>&1 \
                || kill -TERM "$PG_PID" 2>/dev/null || true
        fi
        wait "$PG_PID" 2>/dev/null || true
        PG_PID=""
    fi
}

stop_etcd() {
    if [ -n "$ETCD_PID" ]; then
        kill -TERM "$ETCD_PID" 2>/dev/null || true
        wait "$ETCD_PID" 2>/dev/null || true
        ETCD_PID=""
    fi
}

cleanup() {
    local rc=$?
    set +e
    stop_etcd
    stop_pg
    [ -n "$ETCD_TMP" ] && rm -rf "$ETCD_TMP"
    [ -n "$PG_TMP" ] && rm -rf "$PG_TMP"
    [ -n "$TEST_TMP" ] && rm -rf "$TEST_TMP"
    local secs=$((SECONDS - T_START))
    if [ "$rc" -eq 0 ]; then
        printf '\ntest.sh: all stages passed; total wall time %dm%02ds\n' $((secs / 60)) $((secs % 60))
    else
        printf '\ntest.sh: FAILED (exit %d); total wall time %dm%02ds\n' "$rc" $((secs / 60)) $((secs % 60)) >&2
    fi
    # What the build left on disk, for a failure that was the disk's (and for the next run).
    printf 'test.sh: disk at exit: %s GB free; build trees: %s\n' \
        "$(df -Pk "$ROOT" | awk 'NR == 2 { print int($4 / 1024 / 1024) }')" \
        "$(du -sh "$ROOT/target" "$ROOT/fuzz/target" 2>/dev/null | awk '{ printf "%s %s  ", $2, $1 }')"
    if [ -n "${TEST_LOG:-}" ]; then
        test_totals
        rm -f "$TEST_LOG"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --------------------------------------------------------------------------------------
# 1. System packages.
# --------------------------------------------------------------------------------------
pg_bin_dir() {
    # Highest installed PostgreSQL major version that has a server (sort -V: 9 < 10).
    local d
    for d in /usr/lib/postgresql/*/bin; do
        # `if`, not `&&`: a client-only version dir must not fail the loop (pipefail).
        if [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && [ -x "$d/pg_ctl" ]; then
            echo "$d"
        fi
    done | sort -V | tail -n 1
}

ensure_packages() {
    local missing=()
    command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
    command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
    if [ -z "${DLOCK_TEST_PG_URL:-}" ]; then
        { [ -n "$(pg_bin_dir)" ] && command -v pg_isready >/dev/null 2>&1 && command -v psql >/dev/null 2>&1; } \
            || missing+=(postgresql)
    fi
    if [ -z "${DLOCK_TEST_ETCD_ENDPOINTS:-}" ]; then
        command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
        command -v curl >/dev/null 2>&1 || missing+=(curl)
    fi
    # promtool (the alert rules' check and unit tests, deploy/observability/).
    command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
    # The real run (deploy/local/up.sh under dlock-real): an etcd cluster and a PostgreSQL
    # of its own (whatever DLOCK_TEST_* reuses), `ip` for its network namespace, `nft` for
    # its partitions, openssl for deploy/make-secrets.sh, curl for its health checks.
    if [ "${DLOCK_SKIP_REAL_RUN:-0}" != "1" ]; then
        want() { case " ${missing[*]} " in *" $1 "*) ;; *) missing+=("$1") ;; esac; }
        command -v ip >/dev/null 2>&1 || want iproute2
        command -v nft >/dev/null 2>&1 || want nftables
        command -v openssl >/dev/null 2>&1 || want openssl
        command -v curl >/dev/null 2>&1 || want curl
        command -v etcd >/dev/null 2>&1 || want etcd-server
        { [ -n "$(pg_bin_dir)" ] && command -v psql >/dev/null 2>&1; } || want postgresql
    fi
    # libfaketime (crates/dlock/tests/faketime_replicas.rs preloads libfaketimeMT into dlock).
    [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] || missing+=(libfaketime)
    # python3-venv (the pinned manifest checker's venv, "deploy manifests" stage).
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
    # openssl and curl (the throwaway grant key and the document fetch, "API conformance").
    command -v openssl >/dev/null 2>&1 || missing+=(openssl)
    command -v curl >/dev/null 2>&1 || missing+=(curl)
    if [ "${DLOCK_SKIP_BROWSER:-0}" != "1" ]; then
        command -v chromium >/dev/null 2>&1 || missing+=(chromium)
        [ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing+=(fonts-dejavu-core)
    fi
    if [ "${#missing[@]}" -eq 0 ]; then
        note "system packages present"
        return
    fi
    note "missing system packages: ${missing[*]}"
    if ! command -v apt-get >/dev/null 2>&1; then
        die "apt-get not found: install ${missing[*]} by hand (this script targets Debian 12), or set DLOCK_TEST_PG_URL / DLOCK_TEST_ETCD_ENDPOINTS to reuse running services"
    fi
    if ! is_root; then
        die "installing ${missing[*]} needs root (apt-get): rerun as root, install them by hand, or set DLOCK_TEST_PG_URL / DLOCK_TEST_ETCD_ENDPOINTS to reuse running services"
    fi
    banner "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
    # Re-check: a package that installed but did not deliver the binary is a hard error.
    command -v protoc >/dev/null 2>&1 || die "protoc still missing after installing protobuf-compiler"
    command -v pkg-config >/dev/null 2>&1 || die "pkg-config still missing after install"
    if [ -z "${DLOCK_TEST_PG_URL:-}" ]; then
        [ -n "$(pg_bin_dir)" ] || die "no PostgreSQL server under /usr/lib/postgresql/*/bin after install"
    fi
    if [ -z "${DLOCK_TEST_ETCD_ENDPOINTS:-}" ]; then
        command -v etcd >/dev/null 2>&1 || die "etcd still missing after installing etcd-server"
    fi
    command -v promtool >/dev/null 2>&1 || die "promtool still missing after installing prometheus"
    [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] || die "libfaketimeMT still missing after installing libfaketime"
    if [ "${DLOCK_SKIP_REAL_RUN:-0}" != "1" ]; then
        command -v ip >/dev/null 2>&1 || die "ip still missing after installing iproute2"
        command -v nft >/dev/null 2>&1 || die "nft still missing after installing nftables"
        command -v openssl >/dev/null 2>&1 || die "openssl still missing after install"
    fi
    if [ "${DLOCK_SKIP_BROWSER:-0}" != "1" ]; then
        command -v chromium >/dev/null 2>&1 || die "chromium still missing after install"
    fi
}

# --------------------------------------------------------------------------------------
# 2. Throwaway services.
# --------------------------------------------------------------------------------------
USED_PORTS=" "

port_is_free() {
    local port=$1
    if command -v python3 >/dev/null 2>&1; then
        python3 - "$port" <<'PY' 2>/dev/null
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
finally:
    s.close()
PY
    else
        # Nothing accepts a connection there (a refused connect returns at once).
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 1
        fi
        return 0
    fi
}

# pick_port START: sets PICKED to the first port >= START that is free and not yet
# handed out by this script (no command substitution: USED_PORTS must persist).
PICKED=""
pick_port() {
    local port=$1
    while [ "$port" -lt 65000 ]; do
        case "$USED_PORTS" in
            *" $port "*) ;;
            *)
                if port_is_free "$port"; then
                    USED_PORTS="$USED_PORTS$port "
                    PICKED=$port
                    return 0
                fi
                ;;
        esac
        port=$((port + 1))
    done
    return 1
}

start_pg() {
    PG_BIN="$(pg_bin_dir)"
    [ -n "$PG_BIN" ] || die "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin"
    # Under /tmp (not $TMPDIR) so the postgres OS user can always reach it.
    PG_TMP="$(mktemp -d /tmp/dlock-pg.XXXXXX)"
    if is_root; then
        id postgres >/dev/null 2>&1 || die "OS user 'postgres' missing (it comes with the postgresql package)"
        chown postgres:postgres "$PG_TMP"
    fi
    chmod 700 "$PG_TMP"
    note "initdb ($PG_BIN) in $PG_TMP"
    if ! as_pg "$PG_BIN/initdb" -D "$PG_TMP/data" -U postgres -A trust -E UTF8 --locale=C --no-sync \
        >"$PG_TMP/initdb.log" 2>&1; then
        cat "$PG_TMP/initdb.log" >&2
        die "initdb failed"
    fi
    # Throwaway cluster: loopback only, trust auth (initdb -A trust), no durability.
    cat >>"$PG_TMP/data/postgresql.conf" <<EOF

# --- dlock scripts/test.sh: throwaway test cluster ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '$PG_TMP'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 200
EOF

    local attempt port deadline
    for attempt in 1 2 3 4 5; do
        pick_port 55432 || die "no free port for PostgreSQL"
        port=$PICKED
        # Not through as_pg: a backgrounded function is a subshell, and PG_PID must be
        # the process that a TERM stops (runuser forwards TERM to postgres).
        if is_root; then
            runuser -u postgres -- "$PG_BIN/postgres" -D "$PG_TMP/data" -p "$port" >>"$PG_TMP/postgres.log" 2>&1 &
        else
            "$PG_BIN/postgres" -D "$PG_TMP/data" -p "$port" >>"$PG_TMP/postgres.log" 2>&1 &
        fi
        PG_PID=$!
        deadline=$((SECONDS + SERVICE_TIMEOUT))
        while :; do
            if pg_isready -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -t 1; then
                export DLOCK_TEST_PG_URL="postgres://postgres@127.0.0.1:$port/postgres"
                note "PostgreSQL ready on 127.0.0.1:$port (pid $PG_PID)"
                return 0
            fi
            if ! kill -0 "$PG_PID" 2>/dev/null; then
                wait "$PG_PID" 2>/dev/null || true
                PG_PID=""
                note "PostgreSQL exited during start on port $port (attempt $attempt); retrying on another port"
                break
            fi
            if [ "$SECONDS" -ge "$deadline" ]; then
                tail -n 50 "$PG_TMP/postgres.log" >&2 || true
                die "PostgreSQL not ready on 127.0.0.1:$port after ${SERVICE_TIMEOUT}s"
            fi
            sleep 0.1
        done
    done
    tail -n 50 "$PG_TMP/postgres.log" >&2 || true
    die "PostgreSQL failed to start (5 attempts)"
}

etcd_healthy() {
    curl -fsS --max-time 2 "$1/health" 2>/dev/null | grep -q '"health":[ ]*"true"'
}

start_etcd() {
    # The throwaway etcd keeps its data in memory (/dev/shm, tmpfs) when it can: its fsyncs
    # are then free, so a disk busy with the suite's own databases cannot stall a request
    # past the store's RPC bound (RPC_MS_MAX, 2 s). Its durability is not under test here
    # (etcd_restart.rs and etcd_member_down.rs start etcds of their own, in the tests'
    # scratch: tmpfs too when step 2b could place it there).
    local etcd_parent="${TMPDIR:-/tmp}"
    if [ -d /dev/shm ] && [ -w /dev/shm ]; then etcd_parent=/dev/shm; fi
    ETCD_TMP="$(mktemp -d "$etcd_parent/dlock-etcd.XXXXXX")"
    local attempt cport pport url peer deadline v
    # ETCD_* variables in our environment would configure the throwaway etcd too.
    local unset_etcd_env=()
    for v in $(compgen -e); do
        case "$v" in ETCD_*) unset_etcd_env+=(-u "$v") ;; esac
    done
    for attempt in 1 2 3 4 5; do
        pick_port 52379 || die "no free port for etcd clients"
        cport=$PICKED
        pick_port $((cport + 1)) || die "no free port for etcd peers"
        pport=$PICKED
        url="http://127.0.0.1:$cport"
        peer="http://127.0.0.1:$pport"
        rm -rf "$ETCD_TMP/data"
        env "${unset_etcd_env[@]}" etcd --name default \
            --data-dir "$ETCD_TMP/data" \
            --listen-client-urls "$url" \
            --advertise-client-urls "$url" \
            --listen-peer-urls "$peer" \
            --initial-advertise-peer-urls "$peer" \
            --initial-cluster "default=$peer" \
            --initial-cluster-state new \
            --initial-cluster-token "dlock-test-$$" \
            >>"$ETCD_TMP/etcd.log" 2>&1 &
        ETCD_PID=$!
        deadline=$((SECONDS + SERVICE_TIMEOUT))
        while :; do
            if etcd_healthy "$url"; then
                export DLOCK_TEST_ETCD_ENDPOINTS="$url"
                note "etcd ready on $url (peer $peer, pid $ETCD_PID)"
                return 0
            fi
            if ! kill -0 "$ETCD_PID" 2>/dev/null; then
                wait "$ETCD_PID" 2>/dev/null || true
                ETCD_PID=""
                note "etcd exited during start on ports $cport/$pport (attempt $attempt); retrying on other ports"
                break
            fi
            if [ "$SECONDS" -ge "$deadline" ]; then
                tail -n 50 "$ETCD_TMP/etcd.log" >&2 || true
                die "etcd not healthy at $url after ${SERVICE_TIMEOUT}s"
            fi
            sleep 0.1
        done
    done
    tail -n 50 "$ETCD_TMP/etcd.log" >&2 || true
    die "etcd failed to start (5 attempts)"
}

# --------------------------------------------------------------------------------------
# Run.
# --------------------------------------------------------------------------------------
banner "system packages"
ensure_packages

if [ "${DLOCK_TEST_ONLY_SERVICES:-0}" != "1" ]; then
    command -v cargo >/dev/null 2>&1 || die "cargo not found on PATH (install Rust with rustup)"
fi

# Disk. A clean clone builds four trees (target/debug, target/release, target/sim,
# fuzz/target): about 20 GB with incremental compilation off, and about twice that with it
# on, which a clean clone never reuses. CI once ran out of disk linking a test binary
# (`No space left on device`, then `ld terminated with signal 7`), so incremental state is
# off unless the caller sets CARGO_INCREMENTAL, and the free space is said up front.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
DISK_FREE_GB_WANTED=25
disk_free_gb="$(df -Pk . | awk 'NR == 2 { print int($4 / 1024 / 1024) }')"
note "disk: ${disk_free_gb} GB free under $(pwd) (a cold run needs about ${DISK_FREE_GB_WANTED} GB); CARGO_INCREMENTAL=$CARGO_INCREMENTAL"
if [ "${disk_free_gb:-0}" -lt "$DISK_FREE_GB_WANTED" ]; then
    note "WARNING: less than ${DISK_FREE_GB_WANTED} GB free: a cold build may fail with 'No space left on device'"
fi

banner "services"
if [ -n "${DLOCK_TEST_PG_URL:-}" ]; then
    note "reusing PostgreSQL from DLOCK_TEST_PG_URL"
else
    start_pg
fi
if [ -n "${DLOCK_TEST_ETCD_ENDPOINTS:-}" ]; then
    note "reusing etcd from DLOCK_TEST_ETCD_ENDPOINTS"
else
    start_etcd
fi
note "DLOCK_TEST_PG_URL=$DLOCK_TEST_PG_URL"
note "DLOCK_TEST_ETCD_ENDPOINTS=$DLOCK_TEST_ETCD_ENDPOINTS"

if [ "${DLOCK_TEST_ONLY_SERVICES:-0}" = "1" ]; then
    banner "service checks (DLOCK_TEST_ONLY_SERVICES=1)"
    psql "$DLOCK_TEST_PG_URL" -v ON_ERROR_STOP=1 -Atc 'select 1'
    psql "$DLOCK_TEST_PG_URL" -v ON_ERROR_STOP=1 -Atc 'show max_connections'
    first_endpoint="${DLOCK_TEST_ETCD_ENDPOINTS%%,*}"
    curl -fsS --max-time 5 "$first_endpoint/health"
    echo
    etcd_healthy "$first_endpoint" || die "etcd at $first_endpoint is not healthy"
    note "services OK"
    exit 0
fi

TEST_LOG="$(mktemp -t dlock-test-log.XXXXXX)"

# The tests' scratch on tmpfs (step 2b above). SQLite runs with synchronous=FULL: on a disk
# shared by two test processes, the databases and the build, one commit's fsync was seen to
# take seconds (a trivial SQLite test took 6.6 s, a 300 ms lease lapsed between renews 50 ms
# apart, a PostgreSQL connect outlived its 2 s bound), all in the same minute of one CI run.
# Nothing under test needs the disk: a killed process's writes survive in tmpfs as on disk.
TEST_TMP_SHM_KB_MIN=$((8 * 1024 * 1024))
if [ "${DLOCK_TEST_TMP_ON_DISK:-0}" != "1" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
    shm_free_kb="$(df -Pk /dev/shm | awk 'NR == 2 { print $4 }')"
    if [ "${shm_free_kb:-0}" -ge "$TEST_TMP_SHM_KB_MIN" ]; then
        TEST_TMP="$(mktemp -d /dev/shm/dlock-tests.XXXXXX)"
        export TMPDIR="$TEST_TMP"
        note "TMPDIR=$TMPDIR (tmpfs: the tests' scratch)"
    else
        note "/dev/shm has ${shm_free_kb:-0} KiB free (< $TEST_TMP_SHM_KB_MIN): the tests' scratch stays in ${TMPDIR:-/tmp}"
    fi
fi

run_stage() {
    local name=$1 t0=$SECONDS
    shift
    banner "$name"
    printf '+ %s\n' "$*"
    # Keep a copy of every stage's output so the totals can be summed at the end.
    "$@" 2>&1 | tee -a "$TEST_LOG"
    printf -- '---- %s: ok (%ds)\n' "$name" $((SECONDS - t0))
}

# Sums the test counts of every runner output in $TEST_LOG (cargo test's "test result"
# lines and nextest's "Summary" line) into one closing line: "Tests: N passed, M failed".
test_totals() {
    [ -s "$TEST_LOG" ] || return 0
    python3 - "$TEST_LOG" <<'PY'
import re, sys
text = open(sys.argv[1], errors="replace").read()
passed = failed = 0
for m in re.finditer(r"test result: \w+\. (\d+) passed; (\d+) failed", text):
    passed += int(m.group(1)); failed += int(m.group(2))
for m in re.finditer(r"Summary \[[^\]]*\]\s+\d+ tests? run: (\d+) passed(?:[^\n]*?(\d+) failed)?", text):
    passed += int(m.group(1)); failed += int(m.group(2) or 0)
print(f"Tests: {passed} passed, {failed} failed")
PY
}

# rustdoc reads RUSTDOCFLAGS, not RUSTFLAGS: without it, doctests of a madsim build would
# compile the library without cfg(madsim) against dependencies built with it.
with_madsim() { RUSTFLAGS="--cfg madsim" RUSTDOCFLAGS="--cfg madsim" CARGO_TARGET_DIR=target/sim "$@"; }

if [ "${DLOCK_SKIP_LINT:-0}" = "1" ]; then
    note "DLOCK_SKIP_LINT=1: skipping fmt and clippy"
else
    run_stage "fmt" cargo fmt --all -- --check
    run_stage "clippy" cargo clippy --workspace --all-targets --locked -- -D warnings
fi

# The book (docs/book.toml, docs/SUMMARY.md): mdbook, pinned, built from crates.io into
# target/tools the first time (only the search feature, no `serve`/`watch`; an unoptimised
# build: about 100 s on 2 cores against about 210 s optimised, and the book it builds is the
# same in 4 s instead of 1), then reused while its version matches. The build fails on a chapter
# SUMMARY.md names that does not exist, or an {{#include}} it cannot read; links are checked
# by the test stage (docs_links.rs), since mdbook checks none.
MDBOOK_VERSION=0.4.52
MDBOOK_ROOT="$ROOT/target/tools"
book() {
    local have=""
    [ -x "$MDBOOK_ROOT/bin/mdbook" ] && have="$("$MDBOOK_ROOT/bin/mdbook" --version)"
    if [ "$have" != "mdbook v$MDBOOK_VERSION" ]; then
        cargo install mdbook --locked --debug --version "$MDBOOK_VERSION" --no-default-features \
            --features search --root "$MDBOOK_ROOT" || return 1
    fi
    "$MDBOOK_ROOT/bin/mdbook" build docs && note "the book is in target/book/index.html"
}
if [ "${DLOCK_SKIP_BOOK:-0}" = "1" ]; then
    note "DLOCK_SKIP_BOOK=1: skipping the book"
else
    run_stage "book" book
fi

# The release binaries, in stages of their own so their cost is timed apart: the release
# check (crates/dlock/tests/release_build.rs) searches `dlock` for the simulation's
# test-only switches (docs/simulation.md "Planted bugs"): it is handed this very binary
# (DLOCK_RELEASE_BIN), the one `cargo build --release -p dlock` ships, so it never builds
# again under the test runner (whose environment was seen to make cargo rebuild it, 4–9
# minutes). `dlock-real` drives the real run; it is built apart, so `dlock`'s dependencies
# keep the features of the production build.
# The test-only build first (docs/real-runs.md "Planted bugs on real processes"): `dlock`
# with the `planted` feature, which reads DLOCK_PLANTED_BUG, copied aside to
# target/planted/dlock (then renamed into place, so a binary still running keeps its file).
# The production build right after takes target/release/dlock back.
planted_build() {
    cargo build --release --locked -p dlock --features planted \
        && mkdir -p target/planted \
        && cp target/release/dlock target/planted/dlock.new \
        && mv -f target/planted/dlock.new target/planted/dlock
}
if [ "${DLOCK_SKIP_REAL_RUN:-0}" != "1" ]; then
    run_stage "release build (planted)" planted_build
fi
run_stage "release build" cargo build --release --locked -p dlock
export DLOCK_RELEASE_BIN="$ROOT/target/release/dlock"
run_stage "release build (dlock-real)" cargo build --release --locked -p dlock-real

# The real run (docs/real-runs.md): dlock-real starts deploy/local/up.sh's cluster (its own
# 3-member etcd and PostgreSQL in a temp dir, every dlock process with its trace file and a
# fake wall clock), prints the plan drawn from the seed, creates 20 payouts/s while it plays
# it (kill -9, SIGSTOP, partitions and lossy links, wall-clock steps, PostgreSQL and etcd
# quorum unavailable, etcd leader loss, a hostile rail), heals, lets the cluster settle and
# judges it with the simulation's oracle. Then every planted bug a real run can plant runs
# at its pinned seed (`dlock-real plants`) and must be caught: the judgement can fail on a
# real history.
real_run() {
    local report
    report="$(mktemp -t dlock-real-run.XXXXXX)"
    target/release/dlock-real run --seed "${DLOCK_REAL_SEED:-1}" --duration "${DLOCK_REAL_DURATION:-60s}" \
        | tee "$report"
    [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
    # The lock-set's control (no fence) must lose elements: its check can fail.
    if ! grep -Eq 'control without the fence [0-9]+ acknowledged, [1-9][0-9]* lost' "$report"; then
        note "real run: the lock-set control lost nothing; the run proves nothing about the fence"
        return 1
    fi
    # Every planted bug a real run plants, each at its pinned seed, must be caught: the
    # fencing bugs through the unsafe-test profile's switches, the others in the test-only
    # build. `plants` exits 0 only when each one was.
    local out rc=0
    out=$(target/release/dlock-real plants 2>&1) || rc=$?
    printf '%s\n' "$out" | sed -n '/^planted bugs on real processes:/,$p'
    if [ "$rc" -ne 0 ] || ! grep -q 'fencing-off-both .* caught$' <<<"$out"; then
        printf '%s\n' "$out" | grep -E '^(== plant|correctness|liveness|verdict|planted bug)' | head -n 60
        note "planted real runs: expected every planted bug caught, got exit $rc"
        return 1
    fi
    note "planted real runs: the oracle caught every planted bug, as it must"
}
if [ "${DLOCK_SKIP_REAL_RUN:-0}" = "1" ]; then
    note "DLOCK_SKIP_REAL_RUN=1: skipping the real run"
else
    run_stage "real run" real_run
fi

if cargo nextest --version >/dev/null 2>&1; then
    run_stage "tests (nextest)" cargo nextest run --workspace --locked --no-fail-fast "$@"
    if [ "$#" -eq 0 ]; then
        # nextest does not run doctests.
        run_stage "doctests" cargo test --workspace --locked --doc
    fi
else
    note "cargo-nextest not found: falling back to cargo test"
    run_stage "tests (cargo test)" cargo test --workspace --locked "$@"
fi

# The alert rules parse, and fire (and stay quiet) exactly as their unit tests say.
promtool_rules() {
    promtool check rules deploy/observability/prometheus/alerts.yml \
        && (cd deploy/observability/prometheus && promtool test rules alerts_test.yml)
}
run_stage "promtool" promtool_rules

# The deploy manifests (deploy/README.md "Validating the manifests"): every file in
# deploy/k8s/ against the Kubernetes 1.31 JSON schemas that kubernetes-validate bundles
# (strict: an unknown field fails), and deploy/compose/compose.yaml's structure
# (scripts/check-compose.py; no compose plugin here). The checker is pinned
# (deploy/validate-requirements.txt) in a venv under target/; once installed it needs no
# network (pip finds every pin satisfied and asks no index).
DEPLOY_VENV="$ROOT/target/deploy-venv"
deploy_manifests() {
    { [ -x "$DEPLOY_VENV/bin/pip" ] || python3 -m venv "$DEPLOY_VENV"; } \
        && "$DEPLOY_VENV/bin/pip" install --quiet --disable-pip-version-check -r deploy/validate-requirements.txt \
        && "$DEPLOY_VENV/bin/kubernetes-validate" --strict --quiet -k 1.31.0 deploy/k8s/*.yaml \
        && note "deploy/k8s: $(ls deploy/k8s/*.yaml | wc -l) files valid against Kubernetes 1.31" \
        && "$DEPLOY_VENV/bin/python" scripts/check-compose.py deploy/compose/compose.yaml
}
run_stage "deploy manifests" deploy_manifests

# The HTTP contract, checked against the running services (C3-extensions E-16): every
# service started from the release binary on SQLite with credentials, its served document
# equal to docs/api/<service>.json, and schemathesis (pinned,
# deploy/api-check-requirements.txt, in target/api-check-venv) finding no 5xx, no status or
# content type outside the document and no body (errors: the envelope) outside its schema.
API_VENV="$ROOT/target/api-check-venv"
api_conformance() {
    { [ -x "$API_VENV/bin/pip" ] || python3 -m venv "$API_VENV"; } \
        && "$API_VENV/bin/pip" install --quiet --disable-pip-version-check -r deploy/api-check-requirements.txt \
        && scripts/check-api.sh "$ROOT/target/release/dlock" "$API_VENV/bin/st"
}
run_stage "API conformance" api_conformance

# Coverage-guided fuzzing on stable (fuzz/README.md "How it runs on stable"): these are the
# flags `cargo fuzz build --sanitizer none` passes, none of them nightly-only. `--target`
# keeps them off build scripts and proc macros, which must not link against libFuzzer.
FUZZ_RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares"
FUZZ_SECONDS_PER_TARGET="${FUZZ_SECONDS_PER_TARGET:-5}"
# Longest one input may run before libFuzzer calls it a hang (a failure).
FUZZ_INPUT_TIMEOUT_SECONDS=10
# Memory bound of one fuzzing process (libFuzzer's -rss_limit_mb).
FUZZ_RSS_LIMIT_MB=2048

fuzz_all() {
    local host targets t
    host="$(rustc -vV | sed -n 's/^host: //p')"
    note "toolchain: $(rustc --version) on $host"
    RUSTFLAGS="$FUZZ_RUSTFLAGS" CARGO_TARGET_DIR="$ROOT/fuzz/target" \
        cargo build --manifest-path fuzz/Cargo.toml --locked --release --bins --target "$host"
    targets="$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^dlock-fuzz$')"
    [ -n "$targets" ] || die "no fuzz targets found in fuzz/Cargo.toml"
    for t in $targets; do
        [ -n "$(ls -A "fuzz/corpus/$t" 2>/dev/null)" ] || die "fuzz target $t has no seed corpus in fuzz/corpus/$t"
        # New inputs go to the first (scratch, git-ignored) corpus dir; the seeds stay as committed.
        mkdir -p "fuzz/target/corpus/$t" "fuzz/artifacts/$t"
        note "fuzzing $t for ${FUZZ_SECONDS_PER_TARGET}s"
        "fuzz/target/$host/release/$t" -max_total_time="$FUZZ_SECONDS_PER_TARGET" \
            -timeout="$FUZZ_INPUT_TIMEOUT_SECONDS" -rss_limit_mb="$FUZZ_RSS_LIMIT_MB" \
            -print_final_stats=1 -artifact_prefix="fuzz/artifacts/$t/" \
            "fuzz/target/corpus/$t" "fuzz/corpus/$t" \
            || die "fuzz target $t failed: the input is in fuzz/artifacts/$t/ (replay: fuzz/README.md)"
    done
}

if [ "${DLOCK_SKIP_FUZZ:-0}" = "1" ]; then
    note "DLOCK_SKIP_FUZZ=1: skipping the fuzz stage"
else
    run_stage "fuzz" fuzz_all
fi

if [ "${DLOCK_SKIP_SIM:-0}" = "1" ]; then
    note "DLOCK_SKIP_SIM=1: skipping the madsim stages"
else
    export MADSIM_TEST_NUM="${MADSIM_TEST_NUM:-32}"
    note "MADSIM_TEST_NUM=$MADSIM_TEST_NUM seeds per madsim test"
    if [ "${DLOCK_SKIP_LINT:-0}" != "1" ]; then
        run_stage "clippy (madsim)" with_madsim cargo clippy --workspace --all-targets --locked -- -D warnings
    fi
    # The `sim` profile (optimised, debug assertions on): the swarm campaign of
    # sim/tests/campaign.rs (2 000 seeds by default, DLOCK_SIM_SEEDS) needs optimised code to
    # fit the stage's budget (docs/simulation.md "Speed").
    # The scenarios' trace snapshots (sim/tests/snapshots.rs) are checked strictly, as under
    # CI=true whoever runs this: a changed or missing snapshot fails, nothing is written
    # (INSTA_UPDATE=no), and no insta config can force a pass. Accepting a change is a
    # developer's step (docs/simulation.md "Snapshots").
    run_stage "tests (madsim)" with_madsim env INSTA_UPDATE=no INSTA_FORCE_PASS=0 \
        cargo test --workspace --locked --profile sim
fi
