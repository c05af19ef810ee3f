-- paydb, PostgreSQL: the reconciler's open findings (docs/design/reconciler.md, "Recorded
-- findings"). One row per problem the last recorded run found and no later complete run
-- has cleared, keyed by what the problem is about (`finding_key`: kind, payout, account,
-- and, for an ambiguous payout, the rail's classification). The reconciler writes a row
-- and its `reconciler.finding` event (status `open`) in one transaction, and deletes a row
-- with its event (status `cleared`) in the same way; no trigger writes here.

CREATE TABLE reconciler_findings (
    finding_key  TEXT        PRIMARY KEY CHECK (length(finding_key) BETWEEN 1 AND 512),
    kind         TEXT        NOT NULL,
    severity     TEXT        NOT NULL CHECK (severity IN ('incident', 'warning')),
    account_id   TEXT        NULL,
    payout_id    TEXT        NULL,
    class        TEXT        NULL CHECK (class IN ('PAID', 'NOT_PAID', 'UNKNOWN')),
    detail       TEXT        NOT NULL,
    run_id       TEXT        NOT NULL,
    opened_at    TIMESTAMPTZ NOT NULL
);
