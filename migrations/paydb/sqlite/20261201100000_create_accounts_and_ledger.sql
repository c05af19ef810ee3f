-- paydb, SQLite: the same tables, constraints, indexes and guards as the PostgreSQL tree.
-- Timestamps are RFC 3339 TEXT, truncated to whole milliseconds by the writers, so text
-- order is time order. See docs/design/payment-resource.md section 2 and docs/contracts/C1.

CREATE TABLE accounts (
    account_id     TEXT    PRIMARY KEY NOT NULL,
    kind           TEXT    NOT NULL DEFAULT 'CUSTOMER' CHECK (kind IN ('CUSTOMER', 'FUNDING', 'SETTLEMENT')),
    currency       TEXT    NOT NULL CHECK (length(currency) = 3),
    balance_minor  INTEGER NOT NULL DEFAULT 0 CHECK (balance_minor >= 0),
    fence          INTEGER NOT NULL DEFAULT 0 CHECK (fence >= 0),  -- 0: never fenced
    created_at     TEXT    NOT NULL,
    updated_at     TEXT    NOT NULL,
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

-- Payouts and rail marks reference accounts. SQLite cannot add a foreign key to an
-- existing table, so triggers stand in for it.
CREATE TRIGGER payouts_account_exists BEFORE INSERT ON payouts
WHEN NOT EXISTS (SELECT 1 FROM accounts WHERE account_id = NEW.account_id)
BEGIN
    SELECT RAISE(ABORT, 'payouts: account_id names no account');
END;

CREATE TRIGGER rail_high_water_account_exists BEFORE INSERT ON rail_high_water
WHEN NOT EXISTS (SELECT 1 FROM accounts WHERE account_id = NEW.account_id)
BEGIN
    SELECT RAISE(ABORT, 'rail_high_water: account_id names no account');
END;

CREATE TRIGGER rail_high_water_account_kept BEFORE UPDATE OF account_id ON rail_high_water
WHEN NOT EXISTS (SELECT 1 FROM accounts WHERE account_id = NEW.account_id)
BEGIN
    SELECT RAISE(ABORT, 'rail_high_water: account_id names no account');
END;

CREATE TRIGGER accounts_referenced BEFORE DELETE ON accounts
WHEN EXISTS (SELECT 1 FROM payouts WHERE account_id = OLD.account_id)
  OR EXISTS (SELECT 1 FROM rail_high_water WHERE account_id = OLD.account_id)
BEGIN
    SELECT RAISE(ABORT, 'accounts: a payout or a rail mark references this account');
END;

-- The ledger: append-only, two entries per posting (DEBIT and CREDIT of one amount).
CREATE TABLE ledger_entries (
    entry_id      TEXT    PRIMARY KEY NOT NULL,
    posting_id    TEXT    NOT NULL,
    payout_id     TEXT    NULL REFERENCES payouts (payout_id),      -- NULL: an opening balance
    account_id    TEXT    NOT NULL REFERENCES accounts (account_id),
    direction     TEXT    NOT NULL CHECK (direction IN ('DEBIT', 'CREDIT')),
    amount_minor  INTEGER NOT NULL CHECK (amount_minor > 0),
    currency      TEXT    NOT NULL CHECK (length(currency) = 3),
    fence         INTEGER NOT NULL CHECK (fence >= 0),              -- the posting token; 0 for openings
    created_at    TEXT    NOT NULL,
    UNIQUE (posting_id, direction)
);

-- A payout is posted at most once.
CREATE UNIQUE INDEX ledger_entries_payout_uidx ON ledger_entries (payout_id, direction) WHERE payout_id IS NOT NULL;
CREATE INDEX ledger_entries_account_idx ON ledger_entries (account_id);

-- The ledger is append-only.
CREATE TRIGGER ledger_entries_no_update BEFORE UPDATE ON ledger_entries
BEGIN
    SELECT RAISE(ABORT, 'ledger_entries: append-only, UPDATE refused');
END;

CREATE TRIGGER ledger_entries_no_delete BEFORE DELETE ON ledger_entries
BEGIN
    SELECT RAISE(ABORT, 'ledger_entries: append-only, DELETE refused');
END;

-- The fence only rises (I4); an account keeps its id, kind and currency.
CREATE TRIGGER accounts_guard BEFORE UPDATE OF account_id, kind, currency, fence ON accounts
WHEN NEW.fence < OLD.fence
  OR NEW.account_id IS NOT OLD.account_id
  OR NEW.kind IS NOT OLD.kind
  OR NEW.currency IS NOT OLD.currency
BEGIN
    SELECT RAISE(ABORT, 'accounts: the fence only rises; account_id, kind and currency never change');
END;
