-- lockdb, SQLite: the event outbox, as in the PostgreSQL tree (docs/contracts/C3-extensions.md
-- E-20): every event is written by a trigger on a row the lock store already writes, in the
-- transaction of the change it describes. SQLite has one writer, so `seq` (AUTOINCREMENT:
-- never reused, even after a purge) is commit order, and lockdb's clock cannot move within
-- a transaction.
--
-- A grant row deleted is `lock.revoked` when a revocation of its token exists, else
-- `lock.expired` when it had died at lockdb's now, else `lock.released` (see the PostgreSQL
-- tree). Foreign-key cascades fire these triggers too (a session's close).

CREATE TABLE events (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    kind      TEXT    NOT NULL,
    at_ms     INTEGER NOT NULL,
    lock_key  TEXT    NULL,
    body      TEXT    NOT NULL
);

CREATE TABLE event_retention (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    purged_through  INTEGER NOT NULL CHECK (purged_through >= 0)
);
INSERT INTO event_retention (id, purged_through) VALUES (1, 0);

CREATE INDEX lock_revocations_token_idx ON lock_revocations (revoked_token);

CREATE TRIGGER events_session_opened AFTER INSERT ON lock_sessions
BEGIN
    INSERT INTO events (kind, at_ms, lock_key, body) VALUES ('session.opened',
        CAST(unixepoch('subsec') * 1000 AS INTEGER), NULL,
        json_object('sessionId', NEW.session_id, 'ownerId', NEW.owner_id, 'ttlMs', NEW.ttl_ms));
END;

CREATE TRIGGER events_session_expired AFTER UPDATE OF expired_marked ON lock_sessions
    WHEN NEW.expired_marked AND NOT OLD.expired_marked
BEGIN
    INSERT INTO events (kind, at_ms, lock_key, body) VALUES ('session.expired',
        CAST(unixepoch('subsec') * 1000 AS INTEGER), NULL,
        json_object('sessionId', NEW.session_id, 'ownerId', NEW.owner_id));
END;

CREATE TRIGGER events_lock_granted AFTER INSERT ON lock_grants
BEGIN
    INSERT INTO events (kind, at_ms, lock_key, body) VALUES ('lock.granted',
        CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.lock_key,
        json_object('key', NEW.lock_key, 'token', NEW.fencing_token, 'sessionId', NEW.session_id,
            'ownerId', NEW.owner_id));
END;

-- A rotate writes a fresh token over the row: the release of the old grant, then the new one.
CREATE TRIGGER events_lock_rotated AFTER UPDATE OF fencing_token ON lock_grants
    WHEN OLD.fencing_token <> NEW.fencing_token
BEGIN
    INSERT INTO events (kind, at_ms, lock_key, body) VALUES ('lock.released',
        CAST(unixepoch('subsec') * 1000 AS INTEGER), OLD.lock_key,
        json_object('key', OLD.lock_key, 'token', OLD.fencing_token, 'sessionId', OLD.session_id,
            'ownerId', OLD.owner_id));
    INSERT INTO events (kind, at_ms, lock_key, body) VALUES ('lock.granted',
        CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.lock_key,
        json_object('key', NEW.lock_key, 'token', NEW.fencing_token, 'sessionId', NEW.session_id,
            'ownerId', NEW.owner_id));
END;

CREATE TRIGGER events_lock_renewed AFTER UPDATE OF expires_at_ms ON lock_grants
    WHEN OLD.fencing_token = NEW.fencing_token
BEGIN
    INSERT INTO events (kind, at_ms, lock_key, body) VALUES ('lock.renewed',
        CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.lock_key,
        json_object('key', NEW.lock_key, 'token', NEW.fencing_token, 'sessionId', NEW.session_id,
            'ownerId', NEW.owner_id));
END;

CREATE TRIGGER events_lock_revoked AFTER DELETE ON lock_grants
    WHEN EXISTS (SELECT 1 FROM lock_revocations WHERE revoked_token = OLD.fencing_token AND lock_key = OLD.lock_key)
BEGIN
    INSERT INTO events (kind, at_ms, lock_key, body)
        SELECT 'lock.revoked', CAST(unixepoch('subsec') * 1000 AS INTEGER), OLD.lock_key,
            json_object('key', OLD.lock_key, 'token', OLD.fencing_token, 'sessionId', OLD.session_id,
                'ownerId', OLD.owner_id, 'newTokenFloor', r.new_token_floor, 'revocationId', r.revocation_id,
                'operator', r.operator, 'reason', r.reason)
        FROM lock_revocations r WHERE r.revoked_token = OLD.fencing_token AND r.lock_key = OLD.lock_key;
END;

CREATE TRIGGER events_lock_removed AFTER DELETE ON lock_grants
    WHEN NOT EXISTS (SELECT 1 FROM lock_revocations WHERE revoked_token = OLD.fencing_token AND lock_key = OLD.lock_key)
BEGIN
    INSERT INTO events (kind, at_ms, lock_key, body) VALUES (
        CASE WHEN OLD.expires_at_ms <= (SELECT now_ms FROM lock_clock WHERE id = 1) OR EXISTS (
            SELECT 1 FROM lock_sessions s WHERE s.session_id = OLD.session_id
                AND s.expires_at_ms <= (SELECT now_ms FROM lock_clock WHERE id = 1))
        THEN 'lock.expired' ELSE 'lock.released' END,
        CAST(unixepoch('subsec') * 1000 AS INTEGER), OLD.lock_key,
        json_object('key', OLD.lock_key, 'token', OLD.fencing_token, 'sessionId', OLD.session_id,
            'ownerId', OLD.owner_id));
END;
