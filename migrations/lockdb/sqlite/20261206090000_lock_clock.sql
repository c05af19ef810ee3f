-- lockdb's clock: the same table as the PostgreSQL tree (docs/contracts/C1 §1.5.5).
CREATE TABLE lock_clock (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    now_ms  INTEGER NOT NULL,
    judge   TEXT    NOT NULL,
    term    INTEGER NOT NULL CHECK (term >= 0)
);
INSERT INTO lock_clock (id, now_ms, judge, term)
    VALUES (1, CAST(unixepoch('subsec') * 1000 AS INTEGER), '', 0);
