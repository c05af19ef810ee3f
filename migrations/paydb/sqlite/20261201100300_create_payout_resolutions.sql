-- paydb, SQLite: the audit trail of operator resolutions of quarantined payouts, as in the
-- PostgreSQL tree (`dlock resolve`, C2: RAIL_AMBIGUOUS -> POSTED | FAILED, operator only).
-- See docs/contracts/C1.

CREATE TABLE payout_resolutions (
    resolution_id   TEXT    PRIMARY KEY NOT NULL,
    payout_id       TEXT    NOT NULL REFERENCES payouts (payout_id),
    resolved_as     TEXT    NOT NULL CHECK (resolved_as IN ('POSTED', 'FAILED')),
    operator        TEXT    NOT NULL CHECK (length(operator) BETWEEN 1 AND 64),
    reason          TEXT    NOT NULL CHECK (length(reason) >= 8),
    rail_reference  TEXT    NOT NULL CHECK (length(rail_reference) >= 1),
    resolved_at     TEXT    NOT NULL
);

-- A payout leaves quarantine once, so it is resolved at most once.
CREATE UNIQUE INDEX payout_resolutions_payout_uidx ON payout_resolutions (payout_id);

-- The audit trail is append-only.
CREATE TRIGGER payout_resolutions_no_update BEFORE UPDATE ON payout_resolutions
BEGIN
    SELECT RAISE(ABORT, 'payout_resolutions: append-only, UPDATE refused');
END;

CREATE TRIGGER payout_resolutions_no_delete BEFORE DELETE ON payout_resolutions
BEGIN
    SELECT RAISE(ABORT, 'payout_resolutions: append-only, DELETE refused');
END;
