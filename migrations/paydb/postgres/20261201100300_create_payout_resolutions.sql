-- paydb, PostgreSQL: the audit trail of operator resolutions of quarantined payouts
-- (`dlock resolve`, C2: RAIL_AMBIGUOUS -> POSTED | FAILED, operator only). See docs/contracts/C1.

-- One row per resolution, written in the transaction that moves the payout (and, for POSTED,
-- writes its two ledger entries). The proxy's own observation (the TIMEOUT row in
-- rail_submission) is left as it was; the verdict lives here.
CREATE TABLE payout_resolutions (
    resolution_id   TEXT        PRIMARY KEY,
    payout_id       TEXT        NOT NULL REFERENCES payouts (payout_id),
    resolved_as     TEXT        NOT NULL CHECK (resolved_as IN ('POSTED', 'FAILED')),
    operator        TEXT        NOT NULL CHECK (char_length(operator) BETWEEN 1 AND 64),
    reason          TEXT        NOT NULL CHECK (char_length(reason) >= 8),
    rail_reference  TEXT        NOT NULL CHECK (char_length(rail_reference) >= 1),
    resolved_at     TIMESTAMPTZ NOT NULL
);

-- A payout leaves quarantine once, so it is resolved at most once.
CREATE UNIQUE INDEX payout_resolutions_payout_uidx ON payout_resolutions (payout_id);

-- The audit trail is append-only.
CREATE FUNCTION payout_resolutions_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'payout_resolutions: append-only, % refused', TG_OP USING ERRCODE = 'check_violation';
END
$$;

CREATE TRIGGER payout_resolutions_append_only BEFORE UPDATE OR DELETE ON payout_resolutions
    FOR EACH ROW EXECUTE FUNCTION payout_resolutions_append_only();
CREATE TRIGGER payout_resolutions_no_truncate BEFORE TRUNCATE ON payout_resolutions
    FOR EACH STATEMENT EXECUTE FUNCTION payout_resolutions_append_only();
