-- paydb, PostgreSQL: the event outbox (docs/contracts/C3-extensions.md E-20, the event
-- stream). Every event is written by a trigger, in the transaction of the change it
-- describes, so a crash can neither lose one nor leave one for a change that did not
-- commit. The one exception is `fence.refused`, which describes a refusal (a refusal rolls
-- back and changes nothing): the store writes it in a transaction of its own.
--
-- Order: `seq` is drawn from a sequence when the event row is inserted, i.e. after the
-- change took its row locks, so two changes to one row get their seqs in commit order. Two
-- unrelated transactions may commit out of seq order; a reader then sees a hole below a
-- visible seq, and waits until every transaction in flight when it saw the hole has ended
-- (`dlock_paydb::events`) before it passes the hole.

CREATE TABLE events (
    seq         BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        TEXT        NOT NULL,
    at          TIMESTAMPTZ NOT NULL,
    account_id  TEXT        NULL,
    payout_id   TEXT        NULL,
    body        TEXT        NOT NULL
);

-- The highest seq the retention purge has deleted: a cursor below it is expired.
CREATE TABLE event_retention (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    purged_through  BIGINT  NOT NULL CHECK (purged_through >= 0)
);
INSERT INTO event_retention (id, purged_through) VALUES (1, 0);

CREATE FUNCTION events_account_created() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind = 'CUSTOMER' THEN
        INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ('account.created', NEW.created_at,
            NEW.account_id, NULL, jsonb_build_object('currency', NEW.currency, 'balanceMinor', NEW.balance_minor)::text);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER events_account_created AFTER INSERT ON accounts FOR EACH ROW EXECUTE FUNCTION events_account_created();

CREATE FUNCTION events_fence_raised() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ('fence.raised', NEW.updated_at,
        NEW.account_id, NULL, jsonb_build_object('previousFence', OLD.fence, 'presentedToken', NEW.fence)::text);
    RETURN NULL;
END $$;
CREATE TRIGGER events_fence_raised AFTER UPDATE OF fence ON accounts FOR EACH ROW
    WHEN (OLD.fence IS DISTINCT FROM NEW.fence) EXECUTE FUNCTION events_fence_raised();

CREATE FUNCTION events_payout_created() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ('payout.created', NEW.created_at,
        NEW.account_id, NEW.payout_id, jsonb_build_object('amountMinor', NEW.amount_minor, 'currency', NEW.currency,
        'beneficiaryRef', NEW.beneficiary_ref, 'state', NEW.state)::text);
    RETURN NULL;
END $$;
CREATE TRIGGER events_payout_created AFTER INSERT ON payouts FOR EACH ROW EXECUTE FUNCTION events_payout_created();

CREATE FUNCTION events_payout_state_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ('payout.state_changed', NEW.updated_at,
        NEW.account_id, NEW.payout_id, jsonb_build_object('from', OLD.state, 'to', NEW.state,
        'attemptCount', NEW.attempt_count, 'claimToken', NEW.claim_token)::text);
    RETURN NULL;
END $$;
CREATE TRIGGER events_payout_state_changed AFTER UPDATE OF state ON payouts FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION events_payout_state_changed();

CREATE FUNCTION events_rail_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ('rail.mark_raised', NEW.updated_at,
        NEW.account_id, NULL, jsonb_build_object('previousMark',
            CASE WHEN TG_OP = 'INSERT' THEN 0 ELSE OLD.highest_token END, 'presentedToken', NEW.highest_token)::text);
    RETURN NULL;
END $$;
CREATE TRIGGER events_rail_mark_inserted AFTER INSERT ON rail_high_water FOR EACH ROW
    EXECUTE FUNCTION events_rail_mark();
CREATE TRIGGER events_rail_mark_raised AFTER UPDATE OF highest_token ON rail_high_water FOR EACH ROW
    WHEN (OLD.highest_token IS DISTINCT FROM NEW.highest_token) EXECUTE FUNCTION events_rail_mark();

CREATE FUNCTION events_rail_submission() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO events (kind, at, account_id, payout_id, body) VALUES (
            CASE WHEN NEW.outcome IS NULL THEN 'rail.intent' ELSE 'rail.refused' END, NEW.submitted_at,
            NEW.account_id, NEW.payout_id, jsonb_build_object('submissionId', NEW.submission_id,
            'presentedToken', NEW.presented_token, 'ownerId', NEW.owner_id, 'amountMinor', NEW.amount_minor,
            'currency', NEW.currency, 'outcome', NEW.outcome)::text);
    ELSE
        INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ('rail.outcome',
            COALESCE(NEW.resolved_at, NEW.submitted_at), NEW.account_id, NEW.payout_id,
            jsonb_build_object('submissionId', NEW.submission_id, 'presentedToken', NEW.presented_token,
            'outcome', NEW.outcome, 'railReference', NEW.rail_reference)::text);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER events_rail_intent AFTER INSERT ON rail_submission FOR EACH ROW
    EXECUTE FUNCTION events_rail_submission();
CREATE TRIGGER events_rail_outcome AFTER UPDATE OF outcome ON rail_submission FOR EACH ROW
    WHEN (OLD.outcome IS DISTINCT FROM NEW.outcome) EXECUTE FUNCTION events_rail_submission();

CREATE FUNCTION events_operator_resolution() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ('operator.resolution', NEW.resolved_at,
        (SELECT account_id FROM payouts WHERE payout_id = NEW.payout_id), NEW.payout_id,
        jsonb_build_object('resolutionId', NEW.resolution_id, 'resolvedAs', NEW.resolved_as,
        'operator', NEW.operator, 'reason', NEW.reason, 'railReference', NEW.rail_reference)::text);
    RETURN NULL;
END $$;
CREATE TRIGGER events_operator_resolution AFTER INSERT ON payout_resolutions FOR EACH ROW
    EXECUTE FUNCTION events_operator_resolution();
