-- lockdb, SQLite: the same tables as the PostgreSQL tree. SQLite has no sequences: the
-- token source is token_floor.last_issued, advanced inside each granting transaction.

CREATE TABLE lock_sessions (
    session_id      TEXT    PRIMARY KEY NOT NULL,
    owner_id        TEXT    NOT NULL,
    ttl_ms          INTEGER NOT NULL CHECK (ttl_ms > 0),
    created_at_ms   INTEGER NOT NULL,
    expires_at_ms   INTEGER NOT NULL,
    expired_marked  BOOLEAN NOT NULL DEFAULT FALSE
);

CREATE INDEX lock_sessions_lapse_idx ON lock_sessions (expired_marked, expires_at_ms);

CREATE TABLE lock_grants (
    lock_key        TEXT    PRIMARY KEY NOT NULL,
    session_id      TEXT    NOT NULL REFERENCES lock_sessions (session_id) ON DELETE CASCADE,
    owner_id        TEXT    NOT NULL,
    fencing_token   INTEGER NOT NULL UNIQUE CHECK (fencing_token > 0),
    acquired_at_ms  INTEGER NOT NULL,
    expires_at_ms   INTEGER NOT NULL
);

CREATE INDEX lock_grants_session_idx ON lock_grants (session_id);
CREATE INDEX lock_grants_expiry_idx ON lock_grants (expires_at_ms);

CREATE TABLE lock_keys (
    lock_key             TEXT    PRIMARY KEY NOT NULL,
    first_granted_at_ms  INTEGER NOT NULL,
    delay_until_ms       INTEGER NULL
);

CREATE TABLE token_floor (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    floor        INTEGER NOT NULL,
    last_issued  INTEGER NOT NULL
);
INSERT INTO token_floor (id, floor, last_issued) VALUES (1, 0, 0);

CREATE TABLE lock_revocations (
    revocation_id    TEXT    PRIMARY KEY NOT NULL,
    lock_key         TEXT    NOT NULL,
    operator         TEXT    NOT NULL,
    reason           TEXT    NOT NULL CHECK (length(reason) >= 8),
    revoked_token    INTEGER NOT NULL,
    new_token_floor  INTEGER NOT NULL CHECK (new_token_floor > revoked_token),
    revoked_at_ms    INTEGER NOT NULL
);
