#!/usr/bin/env python3
"""scripts/check-api-flow.py — the success paths random requests cannot reach.

Run by scripts/check-api.sh (stage "API conformance") with the services it started:
    check-api-flow.py DOCS_DIR LOCK_URL PAYMENT_URL PROXY_URL STUB_URL WORKER OPERATOR READER

Walks one payout through the real cluster (account, payout, session, acquire with a signed
grant, claim, submit, renew, post, release, revoke, close) plus the refusals on the way
(contended acquire, stale claim, duplicate submission, idempotency conflict), and holds
every answer to the serving service's document (docs/api/<service>.json): its status must
be listed for the operation, its content type must be JSON (or the metrics text), and its
body must validate against the documented schema (an error: the envelope, with a code
listed for that status). Exits 1 naming every answer that is not in its document.
Standard library and jsonschema_rs (a schemathesis dependency) only.
"""
import json
import re
import sys
import urllib.error
import urllib.request
import uuid

import jsonschema_rs

DOCS, LOCK, PAY, PROXY, STUB, WORKER, OPERATOR, READER = sys.argv[1:9]
# Longest wait for one answer.
REQUEST_SECONDS_MAX = 20

documents = {}
problems = []
answers = 0


def document(service):
    if service not in documents:
        with open(f"{DOCS}/{service}.json") as f:
            documents[service] = json.load(f)
    return documents[service]


def operation(doc, method, path):
    """The documented operation whose path template matches `path` (`{name}`: one segment)."""
    want = path.split("/")
    for template, item in doc["paths"].items():
        have = template.split("/")
        if len(have) == len(want) and all(
            (h.startswith("{") and w) or h == w for h, w in zip(have, want)
        ) and method.lower() in item:
            return template, item[method.lower()]
    return None, None


def check(service, method, path, status, content_type, body):
    global answers
    answers += 1
    doc = document(service)
    template, op = operation(doc, method, path.split("?")[0])
    what = f"{service}: {method} {path} -> {status}"
    if op is None:
        problems.append(f"{what}: no such operation in the document")
        return
    response = op["responses"].get(str(status))
    if response is None:
        problems.append(f"{what}: status {status} is not documented for {method} {template}")
        return
    content = response.get("content", {})
    if not content:
        if body:
            problems.append(f"{what}: documented without a body, answered {body[:80]!r}")
        return
    media = content_type.split(";")[0].strip()
    entry = next((v for k, v in content.items() if k.split(";")[0].strip() == media), None)
    if entry is None:
        problems.append(f"{what}: content type {content_type!r} is not documented")
        return
    if media != "application/json":
        return
    try:
        value = json.loads(body)
    except ValueError:
        problems.append(f"{what}: the body is not JSON")
        return
    schema = dict(entry["schema"])
    schema["components"] = doc["components"]
    errors = [e.message for e in jsonschema_rs.Draft202012Validator(schema).iter_errors(value)]
    if errors:
        problems.append(f"{what}: the body is outside its schema: {errors[:3]} in {json.dumps(value)[:300]}")


def call(service, base, method, path, token, headers=None, body=None):
    """Sends one request, checks the answer against the document, returns (status, json)."""
    h = {"Authorization": f"Bearer {token}"} if token else {}
    h.update(headers or {})
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    req = urllib.request.Request(f"http://{base}{path}", data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_SECONDS_MAX) as r:
            status, ctype, raw = r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        status, ctype, raw = e.code, e.headers.get("Content-Type", ""), e.read().decode()
    check(service, method, path, status, ctype, raw)
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, None


def expect(got, status, what):
    if got[0] != status:
        problems.append(f"{what}: expected {status}, got {got[0]} {json.dumps(got[1])[:300]}")
    return got[1] or {}


def key(label):
    return {"X-Idempotency-Key": f"{label}-{uuid.uuid4()}"}


def grant(lock_key, sid, owner, what):
    """Acquires `lock_key` for session `sid`: the fenced-write headers of the grant."""
    g = expect(call("lock-server", LOCK, "POST", f"/v1/locks/{lock_key}/acquire", WORKER, owner, {"sessionId": sid}), 200, what)
    fence = {"X-Fencing-Token": str(g.get("fencingToken", 1)), **owner}
    if g.get("fencingSignature"):
        fence["X-Fencing-Signature"] = g["fencingSignature"]
    return fence


def main():
    owner = {"X-Owner-Id": "api-flow-worker"}
    op_owner = {"X-Owner-Id": "api-flow-operator"}
    account = f"acct-{uuid.uuid4().hex[:12]}"
    lock_key = f"payout:{account}"

    # Reads and the meta routes of every service.
    for service, base, token in [("lock-server", LOCK, READER), ("payment-resource", PAY, READER),
                                 ("rail-proxy", PROXY, READER), ("rail-stub", STUB, None)]:
        for path in ["/health/live", "/health/ready", "/metrics", "/v1/openapi.json"]:
            expect(call(service, base, "GET", path, token), 200, f"{service} {path}")
    expect(call("lock-server", LOCK, "GET", "/v1/openapi.json", None), 401, "anonymous document")

    # Creates (operator), an idempotent replay and a conflict.
    body = {"accountId": account, "currency": "EUR", "openingBalanceMinor": 100_000}
    k = key("account")
    expect(call("payment-resource", PAY, "POST", "/v1/accounts", OPERATOR, {**op_owner, **k}, body), 201, "create account")
    expect(call("payment-resource", PAY, "POST", "/v1/accounts", OPERATOR, {**op_owner, **k}, body), 201, "replayed create")
    expect(call("payment-resource", PAY, "POST", "/v1/accounts", OPERATOR, {**op_owner, **k}, {**body, "openingBalanceMinor": 5}),
           422, "idempotency conflict")
    expect(call("payment-resource", PAY, "POST", "/v1/accounts", OPERATOR, {**op_owner, **key("dup")}, body), 400, "duplicate account")
    expect(call("payment-resource", PAY, "POST", "/v1/accounts", WORKER, {**owner, **key("w")}, body), 403, "worker may not create")
    payout = expect(call("payment-resource", PAY, "POST", "/v1/payouts", OPERATOR, {**op_owner, **key("payout")},
                         {"accountId": account, "amountMinor": 1250, "currency": "EUR", "beneficiaryRef": "ben-1"}),
                    201, "create payout")
    pid = payout.get("payoutId", str(uuid.uuid4()))
    big = expect(call("payment-resource", PAY, "POST", "/v1/payouts", OPERATOR, {**op_owner, **key("big")},
                      {"accountId": account, "amountMinor": 10_000_000, "currency": "EUR", "beneficiaryRef": "ben-2"}),
                 201, "create an unaffordable payout")
    expect(call("payment-resource", PAY, "GET", f"/v1/accounts/{account}", READER), 200, "read account")
    expect(call("payment-resource", PAY, "GET", f"/v1/payouts/{pid}", READER), 200, "read payout")
    listing = expect(call("payment-resource", PAY, "GET", f"/v1/payouts?state=PENDING&accountId={account}&limit=1", READER),
                     200, "list payouts")
    if listing.get("nextCursor"):
        expect(call("payment-resource", PAY, "GET",
                    f"/v1/payouts?state=PENDING&accountId={account}&limit=1&cursor={listing['nextCursor']}", READER),
               200, "next page")

    # A session and a signed grant; a second session is refused the held key.
    s = expect(call("lock-server", LOCK, "POST", "/v1/sessions", WORKER, owner, {"ttlMillis": 30_000}), 201, "open session")
    sid = s.get("sessionId", str(uuid.uuid4()))
    other = expect(call("lock-server", LOCK, "POST", "/v1/sessions", WORKER, {"X-Owner-Id": "api-flow-other"}), 201,
                   "open session without a body")
    expect(call("lock-server", LOCK, "POST", f"/v1/sessions/{sid}/heartbeat", WORKER, owner), 200, "heartbeat")
    g = expect(call("lock-server", LOCK, "POST", f"/v1/locks/{lock_key}/acquire", WORKER, owner, {"sessionId": sid}), 200, "acquire")
    expect(call("lock-server", LOCK, "POST", f"/v1/locks/{lock_key}/acquire", WORKER, {"X-Owner-Id": "api-flow-other"},
                {"sessionId": other.get("sessionId", sid)}), 409, "contended acquire")
    expect(call("lock-server", LOCK, "POST", f"/v1/locks/{lock_key}/acquire", WORKER, owner, {"sessionId": sid}), 409,
           "acquire by the holder")
    expect(call("lock-server", LOCK, "GET", f"/v1/locks/{lock_key}", READER), 200, "lock info")
    token = str(g.get("fencingToken", 1))
    fence = {"X-Fencing-Token": token, **owner}
    if g.get("fencingSignature"):
        fence["X-Fencing-Signature"] = g["fencingSignature"]

    # Claim, submit (the stub acks), post: each a fenced write under the grant.
    claim = {"expectedState": "PENDING"}
    ck = key("claim")
    expect(call("payment-resource", PAY, "POST", f"/v1/payouts/{pid}/claim", WORKER, {**fence, **ck}, claim), 200, "claim")
    expect(call("payment-resource", PAY, "POST", f"/v1/payouts/{pid}/claim", WORKER, {**fence, **ck}, claim), 200, "replayed claim")
    expect(call("payment-resource", PAY, "POST", f"/v1/payouts/{pid}/claim", WORKER, {**fence, **key("again")}, claim), 409,
           "claim of a claimed payout")
    expect(call("payment-resource", PAY, "POST", f"/v1/payouts/{pid}/claim", WORKER,
                {**fence, **key("unsigned"), "X-Fencing-Signature": "v1.0000000000000000.x"}, claim), 400, "forged signature")
    sub = {"payoutId": pid, "accountId": account, "amountMinor": 1250, "currency": "EUR", "beneficiaryRef": "ben-1"}
    ack = expect(call("rail-proxy", PROXY, "POST", "/v1/rail/submissions", WORKER, {**fence, **key("submit")}, sub), 200, "submit")
    expect(call("rail-proxy", PROXY, "POST", "/v1/rail/submissions", WORKER, {**fence, **key("submit2")}, sub), 409,
           "duplicate submission")
    expect(call("rail-stub", STUB, "GET", "/calls", None), 200, "rail call log")
    expect(call("rail-stub", STUB, "POST", "/submit", None, None, {"clientRef": "api-flow", "amountMinor": 1, "currency": "EUR"}),
           200, "rail submit")
    expect(call("lock-server", LOCK, "POST", f"/v1/locks/{lock_key}/renew", WORKER, fence, {"sessionId": sid}), 200, "renew")
    expect(call("lock-server", LOCK, "DELETE", f"/v1/locks/{lock_key}?sessionId={sid}", WORKER, fence), 204, "release")
    expect(call("lock-server", LOCK, "DELETE", f"/v1/locks/{lock_key}?sessionId={sid}", WORKER, fence), 409, "stale release")
    expect(call("lock-server", LOCK, "POST", f"/v1/locks/{lock_key}/renew", WORKER, fence, {"sessionId": sid}), 409, "stale renew")

    # The post goes under a newer grant (C3 §3.4 P3: the ledger fence must be exceeded).
    fence2 = grant(lock_key, sid, owner, "acquire for the post")
    post = {"railReference": ack.get("railReference", "x"), "submissionId": ack.get("submissionId", str(uuid.uuid4())),
            "railOutcome": "ACKED"}
    expect(call("payment-resource", PAY, "POST", f"/v1/payouts/{pid}/post", WORKER, {**fence, **key("old")}, post), 409,
           "post under the claim's grant")
    expect(call("payment-resource", PAY, "POST", f"/v1/payouts/{pid}/post", WORKER, {**fence2, **key("post")}, post), 200, "post")
    expect(call("payment-resource", PAY, "GET", f"/v1/payouts/{pid}", READER), 200, "read a posted payout")
    expect(call("payment-resource", PAY, "GET", f"/v1/accounts/{account}", READER), 200, "read the debited account")
    expect(call("lock-server", LOCK, "DELETE", f"/v1/locks/{lock_key}", WORKER, fence2, {"sessionId": sid}), 204,
           "release with the session in the body")

    # The unaffordable payout: a stale token is fenced; a newer grant's claim fails it.
    fence3 = grant(lock_key, sid, owner, "acquire for the unaffordable payout")
    bid = big.get("payoutId", str(uuid.uuid4()))
    expect(call("payment-resource", PAY, "POST", f"/v1/payouts/{bid}/claim", WORKER, {**fence, **key("stale")}, claim), 409,
           "stale claim")
    expect(call("payment-resource", PAY, "POST", f"/v1/payouts/{bid}/claim", WORKER, {**fence3, **key("poor")}, claim), 422,
           "insufficient funds")
    expect(call("payment-resource", PAY, "GET", f"/v1/payouts/{uuid.uuid4()}", READER), 404, "unknown payout")

    # A batch (C3-extensions E-19): two payouts claimed and submitted under one grant, posted
    # under a newer one; an equal token at the mark and an older one at the ledger are fenced.
    expect(call("lock-server", LOCK, "DELETE", f"/v1/locks/{lock_key}", WORKER, fence3, {"sessionId": sid}), 204,
           "release before the batch")
    batch = []
    for n in range(2):
        made = expect(call("payment-resource", PAY, "POST", "/v1/payouts", OPERATOR, {**op_owner, **key(f"batch{n}")},
                           {"accountId": account, "amountMinor": 100, "currency": "EUR", "beneficiaryRef": f"ben-b{n}"}),
                      201, "create a payout for the batch")
        batch.append(made.get("payoutId", str(uuid.uuid4())))
    fence4 = grant(lock_key, sid, owner, "acquire for the batch")
    claims = {"payouts": [{"payoutId": b, "expectedState": "PENDING"} for b in batch]}
    bk = key("claims")
    expect(call("payment-resource", PAY, "POST", f"/v1/accounts/{account}/claims", WORKER, {**fence4, **bk}, claims), 200,
           "batch claim")
    expect(call("payment-resource", PAY, "POST", f"/v1/accounts/{account}/claims", WORKER, {**fence4, **bk}, claims), 200,
           "replayed batch claim")
    subs = {"accountId": account, "submissions": [
        {"payoutId": b, "amountMinor": 100, "currency": "EUR", "beneficiaryRef": f"ben-b{n}", "idempotencyKey": f"payout:{b}"}
        for n, b in enumerate(batch)]}
    acks = expect(call("rail-proxy", PROXY, "POST", "/v1/rail/submission-batches", WORKER, fence4, subs), 200,
                  "batch submission")
    expect(call("rail-proxy", PROXY, "POST", "/v1/rail/submission-batches", WORKER, fence4, subs), 409,
           "batch submission under an equal token")
    expect(call("lock-server", LOCK, "DELETE", f"/v1/locks/{lock_key}", WORKER, fence4, {"sessionId": sid}), 204,
           "release after the batch submission")
    fence5 = grant(lock_key, sid, owner, "acquire for the batch post")
    items = {i.get("payoutId"): i.get("body", {}) for i in acks.get("items", [])}
    posts = {"payouts": [{"payoutId": b, "railReference": items.get(b, {}).get("railReference", "x"),
                          "submissionId": items.get(b, {}).get("submissionId", str(uuid.uuid4())), "railOutcome": "ACKED"}
                         for b in batch]}
    expect(call("payment-resource", PAY, "POST", f"/v1/accounts/{account}/posts", WORKER, {**fence4, **key("oldposts")},
                posts), 409, "batch post under the claims' grant")
    expect(call("payment-resource", PAY, "POST", f"/v1/accounts/{account}/posts", WORKER, {**fence5, **key("posts")}, posts),
           200, "batch post")

    # The operator revokes; the worker may not; a stale expectedToken is fenced out.
    rv = {"operator": "api-flow", "reason": "api conformance walk", "expectedToken": 1}
    expect(call("lock-server", LOCK, "POST", f"/v1/locks/{lock_key}/revoke", OPERATOR, op_owner, rv), 409, "stale revoke")
    expect(call("lock-server", LOCK, "POST", f"/v1/locks/{lock_key}/revoke", WORKER, owner, rv), 403, "worker may not revoke")
    rv.pop("expectedToken")
    expect(call("lock-server", LOCK, "POST", f"/v1/locks/{lock_key}/revoke", OPERATOR, op_owner, rv), 200, "revoke")
    expect(call("lock-server", LOCK, "POST", f"/v1/locks/{lock_key}/revoke", OPERATOR, op_owner, rv), 404, "revoke of a free key")
    expect(call("lock-server", LOCK, "GET", f"/v1/locks/{lock_key}", READER), 200, "lock info after revoke")
    expect(call("lock-server", LOCK, "DELETE", f"/v1/sessions/{sid}", WORKER, owner), 204, "close session")
    expect(call("lock-server", LOCK, "POST", f"/v1/sessions/{sid}/heartbeat", WORKER, owner), 404, "heartbeat a closed session")

    for p in problems:
        print(f"check-api-flow: {p}", file=sys.stderr)
    print(f"check-api-flow: {answers} answers, {len(problems)} outside their document or expectation")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
