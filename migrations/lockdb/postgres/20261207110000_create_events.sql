-- lockdb, PostgreSQL: the event outbox (docs/contracts/C3-extensions.md E-20, the event
-- stream). Every event is written by a trigger on a row the lock store already writes, in
-- the transaction of the change it describes, so a crash can neither lose one nor leave one
-- for a change that did not commit, and no operation gains a statement or a round trip.
-- The kinds and bodies are `dlock_lock_server::store::events`' (the conformance suite holds
-- every backend to one sequence).
--
-- Order: `seq` is drawn from a sequence when the event row is inserted, i.e. after the
-- change took its row locks, so two changes to one row get their seqs in commit order. Two
-- unrelated transactions may commit out of seq order; a reader then sees a hole below a
-- visible seq, and waits until every transaction in flight when it saw the hole has ended
-- (`dlock_db::events::HoleGate`) before it passes the hole.
--
-- A grant row deleted is one of three events, told apart by the row and lockdb's clock:
-- `lock.revoked` when a revocation of its token exists (the revoke writes its audit row
-- before it deletes the grant), else `lock.expired` when it had died (its lease, or its
-- session's end, at or before lockdb's now), else `lock.released` (a release, or the close
-- of its session, whose cascade deletes it after the session row is gone).

CREATE TABLE events (
    seq       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind      TEXT   NOT NULL,
    -- The database's wall clock at the change, epoch ms: for humans, nothing decides on it.
    at_ms     BIGINT NOT NULL,
    lock_key  TEXT   NULL,
    body      TEXT   NOT NULL
);

-- The highest seq the retention purge has deleted: a cursor below it is expired.
CREATE TABLE event_retention (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    purged_through  BIGINT  NOT NULL CHECK (purged_through >= 0)
);
INSERT INTO event_retention (id, purged_through) VALUES (1, 0);

-- The deleted-grant trigger's lookup of a revocation by token.
CREATE INDEX lock_revocations_token_idx ON lock_revocations (revoked_token);

CREATE FUNCTION lock_event(p_kind TEXT, p_lock_key TEXT, p_body JSONB) RETURNS VOID LANGUAGE sql AS $$
    INSERT INTO events (kind, at_ms, lock_key, body)
        VALUES (p_kind, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT, p_lock_key, p_body::text);
$$;

CREATE FUNCTION lock_grant_body(g lock_grants) RETURNS JSONB LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('key', g.lock_key, 'token', g.fencing_token, 'sessionId', g.session_id,
        'ownerId', g.owner_id);
$$;

CREATE FUNCTION events_session_opened() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM lock_event('session.opened', NULL,
        jsonb_build_object('sessionId', NEW.session_id, 'ownerId', NEW.owner_id, 'ttlMs', NEW.ttl_ms));
    RETURN NULL;
END $$;
CREATE TRIGGER events_session_opened AFTER INSERT ON lock_sessions FOR EACH ROW
    EXECUTE FUNCTION events_session_opened();

CREATE FUNCTION events_session_expired() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM lock_event('session.expired', NULL,
        jsonb_build_object('sessionId', NEW.session_id, 'ownerId', NEW.owner_id));
    RETURN NULL;
END $$;
CREATE TRIGGER events_session_expired AFTER UPDATE OF expired_marked ON lock_sessions FOR EACH ROW
    WHEN (NEW.expired_marked AND NOT OLD.expired_marked) EXECUTE FUNCTION events_session_expired();

CREATE FUNCTION events_lock_granted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM lock_event('lock.granted', NEW.lock_key, lock_grant_body(NEW));
    RETURN NULL;
END $$;
CREATE TRIGGER events_lock_granted AFTER INSERT ON lock_grants FOR EACH ROW
    EXECUTE FUNCTION events_lock_granted();

-- A renew keeps the token; a rotate writes a fresh one over the row: the release of the old
-- grant, then the new grant.
CREATE FUNCTION events_lock_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.fencing_token <> NEW.fencing_token THEN
        PERFORM lock_event('lock.released', OLD.lock_key, lock_grant_body(OLD));
        PERFORM lock_event('lock.granted', NEW.lock_key, lock_grant_body(NEW));
    ELSE
        PERFORM lock_event('lock.renewed', NEW.lock_key, lock_grant_body(NEW));
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER events_lock_updated AFTER UPDATE OF fencing_token, expires_at_ms ON lock_grants FOR EACH ROW
    EXECUTE FUNCTION events_lock_updated();

CREATE FUNCTION events_lock_removed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r lock_revocations%ROWTYPE;
    clock_ms BIGINT;
BEGIN
    SELECT * INTO r FROM lock_revocations WHERE revoked_token = OLD.fencing_token AND lock_key = OLD.lock_key;
    IF FOUND THEN
        PERFORM lock_event('lock.revoked', OLD.lock_key, lock_grant_body(OLD) || jsonb_build_object(
            'newTokenFloor', r.new_token_floor, 'revocationId', r.revocation_id, 'operator', r.operator,
            'reason', r.reason));
        RETURN NULL;
    END IF;
    clock_ms := (SELECT c.now_ms FROM lock_clock c WHERE c.id = 1);
    IF OLD.expires_at_ms <= clock_ms OR EXISTS (
        SELECT 1 FROM lock_sessions s WHERE s.session_id = OLD.session_id AND s.expires_at_ms <= clock_ms) THEN
        PERFORM lock_event('lock.expired', OLD.lock_key, lock_grant_body(OLD));
    ELSE
        PERFORM lock_event('lock.released', OLD.lock_key, lock_grant_body(OLD));
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER events_lock_removed AFTER DELETE ON lock_grants FOR EACH ROW
    EXECUTE FUNCTION events_lock_removed();
