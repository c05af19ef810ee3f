-- paydb, PostgreSQL: the durable idempotency ledger and the deployment's secrets.
-- See docs/design/payment-resource.md sections 4 and 5.

-- One row per identity (operation, target, key, token). The row is the deciding
-- transaction's first write; its response is written before that transaction commits, so
-- a committed row always holds one (NULL only inside its own transaction).
CREATE TABLE idempotency_records (
    operation        TEXT        NOT NULL CHECK (operation IN ('CREATE_ACCOUNT', 'CREATE_PAYOUT', 'CLAIM', 'POST')),
    target_id        TEXT        NOT NULL,
    idempotency_key  TEXT        NOT NULL,
    fencing_token    BIGINT      NOT NULL CHECK (fencing_token >= 0),  -- 0: an unfenced operation
    request_sha256   TEXT        NOT NULL CHECK (char_length(request_sha256) = 64),
    owner_id         TEXT        NOT NULL,
    response_status  INTEGER     NULL CHECK (response_status BETWEEN 100 AND 599),
    response_body    BYTEA       NULL,
    created_at       TIMESTAMPTZ NOT NULL,
    expires_at       TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (operation, target_id, idempotency_key, fencing_token),
    CHECK ((response_status IS NULL) = (response_body IS NULL))
);

CREATE INDEX idempotency_records_expiry_idx ON idempotency_records (expires_at);

-- Generated once per deployment, shared by every replica (the P1 cursor key: 'p1-cursor').
CREATE TABLE paydb_secrets (
    name        TEXT        PRIMARY KEY,
    secret_hex  TEXT        NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL
);
