-- paydb, SQLite: the same tables, constraints and indexes as the PostgreSQL tree.
-- Timestamps are RFC 3339 TEXT. See docs/contracts/C1.

CREATE TABLE payouts (
    payout_id        TEXT    PRIMARY KEY NOT NULL,
    account_id       TEXT    NOT NULL,
    amount_minor     INTEGER NOT NULL CHECK (amount_minor > 0),
    currency         TEXT    NOT NULL CHECK (length(currency) = 3),
    beneficiary_ref  TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('PENDING', 'CLAIMED', 'SUBMITTED', 'RAIL_ACKED',
                                                     'POSTED', 'FAILED', 'ABANDONED', 'RAIL_AMBIGUOUS')),
    attempt_count    INTEGER NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    created_at       TEXT    NOT NULL,
    updated_at       TEXT    NOT NULL
);

CREATE INDEX payouts_state_created_idx ON payouts (state, created_at, payout_id);
CREATE INDEX payouts_account_idx ON payouts (account_id);

CREATE TABLE rail_high_water (
    account_id     TEXT    PRIMARY KEY NOT NULL,
    highest_token  INTEGER NOT NULL CHECK (highest_token > 0),
    updated_at     TEXT    NOT NULL
);

CREATE TABLE rail_submission (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    submission_id    TEXT    NOT NULL UNIQUE,
    payout_id        TEXT    NOT NULL REFERENCES payouts (payout_id),
    account_id       TEXT    NOT NULL,
    presented_token  INTEGER NOT NULL CHECK (presented_token > 0),
    owner_id         TEXT    NOT NULL,
    idempotency_key  TEXT    NOT NULL,
    amount_minor     INTEGER NOT NULL,
    currency         TEXT    NOT NULL,
    outcome          TEXT    NULL CHECK (outcome IN ('FENCED', 'DUPLICATE', 'ACKED', 'REJECTED', 'TIMEOUT', 'UNSENT')),
    outcome_detail   TEXT    NULL,
    rail_reference   TEXT    NULL,
    submitted_at     TEXT    NOT NULL,
    resolved_at      TEXT    NULL,
    CHECK ((outcome IS NULL) = (resolved_at IS NULL)),
    CHECK ((outcome = 'ACKED') = (rail_reference IS NOT NULL))
);

CREATE UNIQUE INDEX rail_submission_attempt_uidx ON rail_submission (payout_id)
    WHERE outcome IS NULL OR outcome IN ('ACKED', 'REJECTED', 'TIMEOUT');

CREATE INDEX rail_submission_payout_idx ON rail_submission (payout_id, seq);
