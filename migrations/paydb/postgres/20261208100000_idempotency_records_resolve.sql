-- paydb, PostgreSQL: the idempotency ledger also records an operator's resolution of a
-- quarantined payout over HTTP (POST /v1/payouts/{payoutId}/resolution, C3-extensions
-- E-21): operation 'RESOLVE', target the payout, token 0. Only the CHECK on `operation`
-- changes; every row stays as it is.

ALTER TABLE idempotency_records DROP CONSTRAINT idempotency_records_operation_check;
ALTER TABLE idempotency_records ADD CONSTRAINT idempotency_records_operation_check
    CHECK (operation IN ('CREATE_ACCOUNT', 'CREATE_PAYOUT', 'CLAIM', 'POST', 'RESOLVE'));
