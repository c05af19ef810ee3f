#!/usr/bin/env python3
"""deploy/local/workload.py: the HTTP side of deploy/local/fault-run.sh (stdlib only).

Subcommands (CLUSTER is the cluster.json that deploy/local/up.sh writes):
  seed CLUSTER --payouts N --accounts A --seconds S --progress FILE
      opens A accounts (each funded for ~95 % of its payouts, so a few end FAILED for
      funds) and creates N payouts through the payment-resource, spread evenly over S
      seconds (arrivals, not a batch). Every write carries an idempotency key and is
      retried with the same key on a connection failure or a 5xx: never a duplicate.
  states CLUSTER           payouts per state (payment-resource P1 listing), JSON.
  settle CLUSTER --seconds S
      polls the states until no payout is PENDING/CLAIMED/SUBMITTED/RAIL_ACKED, or S s.
  metrics URL              the counters of one /metrics page, JSON {name{labels}: value}.
  etcd-leader CLUSTER      the name of the etcd leader among the reachable members.
  posted CLUSTER N         executor-N's posted payouts so far (-1: no answer).
  snap CLUSTER OUT         every reachable /metrics page (payment, proxies, executors).
  delta CLUSTER BEFORE AFTER [--executor N]...
      what two snapshots differ by: executor N's payout outcomes, fenced-out writes.
  judge CLUSTER --reconcile-json FILE --reconcile-rc RC --expect N
      the verdict: exit 0 only if the reconciler exited 0 (clean), no payout has more
      than one rail call (the rail-stub's own record, GET /calls, and the reconciler's
      report), every payout is terminal or quarantined (the payment-resource API), and
      exactly N payouts exist. Prints every violation.
"""
import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request

UNSETTLED = ("PENDING", "CLAIMED", "SUBMITTED", "RAIL_ACKED")
TERMINAL = ("POSTED", "FAILED", "ABANDONED")
QUARANTINED = ("RAIL_AMBIGUOUS",)
STATES = UNSETTLED + TERMINAL + QUARANTINED
PAGE_LIMIT_MAX = 500
# One HTTP request's budget, in seconds.
REQUEST_TIMEOUT_S = 10
# How long a seeding write is retried (connection failure, 5xx) before the run fails.
WRITE_RETRY_S_MAX = 60


def load(path):
    with open(path) as f:
        c = json.load(f)
    for key in ("reader_token_file", "operator_token_file"):
        with open(c[key]) as t:
            c[key.replace("_file", "")] = t.read().strip()
    return c


def call(method, url, token=None, body=None, headers=None, timeout=REQUEST_TIMEOUT_S):
    """(status, parsed JSON or text); raises OSError when no answer came."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, raw.decode(errors="replace")


def write(c, path, key, body):
    """A seeding write, retried with the same idempotency key until it answers < 500."""
    deadline = time.monotonic() + WRITE_RETRY_S_MAX
    while True:
        try:
            status, out = call("POST", c["payment_url"] + path, c["operator_token"], body,
                               {"X-Owner-Id": "fault-run", "X-Idempotency-Key": key})
            if status < 500:
                if status >= 300:
                    raise SystemExit(f"workload: POST {path} ({key}) answered {status}: {out}")
                return out
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"workload: POST {path} ({key}) got no answer for {WRITE_RETRY_S_MAX}s")
        time.sleep(0.2)


def amount(i):
    return 1_000 + (i % 97) * 10


def seed(c, a):
    per_account = [0] * a.accounts
    for i in range(a.payouts):
        per_account[i % a.accounts] += amount(i)
    for n, total in enumerate(per_account):
        write(c, "/v1/accounts", f"open-{n}",
              {"accountId": f"acct-{n}", "currency": "EUR", "openingBalanceMinor": total * 95 // 100})
    t0 = time.monotonic()
    for i in range(a.payouts):
        due = t0 + a.seconds * i / a.payouts
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        write(c, "/v1/payouts", f"create-{i}",
              {"accountId": f"acct-{i % a.accounts}", "amountMinor": amount(i), "currency": "EUR",
               "beneficiaryRef": f"ben-{i}"})
        if a.progress and (i % 50 == 49 or i == a.payouts - 1):
            with open(a.progress + ".tmp", "w") as f:
                f.write(f"{i + 1}\n")
            os.replace(a.progress + ".tmp", a.progress)
    print(f"workload: {a.payouts} payouts over {a.accounts} accounts created in "
          f"{time.monotonic() - t0:.1f}s")


def list_all(c, state):
    items, cursor = [], None
    while True:
        q = f"?state={state}&limit={PAGE_LIMIT_MAX}" + (f"&cursor={cursor}" if cursor else "")
        status, out = call("GET", c["payment_url"] + "/v1/payouts" + q, c["reader_token"])
        if status != 200:
            raise SystemExit(f"workload: listing {state} answered {status}: {out}")
        items += out["items"]
        cursor = out.get("nextCursor")
        if not cursor:
            return items


def states(c):
    return {s: len(list_all(c, s)) for s in STATES}


def settle(c, a):
    deadline = time.monotonic() + a.seconds
    while True:
        try:
            counts = states(c)
        except (OSError, SystemExit) as e:
            counts = None
            print(f"workload: settle: {e}", file=sys.stderr)
        if counts is not None:
            open_ = sum(counts[s] for s in UNSETTLED)
            if open_ == 0:
                print(json.dumps(counts))
                return 0
        if time.monotonic() > deadline:
            print(json.dumps(counts))
            return 1
        time.sleep(1)


def metrics(url, token):
    status, out = call("GET", url + "/metrics", token, timeout=3)
    if status != 200 or not isinstance(out, str):
        # A page of numbers parses as JSON when it is one number; re-read as text.
        if status == 200:
            out = str(out)
        else:
            raise SystemExit(f"workload: {url}/metrics answered {status}")
    vals = {}
    for line in out.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        try:
            vals[name] = float(value)
        except ValueError:
            pass
    return vals


def snap(c, out):
    """Every reachable /metrics page of the cluster: {process: {series: value}}."""
    pages = {}
    urls = [("payment-resource", c["payment_url"])]
    urls += [(f"rail-proxy-{i + 1}", u) for i, u in enumerate(c["proxy_urls"])]
    urls += [(f"executor-{i + 1}", u) for i, u in enumerate(c["exec_urls"])]
    for name, url in urls:
        try:
            pages[name] = metrics(url, c["reader_token"])
        except (OSError, SystemExit):
            pages[name] = None
    with open(out, "w") as f:
        json.dump(pages, f)


def delta(a):
    """What changed between two snapshots: the executor's outcomes and the fenced-out
    writes of the whole cluster, as one line ("-" if nothing)."""
    with open(a.before) as f:
        before = json.load(f)
    with open(a.after) as f:
        after = json.load(f)

    def diff(proc, prefix):
        b, n = before.get(proc) or {}, after.get(proc) or {}
        out = {}
        for k, v in n.items():
            if k.startswith(prefix):
                d = v - b.get(k, 0) if v >= b.get(k, 0) else v  # a restart resets counters
                if d:
                    label = k[len(prefix):].split('"')[1] if '"' in k else k
                    out[label] = out.get(label, 0) + int(d)
        return out

    parts = []
    for e in a.executor or []:
        d = diff(f"executor-{e}", "payout_execute_total")
        if d:
            parts.append(f"executor-{e} " + " ".join(f"{k}+{v}" for k, v in sorted(d.items())))
    fenced = {}
    for proc in ("payment-resource", "rail-proxy-1", "rail-proxy-2"):
        for k, v in diff(proc, "lock_fenced_out_total").items():
            fenced[k] = fenced.get(k, 0) + v
    if fenced:
        parts.append("fenced-out " + " ".join(f"{k}+{v}" for k, v in sorted(fenced.items())))
    print("; ".join(parts) if parts else "-")


def etcd_leader(c):
    names = {}
    leader = None
    for url in c["etcd_urls"]:
        try:
            _, members = call("POST", url + "/v3/cluster/member/list", body={}, timeout=1)
            for m in members.get("members", []):
                names[m["ID"]] = m["name"]
            _, st = call("POST", url + "/v3/maintenance/status", body={}, timeout=1)
            if st.get("leader") and st["leader"] != "0":
                leader = st["leader"]
        except (OSError, AttributeError, KeyError):
            continue
    return names.get(leader, "") if leader else ""


def judge(c, a):
    violations = []
    with open(a.reconcile_json) as f:
        text = f.read()
    try:
        report = json.loads(text)
    except ValueError:
        report = None
        violations.append(f"the reconciler printed no JSON report (exit {a.reconcile_rc}): {text[:500]}")
    if a.reconcile_rc != 0:
        kinds = {}
        for f_ in (report or {}).get("findings", []):
            if f_.get("severity") == "incident":
                kinds[f_.get("kind")] = kinds.get(f_.get("kind"), 0) + 1
        violations.append(f"the reconciler exited {a.reconcile_rc}, not 0 (clean): incident findings {kinds}")
    max_rep = (report or {}).get("maxRailCallsPerPayout")
    if max_rep is not None and max_rep > 1:
        violations.append(f"the reconciler counts up to {max_rep} rail calls for one payout (at most 1 allowed)")
    if report is not None and not report.get("ledgerBalanced", False):
        violations.append("the reconciler finds the ledger unbalanced")

    status, log = call("GET", c["stub_url"] + "/calls", c["reader_token"])
    if status != 200:
        violations.append(f"the rail-stub's record (GET /calls) answered {status}")
        log = {"calls": []}
    per = {}
    paid = {}
    for call_ in log["calls"]:
        ref = call_["clientRef"]
        per[ref] = per.get(ref, 0) + 1
        if call_.get("paid"):
            paid[ref] = paid.get(ref, 0) + 1
    twice = sorted(ref for ref, n in paid.items() if n > 1)
    if twice:
        violations.append(f"the rail paid {len(twice)} payout(s) more than once (DOUBLE PAYMENT), e.g. {twice[0]}")
    multi = sorted((n, ref) for ref, n in per.items() if n > 1)
    if multi:
        violations.append(f"the rail-stub's record has {len(multi)} payout(s) called more than once, "
                          f"e.g. {multi[-1][1]} ({multi[-1][0]} calls)")

    counts = states(c)
    total = sum(counts.values())
    open_ = {s: counts[s] for s in UNSETTLED if counts[s]}
    if open_:
        violations.append(f"payouts neither terminal nor quarantined: {open_}")
    if total != a.expect:
        violations.append(f"{total} payouts in paydb, {a.expect} created")

    print("judgement")
    print(f"  payouts {total}: " + ", ".join(f"{s} {n}" for s, n in counts.items() if n))
    print(f"  rail calls {len(log['calls'])} for {len(per)} payouts; most for one payout: "
          f"{max(per.values()) if per else 0} (rail-stub record), {max_rep} (reconciler); "
          f"paid twice: {sum(1 for n in paid.values() if n > 1)}")
    if report:
        fo = report.get("fencedOut", {})
        amb = report.get("ambiguousByClass", {})
        print(f"  fenced-out rail submissions (paydb) {fo.get('rail')}; ambiguous by class {amb}; "
              f"duplicate submissions refused {report.get('duplicateSubmissions')}")
        print(f"  reconciler: exit {a.reconcile_rc}, incidents {report.get('incidents')}, "
              f"warnings {report.get('warnings')}, ledger balanced {report.get('ledgerBalanced')}")
    if violations:
        print("VIOLATIONS")
        for v in violations:
            print("  - " + v)
        return 1
    print("  every check holds: reconciler clean, at most one rail call per payout, "
          "every payout terminal or quarantined")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("seed")
    s.add_argument("cluster")
    s.add_argument("--payouts", type=int, required=True)
    s.add_argument("--accounts", type=int, required=True)
    s.add_argument("--seconds", type=float, required=True)
    s.add_argument("--progress")
    sub.add_parser("states").add_argument("cluster")
    s = sub.add_parser("settle")
    s.add_argument("cluster")
    s.add_argument("--seconds", type=float, required=True)
    s = sub.add_parser("metrics")
    s.add_argument("cluster")
    s.add_argument("url")
    sub.add_parser("etcd-leader").add_argument("cluster")
    s = sub.add_parser("posted")
    s.add_argument("cluster")
    s.add_argument("executor", type=int)
    s = sub.add_parser("snap")
    s.add_argument("cluster")
    s.add_argument("out")
    s = sub.add_parser("delta")
    s.add_argument("cluster")
    s.add_argument("before")
    s.add_argument("after")
    s.add_argument("--executor", type=int, action="append")
    s = sub.add_parser("judge")
    s.add_argument("cluster")
    s.add_argument("--reconcile-json", required=True)
    s.add_argument("--reconcile-rc", type=int, required=True)
    s.add_argument("--expect", type=int, required=True)
    a = p.parse_args()
    c = load(a.cluster)
    if a.cmd == "seed":
        seed(c, a)
    elif a.cmd == "states":
        print(json.dumps(states(c)))
    elif a.cmd == "settle":
        return settle(c, a)
    elif a.cmd == "metrics":
        print(json.dumps(metrics(a.url, c["reader_token"])))
    elif a.cmd == "posted":
        try:
            m = metrics(c["exec_urls"][a.executor - 1], c["reader_token"])
            print(int(m.get('payout_execute_total{outcome="posted"}', 0)))
        except (OSError, SystemExit):
            print(-1)
    elif a.cmd == "snap":
        snap(c, a.out)
    elif a.cmd == "delta":
        delta(a)
    elif a.cmd == "etcd-leader":
        print(etcd_leader(c))
    elif a.cmd == "judge":
        return judge(c, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
