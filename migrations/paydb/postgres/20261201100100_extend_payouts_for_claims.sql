-- paydb, PostgreSQL: the latest claim on each payout, the per-account listing index, and
-- the payout guard. See docs/design/payment-resource.md section 2 and docs/contracts/C2.

ALTER TABLE payouts ADD COLUMN claim_token BIGINT NULL CHECK (claim_token > 0);  -- the latest claim's token
ALTER TABLE payouts ADD COLUMN claimed_by TEXT NULL;                             -- its X-Owner-Id
ALTER TABLE payouts ADD COLUMN claimed_at TIMESTAMPTZ NULL;

CREATE INDEX payouts_account_state_created_idx ON payouts (account_id, state, created_at, payout_id);

-- Refuses every state change outside C2 (a same-state write passes) and any change to the
-- columns fixed at insert. Conditional updates decide races; this stops buggy statements
-- and hand-run SQL. The pairs are the C2 transitions, one literal each.
CREATE FUNCTION payouts_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.payout_id <> OLD.payout_id OR NEW.account_id <> OLD.account_id
       OR NEW.amount_minor <> OLD.amount_minor OR NEW.currency <> OLD.currency
       OR NEW.beneficiary_ref <> OLD.beneficiary_ref OR NEW.created_at <> OLD.created_at THEN
        RAISE EXCEPTION 'payouts: payout_id, account_id, amount_minor, currency, beneficiary_ref and created_at never change'
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.state <> OLD.state AND OLD.state || '>' || NEW.state NOT IN (
        'PENDING>CLAIMED', 'PENDING>FAILED', 'PENDING>ABANDONED',
        'CLAIMED>FAILED', 'CLAIMED>SUBMITTED', 'CLAIMED>ABANDONED',
        'SUBMITTED>RAIL_ACKED', 'SUBMITTED>FAILED', 'SUBMITTED>RAIL_AMBIGUOUS', 'SUBMITTED>CLAIMED',
        'RAIL_ACKED>POSTED',
        'RAIL_AMBIGUOUS>POSTED', 'RAIL_AMBIGUOUS>FAILED'
    ) THEN
        RAISE EXCEPTION 'payouts: transition % to % is not in C2', OLD.state, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER payouts_guard BEFORE UPDATE ON payouts FOR EACH ROW EXECUTE FUNCTION payouts_guard();
