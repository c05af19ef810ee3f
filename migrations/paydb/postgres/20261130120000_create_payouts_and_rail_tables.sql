-- paydb, PostgreSQL: payouts (minimal; the payment-resource extends it), the rail-proxy's
-- durable high-water mark and its audit trail of attempts. See docs/contracts/C1.

CREATE TABLE payouts (
    payout_id        TEXT        PRIMARY KEY,
    account_id       TEXT        NOT NULL,
    amount_minor     BIGINT      NOT NULL CHECK (amount_minor > 0),
    currency         TEXT        NOT NULL CHECK (char_length(currency) = 3),
    beneficiary_ref  TEXT        NOT NULL,
    state            TEXT        NOT NULL CHECK (state IN ('PENDING', 'CLAIMED', 'SUBMITTED', 'RAIL_ACKED',
                                                         'POSTED', 'FAILED', 'ABANDONED', 'RAIL_AMBIGUOUS')),
    attempt_count    INTEGER     NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    created_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL
);

CREATE INDEX payouts_state_created_idx ON payouts (state, created_at, payout_id);
CREATE INDEX payouts_account_idx ON payouts (account_id);

-- Enforcement point (c): the per-account mark. Only ever advanced by the conditional
-- upsert `... WHERE rail_high_water.highest_token < EXCLUDED.highest_token`.
CREATE TABLE rail_high_water (
    account_id     TEXT        PRIMARY KEY,
    highest_token  BIGINT      NOT NULL CHECK (highest_token > 0),
    updated_at     TIMESTAMPTZ NOT NULL
);

-- One row per attempt: fenced, duplicate, acked, rejected, ambiguous, unsent.
-- outcome IS NULL means the intent committed and the outcome is not yet recorded.
CREATE TABLE rail_submission (
    seq              BIGINT      GENERATED ALWAYS AS IDENTITY UNIQUE,
    submission_id    TEXT        PRIMARY KEY,
    payout_id        TEXT        NOT NULL REFERENCES payouts (payout_id),
    account_id       TEXT        NOT NULL,
    presented_token  BIGINT      NOT NULL CHECK (presented_token > 0),
    owner_id         TEXT        NOT NULL,
    idempotency_key  TEXT        NOT NULL,
    amount_minor     BIGINT      NOT NULL,
    currency         TEXT        NOT NULL,
    outcome          TEXT        NULL CHECK (outcome IN ('FENCED', 'DUPLICATE', 'ACKED', 'REJECTED', 'TIMEOUT', 'UNSENT')),
    outcome_detail   TEXT        NULL,
    rail_reference   TEXT        NULL,
    submitted_at     TIMESTAMPTZ NOT NULL,
    resolved_at      TIMESTAMPTZ NULL,
    CHECK ((outcome IS NULL) = (resolved_at IS NULL)),
    CHECK ((outcome = 'ACKED') = (rail_reference IS NOT NULL))
);

-- The authority on duplicates (FR-18): at most one forwardable attempt per payout.
-- FENCED and DUPLICATE rows were never forwarded; UNSENT rows provably presented nothing.
CREATE UNIQUE INDEX rail_submission_attempt_uidx ON rail_submission (payout_id)
    WHERE outcome IS NULL OR outcome IN ('ACKED', 'REJECTED', 'TIMEOUT');

CREATE INDEX rail_submission_payout_idx ON rail_submission (payout_id, seq);
