-- paydb, PostgreSQL: accounts, the double-entry ledger, and the guards around both.
-- See docs/design/payment-resource.md section 2 and docs/contracts/C1.

-- One row per account. CUSTOMER accounts are named by requests; the two system accounts of
-- each currency (#funding:CUR, #settlement:CUR) are named by the service only, and keep no
-- balance and no fence, so they never become a hot row.
CREATE TABLE accounts (
    account_id     TEXT        PRIMARY KEY,
    kind           TEXT        NOT NULL DEFAULT 'CUSTOMER' CHECK (kind IN ('CUSTOMER', 'FUNDING', 'SETTLEMENT')),
    currency       TEXT        NOT NULL CHECK (char_length(currency) = 3),
    balance_minor  BIGINT      NOT NULL DEFAULT 0 CHECK (balance_minor >= 0),
    fence          BIGINT      NOT NULL DEFAULT 0 CHECK (fence >= 0),  -- 0: never fenced
    created_at     TIMESTAMPTZ NOT NULL,
    updated_at     TIMESTAMPTZ NOT NULL,
    CHECK ((kind = 'CUSTOMER') = (account_id NOT LIKE '#%')),
    CHECK (kind = 'CUSTOMER' OR (balance_minor = 0 AND fence = 0))
);

-- Backfill: every account a payout (seeded before this migration) names, with no balance.
INSERT INTO accounts (account_id, kind, currency, balance_minor, fence, created_at, updated_at)
SELECT account_id, 'CUSTOMER', MIN(currency), 0, 0, MIN(created_at), MAX(updated_at)
  FROM payouts
 GROUP BY account_id;

-- Then any account only a rail mark names (none expected: a mark implies a payout).
INSERT INTO accounts (account_id, kind, currency, balance_minor, fence, created_at, updated_at)
SELECT h.account_id, 'CUSTOMER', 'XXX', 0, 0, h.updated_at, h.updated_at
  FROM rail_high_water h
 WHERE NOT EXISTS (SELECT 1 FROM accounts a WHERE a.account_id = h.account_id);

-- Payouts and rail marks reference accounts (added after the backfill, so it cannot fail).
ALTER TABLE payouts ADD CONSTRAINT payouts_account_fk FOREIGN KEY (account_id) REFERENCES accounts (account_id);
ALTER TABLE rail_high_water ADD CONSTRAINT rail_high_water_account_fk
    FOREIGN KEY (account_id) REFERENCES accounts (account_id);

-- The ledger: append-only, two entries per posting (DEBIT and CREDIT of one amount).
CREATE TABLE ledger_entries (
    entry_id      TEXT        PRIMARY KEY,
    posting_id    TEXT        NOT NULL,
    payout_id     TEXT        NULL REFERENCES payouts (payout_id),      -- NULL: an opening balance
    account_id    TEXT        NOT NULL REFERENCES accounts (account_id),
    direction     TEXT        NOT NULL CHECK (direction IN ('DEBIT', 'CREDIT')),
    amount_minor  BIGINT      NOT NULL CHECK (amount_minor > 0),
    currency      TEXT        NOT NULL CHECK (char_length(currency) = 3),
    fence         BIGINT      NOT NULL CHECK (fence >= 0),              -- the posting token; 0 for openings
    created_at    TIMESTAMPTZ NOT NULL,
    UNIQUE (posting_id, direction)
);

-- A payout is posted at most once.
CREATE UNIQUE INDEX ledger_entries_payout_uidx ON ledger_entries (payout_id, direction) WHERE payout_id IS NOT NULL;
CREATE INDEX ledger_entries_account_idx ON ledger_entries (account_id);

-- The ledger is append-only.
CREATE FUNCTION ledger_entries_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger_entries: append-only, % refused', TG_OP USING ERRCODE = 'check_violation';
END
$$;

CREATE TRIGGER ledger_entries_append_only BEFORE UPDATE OR DELETE ON ledger_entries
    FOR EACH ROW EXECUTE FUNCTION ledger_entries_append_only();
CREATE TRIGGER ledger_entries_no_truncate BEFORE TRUNCATE ON ledger_entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_entries_append_only();

-- The fence only rises (I4); an account keeps its id, kind and currency.
CREATE FUNCTION accounts_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.fence < OLD.fence THEN
        RAISE EXCEPTION 'accounts: the fence only rises (% to %)', OLD.fence, NEW.fence
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.account_id <> OLD.account_id OR NEW.kind <> OLD.kind OR NEW.currency <> OLD.currency THEN
        RAISE EXCEPTION 'accounts: account_id, kind and currency never change' USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER accounts_guard BEFORE UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION accounts_guard();
