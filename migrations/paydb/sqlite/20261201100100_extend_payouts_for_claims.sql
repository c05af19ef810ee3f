-- paydb, SQLite: the latest claim on each payout, the per-account listing index, and the
-- payout guards, as in the PostgreSQL tree. See docs/design/payment-resource.md section 2
-- and docs/contracts/C2.

ALTER TABLE payouts ADD COLUMN claim_token INTEGER NULL CHECK (claim_token > 0);  -- the latest claim's token
ALTER TABLE payouts ADD COLUMN claimed_by TEXT NULL;                              -- its X-Owner-Id
ALTER TABLE payouts ADD COLUMN claimed_at TEXT NULL;

CREATE INDEX payouts_account_state_created_idx ON payouts (account_id, state, created_at, payout_id);

-- Refuses every state change outside C2 (a same-state write passes). Conditional updates
-- decide races; this stops buggy statements and hand-run SQL. The pairs are the C2
-- transitions, one literal each.
CREATE TRIGGER payouts_state_guard BEFORE UPDATE OF state ON payouts
WHEN NEW.state <> OLD.state AND OLD.state || '>' || NEW.state NOT IN (
    'PENDING>CLAIMED', 'PENDING>FAILED', 'PENDING>ABANDONED',
    'CLAIMED>FAILED', 'CLAIMED>SUBMITTED', 'CLAIMED>ABANDONED',
    'SUBMITTED>RAIL_ACKED', 'SUBMITTED>FAILED', 'SUBMITTED>RAIL_AMBIGUOUS', 'SUBMITTED>CLAIMED',
    'RAIL_ACKED>POSTED',
    'RAIL_AMBIGUOUS>POSTED', 'RAIL_AMBIGUOUS>FAILED'
)
BEGIN
    SELECT RAISE(ABORT, 'payouts: transition not in C2');
END;

-- The columns fixed at insert (C1 1.2.1, plus the keys the ledger and the P1 cursor rely on).
CREATE TRIGGER payouts_immutable_guard
BEFORE UPDATE OF payout_id, account_id, amount_minor, currency, beneficiary_ref, created_at ON payouts
WHEN NEW.payout_id IS NOT OLD.payout_id
  OR NEW.account_id IS NOT OLD.account_id
  OR NEW.amount_minor IS NOT OLD.amount_minor
  OR NEW.currency IS NOT OLD.currency
  OR NEW.beneficiary_ref IS NOT OLD.beneficiary_ref
  OR NEW.created_at IS NOT OLD.created_at
BEGIN
    SELECT RAISE(ABORT, 'payouts: payout_id, account_id, amount_minor, currency, beneficiary_ref and created_at never change');
END;
