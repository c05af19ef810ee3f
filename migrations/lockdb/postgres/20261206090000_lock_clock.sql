-- lockdb's clock (docs/contracts/C1 §1.5.5): the one clock every lease on this database is
-- judged by. It advances only by durations one lock-server replica, the judge, measured on
-- its monotonic clock; no wall clock moves it, the database host's included. It starts at
-- the database's wall time here, so stored instants read as dates to a human.
CREATE TABLE lock_clock (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    -- lockdb's now, epoch ms: advanced by the judge's ticks only.
    now_ms  BIGINT  NOT NULL,
    -- The replica that advances it ('' : none), and its term (each takeover adds one).
    judge   TEXT    NOT NULL,
    term    BIGINT  NOT NULL CHECK (term >= 0)
);
INSERT INTO lock_clock (id, now_ms, judge, term)
    VALUES (1, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT, '', 0);
