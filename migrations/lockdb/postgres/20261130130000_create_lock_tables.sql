-- lockdb, PostgreSQL: sessions, grants, seen keys (with lock-delay), the token source and
-- its floor, and the revocation audit. Instants are Unix epoch milliseconds read from the
-- database's own clock. See docs/contracts/C1.

CREATE TABLE lock_sessions (
    session_id      TEXT    PRIMARY KEY,
    owner_id        TEXT    NOT NULL,
    ttl_ms          BIGINT  NOT NULL CHECK (ttl_ms > 0),
    created_at_ms   BIGINT  NOT NULL,
    expires_at_ms   BIGINT  NOT NULL,
    -- Set by the reaper (or a close) once the lapse was processed: grants removed,
    -- lock-delay recorded. The row is kept for the retention period (SESSION_EXPIRED).
    expired_marked  BOOLEAN NOT NULL DEFAULT FALSE
);

CREATE INDEX lock_sessions_lapse_idx ON lock_sessions (expired_marked, expires_at_ms);

-- At most one grant row per key; a dead one lingers until replaced or reaped.
CREATE TABLE lock_grants (
    lock_key        TEXT   PRIMARY KEY,
    session_id      TEXT   NOT NULL REFERENCES lock_sessions (session_id) ON DELETE CASCADE,
    owner_id        TEXT   NOT NULL,
    fencing_token   BIGINT NOT NULL UNIQUE CHECK (fencing_token > 0),
    acquired_at_ms  BIGINT NOT NULL,
    expires_at_ms   BIGINT NOT NULL
);

CREATE INDEX lock_grants_session_idx ON lock_grants (session_id);
CREATE INDEX lock_grants_expiry_idx ON lock_grants (expires_at_ms);

-- Every key ever granted (L7 answers 404 for the others), and its lock-delay.
CREATE TABLE lock_keys (
    lock_key             TEXT   PRIMARY KEY,
    first_granted_at_ms  BIGINT NOT NULL,
    delay_until_ms       BIGINT NULL
);

-- One global token source. CACHE 1: no backend ever holds a block of tokens it could hand
-- out after a newer one.
CREATE SEQUENCE fencing_token_seq START WITH 1 INCREMENT BY 1 CACHE 1 NO CYCLE;

-- The floor a revoke raised; persisted so no restart or restore issues below it.
CREATE TABLE token_floor (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    floor        BIGINT  NOT NULL,
    last_issued  BIGINT  NOT NULL
);
INSERT INTO token_floor (id, floor, last_issued) VALUES (1, 0, 0);

CREATE TABLE lock_revocations (
    revocation_id    TEXT   PRIMARY KEY,
    lock_key         TEXT   NOT NULL,
    operator         TEXT   NOT NULL,
    reason           TEXT   NOT NULL CHECK (char_length(reason) >= 8),
    revoked_token    BIGINT NOT NULL,
    new_token_floor  BIGINT NOT NULL CHECK (new_token_floor > revoked_token),
    revoked_at_ms    BIGINT NOT NULL
);
