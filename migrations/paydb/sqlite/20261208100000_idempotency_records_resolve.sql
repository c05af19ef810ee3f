-- paydb, SQLite: the idempotency ledger also records an operator's resolution of a
-- quarantined payout over HTTP (operation 'RESOLVE'), as in the PostgreSQL tree. SQLite
-- cannot alter a CHECK, so the table is rebuilt with the wider one and every row copied;
-- no trigger, view or foreign key refers to it.

CREATE TABLE idempotency_records_resolve (
    operation        TEXT    NOT NULL CHECK (operation IN ('CREATE_ACCOUNT', 'CREATE_PAYOUT', 'CLAIM', 'POST', 'RESOLVE')),
    target_id        TEXT    NOT NULL,
    idempotency_key  TEXT    NOT NULL,
    fencing_token    INTEGER NOT NULL CHECK (fencing_token >= 0),  -- 0: an unfenced operation
    request_sha256   TEXT    NOT NULL CHECK (length(request_sha256) = 64),
    owner_id         TEXT    NOT NULL,
    response_status  INTEGER NULL CHECK (response_status BETWEEN 100 AND 599),
    response_body    BLOB    NULL,
    created_at       TEXT    NOT NULL,
    expires_at       TEXT    NOT NULL,
    PRIMARY KEY (operation, target_id, idempotency_key, fencing_token),
    CHECK ((response_status IS NULL) = (response_body IS NULL))
);

INSERT INTO idempotency_records_resolve (operation, target_id, idempotency_key, fencing_token, request_sha256,
    owner_id, response_status, response_body, created_at, expires_at)
SELECT operation, target_id, idempotency_key, fencing_token, request_sha256, owner_id, response_status,
    response_body, created_at, expires_at
FROM idempotency_records;

DROP TABLE idempotency_records;
ALTER TABLE idempotency_records_resolve RENAME TO idempotency_records;

CREATE INDEX idempotency_records_expiry_idx ON idempotency_records (expires_at);
