#!/usr/bin/env bash
# deploy/local/fault-run.sh — the real-world twin of the simulation's campaign: a workload
# through the cluster of deploy/local/up.sh (release binaries, a 3-member etcd, PostgreSQL,
# executor-3 in its own network namespace) while faults are injected, then a judgement.
#
# Workload: --payouts (default 2000) payouts over --accounts (40) accounts, arriving
# evenly over --seconds (70), through a chaotic rail (2 % of calls fail: half 5xx, half
# held 3 s then dropped, i.e. RAIL_AMBIGUOUS) and executors that stall 2 s, past their
# 1.5 s lease, before 2 % of their fenced writes.
# Faults, one after the other while payouts arrive (offsets from the first payout):
#   F1  +6 s   kill -9 the etcd leader (its supervisor restarts it 3 s later)
#   F2  +16 s  kill -9 lock-server-2 (executor-2's lock server; restarted 3 s later)
#   F3  +26 s  kill -9 rail-proxy-1 (executor-1's proxy; restarted 3 s later)
#   F4  +36 s  SIGSTOP executor-1 for 5 s (past its 1.5 s lease), then SIGCONT
#   F5  +48 s  cut executor-3 off from both lock servers for 8 s: inside its namespace
#              the route to the lock servers' address goes to a next hop nobody answers
#              (packets vanish: timeouts, not refusals); payment and proxy stay reachable
# Then it waits for every payout to settle, runs `dlock reconcile --json`, prints the
# table of faults (fault, target, start, end, effect seen) and the judgement. Exit 0 only
# if: the reconciler exits 0 (clean), no payout has more than one rail call (the
# rail-stub's record and the reconciler's report), the rail paid nothing twice, every
# payout is terminal or quarantined (payment-resource API), all payouts exist.
#
#   --planted   the judgement must catch a double payment: profile unsafe-test, fencing
#               off at the payment-resource and the proxy, the duplicate guard off, every
#               submission preceded by a stall past the lease, executor-1 SIGSTOPped
#               (F4 only); 30 payouts over 6 accounts. This run is expected to FAIL (exit 1) with
#               "DOUBLE PAYMENT" among the violations (scripts/test.sh checks that).
#   --keep      keep the run dir (logs, data) and print where.
#   --payouts N --accounts N --seconds S   the workload's size.
# Needs root (network namespace) and what deploy/local/up.sh needs.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

PAYOUTS=2000
ACCOUNTS=40
SECONDS_SEED=70
PLANTED=0
KEEP=()
while [ $# -gt 0 ]; do
    case "$1" in
        --payouts) PAYOUTS=$2; shift 2 ;;
        --accounts) ACCOUNTS=$2; shift 2 ;;
        --seconds) SECONDS_SEED=$2; shift 2 ;;
        --planted) PLANTED=1; shift ;;
        --keep) KEEP=(--keep); shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "fault-run.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
done

say() { printf 'fault-run: %s\n' "$*"; }
die() { printf 'fault-run: error: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (the partition uses a network namespace)"

# Chaos and budgets (the same values as `dlock demo`'s: crates/dlock/src/demo.rs).
LEASE_MS=1500
STALL_MS=2000
export DLOCK_RAIL_STUB_FAILURE_RATE=0.02
export DLOCK_RAIL_STUB_DROP_HOLD_MS=3000
export DLOCK_RAIL_STUB_DUPLICATE_ACK_RATE=1
export DLOCK_RAIL_PROXY_READ_TIMEOUT_MS=2000
export DLOCK_EXECUTOR_SUBMIT_READ_TIMEOUT_MS=4000
export DLOCK_EXECUTOR_LOCK_TTL_MS=$LEASE_MS
export DLOCK_EXECUTOR_CHAOS_PAUSE_RATE=0.02
export DLOCK_EXECUTOR_CHAOS_PAUSE_MS=$STALL_MS
export DLOCK_EXECUTOR_CONCURRENCY=8
export DLOCK_EXECUTOR_POLL_INTERVAL_MS=50
export DLOCK_LOG="${DLOCK_LOG:-info}"
PROFILE=production
SETTLE_S=150
if [ "$PLANTED" = 1 ]; then
    PROFILE=unsafe-test
    export DLOCK_PAYMENT_FENCING_ENABLED=false
    export DLOCK_RAIL_PROXY_FENCING_ENABLED=false
    export DLOCK_RAIL_PROXY_DUPLICATE_GUARD_ENABLED=false
    export DLOCK_EXECUTOR_CHAOS_PAUSE_RATE=1
    export DLOCK_EXECUTOR_CHAOS_PAUSE_HOPS=submit
    export DLOCK_RAIL_STUB_FAILURE_RATE=0
    PAYOUTS=30
    ACCOUNTS=6
    SECONDS_SEED=3
    SETTLE_S=60
fi

# ------------------------------------------------------------------------------------
# The cluster.
# ------------------------------------------------------------------------------------
T_ALL=$SECONDS
DIR="$(mktemp -d /tmp/dlock-fault-run.XXXXXX)"
rmdir "$DIR"   # up.sh creates it (empty dirs only)
UP_PID=""
SEED_PID=""
cleanup() {
    local rc=$?
    set +e
    [ -n "$SEED_PID" ] && kill "$SEED_PID" 2>/dev/null
    if [ -n "$UP_PID" ] && kill -0 "$UP_PID" 2>/dev/null; then
        kill -TERM "$UP_PID"
        wait "$UP_PID" 2>/dev/null
    fi
    say "total wall time $((SECONDS - T_ALL)) s"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "starting the cluster (deploy/local/up.sh --netns, profile $PROFILE) in $DIR"
"$HERE/up.sh" --netns --dir "$DIR" --profile "$PROFILE" --reconcile-interval 20 "${KEEP[@]}" >"$DIR.up.log" 2>&1 &
UP_PID=$!
deadline=$((SECONDS + 120))
until [ -e "$DIR/cluster.env" ]; do
    kill -0 "$UP_PID" 2>/dev/null || { cat "$DIR.up.log" >&2; rm -f "$DIR.up.log"; die "up.sh failed"; }
    [ $SECONDS -lt $deadline ] || { cat "$DIR.up.log" >&2; die "the cluster was not up after 120 s"; }
    sleep 0.2
done
# shellcheck source=/dev/null
source "$DIR/cluster.env"
mv "$DIR.up.log" "$LOGS/up.log"
sed -n '/process  /,/^up.sh: restarts/p' "$LOGS/up.log"
W() { python3 "$HERE/workload.py" "$@"; }
CJ="$DIR/cluster.json"
T_UP=$((SECONDS - T_ALL))
say "cluster up in $T_UP s"

# ------------------------------------------------------------------------------------
# The workload, in the background.
# ------------------------------------------------------------------------------------
ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
T0=$(ms)
off() { local d=$(($(ms) - T0)); printf '%d.%d' $((d / 1000)) $(((d % 1000) / 100)); }
at() { # seconds since T0
    local wait_ms=$(($1 * 1000 - ($(ms) - T0)))
    [ $wait_ms -le 0 ] || sleep "$((wait_ms / 1000)).$(printf '%03d' $((wait_ms % 1000)))"
}
W seed "$CJ" --payouts "$PAYOUTS" --accounts "$ACCOUNTS" --seconds "$SECONDS_SEED" \
    --progress "$RUN/seeded" >"$LOGS/workload.log" 2>&1 &
SEED_PID=$!
say "workload: $PAYOUTS payouts over $ACCOUNTS accounts arriving over ${SECONDS_SEED} s; rail failure rate" \
    "$DLOCK_RAIL_STUB_FAILURE_RATE, stalls of $STALL_MS ms (lease $LEASE_MS ms) at rate $DLOCK_EXECUTOR_CHAOS_PAUSE_RATE"

pid_of() { cat "$RUN/$1.pid"; }
ready() { curl -fsS --max-time 1 "$1/health/ready" >/dev/null 2>&1; }
poll() { # seconds cmd...: 0 once cmd succeeds, 1 at the deadline
    local deadline=$(($(ms) + $1 * 1000))
    shift
    until "$@"; do
        [ "$(ms)" -lt $deadline ] || return 1
        sleep 0.1
    done
}
# A fault's row: name, target, start, end, effect.
ROWS=()
row() { ROWS+=("$1|$2|$3|$4|$5"); say "$1 on $2: +$3 s .. +$4 s: $5"; }
# Counter deltas around a fault: snapshot before, and after its end + this long.
MEASURE_AFTER_S=3
# About how long one snapshot takes (python start, six /metrics pages).
SNAP_MS=400
snap() { W snap "$CJ" "$RUN/snap-$1.json"; }
delta() { local a=$1 b=$2; shift 2; W delta "$CJ" "$RUN/snap-$a.json" "$RUN/snap-$b.json" "$@"; }

# How long after the fault ended executor-N posts a payout again ("" if not in 20 s).
RECOVERY_S_MAX=20
recovered() { # executor-index end-ms
    local ex=$1 t_end=$2 base now
    base=$(W posted "$CJ" "$ex")
    posting() { now=$(W posted "$CJ" "$ex"); [ "$now" -gt "$base" ]; }
    if poll "$RECOVERY_S_MAX" posting; then
        local d=$(($(ms) - t_end))
        echo "executor-$ex posting again $((d / 1000)).$(((d % 1000) / 100)) s after"
    else
        echo "executor-$ex NOT posting again ${RECOVERY_S_MAX} s after"
    fi
}

restarted_and_ready() { # name old-pid url
    local p
    p=$(pid_of "$1")
    [ "$p" != "$2" ] && ready "$3"
}

kill9_service() { # fault name url executor-index
    local f=$1 name=$2 url=$3 ex=$4 old start end
    snap "$f-before"
    old=$(pid_of "$name")
    start=$(off)
    kill -9 "$old"
    poll 30 restarted_and_ready "$name" "$old" "$url" || { row "$f kill -9" "$name" "$start" "$(off)" "NOT back after 30 s"; return; }
    end=$(off)
    local t_end rec
    t_end=$(ms)
    rec=$(recovered "$ex" "$t_end")
    sleep "$MEASURE_AFTER_S"
    snap "$f-after"
    row "$f kill -9" "$name" "$start" "$end" \
        "pid $old killed, supervisor restarted it (pid $(pid_of "$name")), ready again; $rec; $(delta "$f-before" "$f-after" --executor "$ex")"
}

# Requests the lock servers answered 503 because etcd failed them (their logs).
store_errors() { cat "$LOGS"/lock-server-*.log | grep -c 'store unavailable' || true; }

fault_etcd_leader() {
    local leader old start elected="" end new errs0
    snap F1-before
    errs0=$(store_errors)
    leader=$(W etcd-leader "$CJ")
    [ -n "$leader" ] || { row "F1 kill -9 etcd leader" "?" "$(off)" "$(off)" "no leader found"; return; }
    old=$(pid_of "$leader")
    start=$(off)
    kill -9 "$old"
    new_leader() { new=$(W etcd-leader "$CJ"); [ -n "$new" ] && [ "$new" != "$leader" ]; }
    if poll 20 new_leader; then elected="$new elected leader at +$(off) s"; else elected="no new leader in 20 s"; fi
    local i=${leader#etcd-}
    member_back() { [ "$(pid_of "$leader")" != "$old" ] && curl -fsS --max-time 1 "${ETCD_URLS[$((i - 1))]}/health" 2>/dev/null | grep -q '"health":[ ]*"true"'; }
    poll 30 member_back || true
    end=$(off)
    sleep "$MEASURE_AFTER_S"
    snap F1-after
    row "F1 kill -9 etcd leader" "$leader" "$start" "$end" \
        "$elected; $leader restarted by its supervisor and healthy; lock servers answered $(($(store_errors) - errs0)) requests 503 (etcd unavailable); $(delta F1-before F1-after --executor 1 --executor 2 --executor 3)"
}

fault_sigstop() { # executor-index seconds
    local ex=$1 secs=$2 name="executor-$1" p start end
    snap F4-before
    p=$(pid_of "$name")
    start=$(off)
    kill -STOP "$p"
    sleep "$secs"
    kill -CONT "$p"
    end=$(off)
    local rec
    rec=$(recovered "$ex" "$(ms)")
    sleep "$MEASURE_AFTER_S"
    snap F4-after
    row "F4 SIGSTOP ${secs}s" "$name" "$start" "$end" \
        "stopped ${secs} s > lease ${LEASE_MS} ms, then SIGCONT; $rec; $(delta F4-before F4-after --executor "$ex")"
}

fault_partition() { # executor-index seconds
    local ex=$1 secs=$2 start end seen t_cut
    snap F5-before
    start=$(off)
    t_cut=$(ms)
    ip -n "$NETNS" route replace "$LOCK_IP/32" via "$NETNS_VOID_IP" dev "$NETNS_DEV"
    # The cut holds: from the namespace, the lock server no longer answers.
    local lock_seen=unreachable pay_seen=reachable
    ns_get() { ip netns exec "$NETNS" curl -fsS --max-time 1 "$1/health/live" >/dev/null 2>&1; }
    if ns_get "${LOCK_URLS[0]}" || ns_get "${LOCK_URLS[1]}"; then lock_seen="STILL REACHABLE"; fi
    ns_get "$PAYMENT_URL" && ns_get "${PROXY_URLS[1]}" || pay_seen="UNREACHABLE"
    seen="from the namespace: lock servers $lock_seen, payment and proxy $pay_seen"
    # The cut lasts $secs from its start, the checks above and the snapshot (about
    # SNAP_MS) below included.
    local left_ms=$((t_cut + secs * 1000 - SNAP_MS - $(ms)))
    [ $left_ms -le 0 ] || sleep "$((left_ms / 1000)).$(printf '%03d' $((left_ms % 1000)))"
    snap F5-cut
    ip -n "$NETNS" route del "$LOCK_IP/32"
    end=$(off)
    local rec
    rec=$(recovered "$ex" "$(ms)")
    sleep "$MEASURE_AFTER_S"
    snap F5-after
    local back="lock server reachable again"
    ip netns exec "$NETNS" curl -fsS --max-time 2 "${LOCK_URLS[0]}/health/live" >/dev/null 2>&1 || back="lock server STILL unreachable"
    row "F5 partition ${secs}s" "executor-$ex" "$start" "$end" \
        "$seen; during the cut: $(delta F5-before F5-cut --executor "$ex"); $back; $rec; after: $(delta F5-cut F5-after --executor "$ex")"
}

if [ "$PLANTED" = 1 ]; then
    at 1
    fault_sigstop 1 4
else
    at 6
    fault_etcd_leader
    at 16
    kill9_service F2 lock-server-2 "${LOCK_URLS[1]}" 2
    at 26
    kill9_service F3 rail-proxy-1 "${PROXY_URLS[0]}" 1
    at 36
    fault_sigstop 1 5
    at 48
    fault_partition 3 8
fi

# ------------------------------------------------------------------------------------
# Settle, reconcile, judge.
# ------------------------------------------------------------------------------------
SEED_RC=0
wait "$SEED_PID" || SEED_RC=$?
SEED_PID=""
cat "$LOGS/workload.log"
[ "$SEED_RC" -eq 0 ] || die "the workload failed (exit $SEED_RC)"
T_SEEDED=$(off)
say "all $PAYOUTS payouts created by +$T_SEEDED s; waiting for every payout to settle (at most $SETTLE_S s)"
SETTLED=0
W settle "$CJ" --seconds "$SETTLE_S" >"$RUN/settled.json" || SETTLED=1
T_SETTLED=$(off)
say "settled by +$T_SETTLED s: $(cat "$RUN/settled.json")"
RC_RECONCILE=0
"$DLOCK" reconcile --database-url "$PAYDB_URL" --rail-url "$STUB_URL" --json >"$RUN/reconcile.json" 2>"$LOGS/reconcile-final.log" \
    || RC_RECONCILE=$?

echo
echo "faults injected (offsets from the first payout, seconds)"
printf '  %-24s %-16s %7s %7s  %s\n' fault target start end "effect seen"
for r in "${ROWS[@]}"; do
    IFS='|' read -r f t s e x <<<"$r"
    printf '  %-24s %-16s %7s %7s  %s\n' "$f" "$t" "+$s" "+$e" "$x"
done
echo "supervisor restarts (run/events.log):"
grep ' exit ' "$RUN/events.log" | sed 's/^/  /' || echo "  none"
echo
RC=0
W judge "$CJ" --reconcile-json "$RUN/reconcile.json" --reconcile-rc "$RC_RECONCILE" --expect "$PAYOUTS" || RC=1
[ "$SETTLED" -eq 0 ] || { echo "  - payouts still in flight after $SETTLE_S s"; RC=1; }
echo "  timings: cluster up in $T_UP s; payouts created by +$T_SEEDED s, settled by +$T_SETTLED s"
if [ "$RC" -eq 0 ]; then
    say "PASS"
else
    if [ "${#KEEP[@]}" -gt 0 ]; then
        say "FAIL (kept: the reconciler report is $RUN/reconcile.json, the logs are in $LOGS)"
    else
        say "FAIL (rerun with --keep to keep the logs and the reconciler report)"
    fi
fi
exit "$RC"
