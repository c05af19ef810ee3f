-- paydb, SQLite: the event outbox, as in the PostgreSQL tree (docs/contracts/C3-extensions.md
-- E-20). Every event is written by a trigger, in the transaction of the change it describes;
-- `fence.refused` alone is written by the store, in a transaction of its own. SQLite has one
-- writer, so `seq` (AUTOINCREMENT: never reused, even after a purge) is commit order.

CREATE TABLE events (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    kind        TEXT    NOT NULL,
    at          TEXT    NOT NULL,
    account_id  TEXT    NULL,
    payout_id   TEXT    NULL,
    body        TEXT    NOT NULL
);

-- The highest seq the retention purge has deleted: a cursor below it is expired.
CREATE TABLE event_retention (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    purged_through  INTEGER NOT NULL CHECK (purged_through >= 0)
);
INSERT INTO event_retention (id, purged_through) VALUES (1, 0);

CREATE TRIGGER events_account_created AFTER INSERT ON accounts WHEN NEW.kind = 'CUSTOMER'
BEGIN
    INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ('account.created', NEW.created_at,
        NEW.account_id, NULL, json_object('currency', NEW.currency, 'balanceMinor', NEW.balance_minor));
END;

CREATE TRIGGER events_fence_raised AFTER UPDATE OF fence ON accounts WHEN OLD.fence IS NOT NEW.fence
BEGIN
    INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ('fence.raised', NEW.updated_at,
        NEW.account_id, NULL, json_object('previousFence', OLD.fence, 'presentedToken', NEW.fence));
END;

CREATE TRIGGER events_payout_created AFTER INSERT ON payouts
BEGIN
    INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ('payout.created', NEW.created_at,
        NEW.account_id, NEW.payout_id, json_object('amountMinor', NEW.amount_minor, 'currency', NEW.currency,
        'beneficiaryRef', NEW.beneficiary_ref, 'state', NEW.state));
END;

CREATE TRIGGER events_payout_state_changed AFTER UPDATE OF state ON payouts WHEN OLD.state IS NOT NEW.state
BEGIN
    INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ('payout.state_changed', NEW.updated_at,
        NEW.account_id, NEW.payout_id, json_object('from', OLD.state, 'to', NEW.state,
        'attemptCount', NEW.attempt_count, 'claimToken', NEW.claim_token));
END;

CREATE TRIGGER events_rail_mark_inserted AFTER INSERT ON rail_high_water
BEGIN
    INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ('rail.mark_raised', NEW.updated_at,
        NEW.account_id, NULL, json_object('previousMark', 0, 'presentedToken', NEW.highest_token));
END;

CREATE TRIGGER events_rail_mark_raised AFTER UPDATE OF highest_token ON rail_high_water
    WHEN OLD.highest_token IS NOT NEW.highest_token
BEGIN
    INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ('rail.mark_raised', NEW.updated_at,
        NEW.account_id, NULL, json_object('previousMark', OLD.highest_token, 'presentedToken', NEW.highest_token));
END;

CREATE TRIGGER events_rail_intent AFTER INSERT ON rail_submission
BEGIN
    INSERT INTO events (kind, at, account_id, payout_id, body) VALUES (
        CASE WHEN NEW.outcome IS NULL THEN 'rail.intent' ELSE 'rail.refused' END, NEW.submitted_at,
        NEW.account_id, NEW.payout_id, json_object('submissionId', NEW.submission_id,
        'presentedToken', NEW.presented_token, 'ownerId', NEW.owner_id, 'amountMinor', NEW.amount_minor,
        'currency', NEW.currency, 'outcome', NEW.outcome));
END;

CREATE TRIGGER events_rail_outcome AFTER UPDATE OF outcome ON rail_submission WHEN OLD.outcome IS NOT NEW.outcome
BEGIN
    INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ('rail.outcome',
        COALESCE(NEW.resolved_at, NEW.submitted_at), NEW.account_id, NEW.payout_id,
        json_object('submissionId', NEW.submission_id, 'presentedToken', NEW.presented_token,
        'outcome', NEW.outcome, 'railReference', NEW.rail_reference));
END;

CREATE TRIGGER events_operator_resolution AFTER INSERT ON payout_resolutions
BEGIN
    INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ('operator.resolution', NEW.resolved_at,
        (SELECT account_id FROM payouts WHERE payout_id = NEW.payout_id), NEW.payout_id,
        json_object('resolutionId', NEW.resolution_id, 'resolvedAs', NEW.resolved_as,
        'operator', NEW.operator, 'reason', NEW.reason, 'railReference', NEW.rail_reference));
END;
