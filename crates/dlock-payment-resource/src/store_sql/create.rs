//! The creates (P0 account, P1 payout) and the operator's writes (abandon, the resolution
//! of an ambiguous payout).
//!
//! Holds the inherent fns `run_create_account`, `run_create_payout` (each one deciding
//! transaction: the identity gate, [`super::gate`], then the create, its answer recorded
//! before the commit), `create_account_in`, `create_payout_in`, `run_abandon`,
//! `run_resolve_ambiguous` and `run_resolve_recorded` (the resolution of C3-extensions E-21:
//! the identity gate, then the same resolution, its answer recorded before the commit),
//! stamped for both stores by `create_op!`.
//!
//! Invariants: a create that commits records its answer in the identity row; one that
//! refuses (exists, unknown account, currency mismatch) rolls back, identity row included.
//! A payout this store created is remembered with its account from its commit
//! ([`crate::payout_accounts::PayoutAccounts`]). An abandon moves only from the states C2
//! allows an operator's abandon from.

use chrono::{DateTime, Utc};
use dlock_contract::payout::{self, Actor, PayoutState};
use dlock_contract::time::truncate_ms;
use sqlx::Row;
use uuid::Uuid;

use super::{PgPaymentStore, SqlitePaymentStore};
use crate::answer;
use crate::store::{
    funding_account, settlement_account, AbandonOutcome, AccountKind, AccountView, AmbiguousResolution, Answering,
    CreateAccountOutcome, CreatePayoutOutcome, Decided, IdemRequest, Idempotent, NewAccount, NewPayout, PayoutView,
    ResolveOutcome, StoreError,
};
use dlock_paydb::sql::{commit_error, db_error, parse_kind, parse_state};

/// Stamps the creates' and operator writes' inherent fns for a store: `$db` its database,
/// `$sql` its placeholder form, `$paydb` its `dlock_paydb::sql` module.
macro_rules! create_op {
    ($store:ty, $db:ty, $sql:path, $paydb:ident) => {
        impl $store {
            pub(super) async fn run_create_account(
                &self,
                a: &NewAccount,
                i: &IdemRequest,
                how: &Answering,
            ) -> Decided<CreateAccountOutcome> {
                let mut tx = match self.begin(i).await? {
                    Ok(tx) => tx,
                    Err(answer) => return Ok(answer),
                };
                let outcome = Self::create_account_in(&mut tx, a).await?;
                Self::finish(tx, i, outcome, |o| answer::account_created(o, &how.trace_id)).await
            }

            pub(super) async fn run_create_payout(
                &self,
                p: &NewPayout,
                i: &IdemRequest,
                a: &Answering,
            ) -> Decided<CreatePayoutOutcome> {
                let mut tx = match self.begin(i).await? {
                    Ok(tx) => tx,
                    Err(answer) => return Ok(answer),
                };
                let outcome = Self::create_payout_in(&mut tx, p).await?;
                let decided = Self::finish(tx, i, outcome, |o| answer::payout_created(o, &a.trace_id)).await?;
                if let Idempotent::Executed { outcome: CreatePayoutOutcome::Created(view), stored: Some(_) } = &decided {
                    // Committed: the payout's first fenced write need not read its account.
                    self.accounts.remember(view.payout_id, &view.account_id);
                }
                Ok(decided)
            }

            pub(super) async fn run_abandon(&self, payout_id: Uuid, at: DateTime<Utc>) -> Result<AbandonOutcome, StoreError> {
                let mut tx = self.pool.begin().await.map_err(db_error)?;
                // The source states C2 allows an operator's abandon from.
                let from = payout::sql_states(&payout::sources(PayoutState::Abandoned, Actor::Operator));
                let q = $sql(&format!(
                    "UPDATE payouts SET state = 'ABANDONED', updated_at = $2 WHERE payout_id = $1 AND state IN {from}"
                ))
                .into_owned();
                let moved = sqlx::query(&q)
                    .bind(payout_id.to_string())
                    .bind(truncate_ms(at))
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?
                    .rows_affected();
                if moved == 1 {
                    tx.commit().await.map_err(commit_error)?;
                    return Ok(AbandonOutcome::Abandoned);
                }
                let q = $sql("SELECT state FROM payouts WHERE payout_id = $1");
                let state = sqlx::query(&q)
                    .bind(payout_id.to_string())
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db_error)?;
                tx.rollback().await.map_err(db_error)?;
                match state {
                    None => Ok(AbandonOutcome::NotFound),
                    Some(r) => Ok(AbandonOutcome::NotAbandonable { state: parse_state(&get!(r, "state", String))? }),
                }
            }

            pub(super) async fn run_resolve_ambiguous(&self, r: &AmbiguousResolution) -> Result<ResolveOutcome, StoreError> {
                dlock_paydb::sql::$paydb::resolve_ambiguous(&self.pool, r).await
            }

            pub(super) async fn run_resolve_recorded(
                &self,
                r: &AmbiguousResolution,
                i: &IdemRequest,
                a: &Answering,
            ) -> Decided<ResolveOutcome> {
                r.check()?;
                let mut tx = match self.begin(i).await? {
                    Ok(tx) => tx,
                    Err(answer) => return Ok(answer),
                };
                let outcome = dlock_paydb::sql::$paydb::resolve_in(&mut tx, r).await?;
                Self::finish(tx, i, outcome, |o| answer::resolved(o, r, &a.trace_id)).await
            }

            pub(super) async fn create_account_in(
                tx: &mut sqlx::Transaction<'static, $db>,
                a: &NewAccount,
            ) -> Result<CreateAccountOutcome, StoreError> {
                let at = truncate_ms(a.at);
                let funding = funding_account(&a.currency);
                let system = [
                    (funding.clone(), AccountKind::Funding),
                    (settlement_account(&a.currency), AccountKind::Settlement),
                ];
                dlock_paydb::sql::$paydb::upsert_system_accounts(tx, &system, &a.currency, at).await?;
                let q = $sql(
                    "INSERT INTO accounts (account_id, kind, currency, balance_minor, fence, created_at, updated_at) \
                     VALUES ($1, 'CUSTOMER', $2, $3, 0, $4, $4) ON CONFLICT (account_id) DO NOTHING \
                     RETURNING account_id",
                );
                let created = sqlx::query(&q)
                    .bind(a.account_id.clone())
                    .bind(a.currency.clone())
                    .bind(a.opening_balance_minor)
                    .bind(at)
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(db_error)?;
                if created.is_none() {
                    return Ok(CreateAccountOutcome::Exists);
                }
                for e in a.opening_entries(at) {
                    dlock_paydb::sql::$paydb::insert_entry(tx, &e).await?;
                }
                Ok(CreateAccountOutcome::Created(AccountView {
                    account_id: a.account_id.clone(),
                    kind: AccountKind::Customer,
                    currency: a.currency.clone(),
                    balance_minor: a.opening_balance_minor,
                    fence: 0,
                    ledger_sum_minor: a.opening_balance_minor,
                    reserved_minor: 0,
                    created_at: at,
                    updated_at: at,
                }))
            }

            pub(super) async fn create_payout_in(
                tx: &mut sqlx::Transaction<'static, $db>,
                p: &NewPayout,
            ) -> Result<CreatePayoutOutcome, StoreError> {
                let at = truncate_ms(p.at);
                let q = $sql("SELECT kind, currency FROM accounts WHERE account_id = $1");
                let account = sqlx::query(&q)
                    .bind(p.account_id.clone())
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(db_error)?;
                let Some(account) = account else {
                    return Ok(CreatePayoutOutcome::UnknownAccount);
                };
                if parse_kind(&get!(account, "kind", String))? != AccountKind::Customer {
                    return Ok(CreatePayoutOutcome::UnknownAccount);
                }
                let account_currency: String = get!(account, "currency");
                if account_currency != p.currency {
                    return Ok(CreatePayoutOutcome::CurrencyMismatch { account_currency });
                }
                let q = $sql(
                    "INSERT INTO payouts (payout_id, account_id, amount_minor, currency, beneficiary_ref, state, \
                     attempt_count, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, 'PENDING', 0, $6, $6) \
                     ON CONFLICT (payout_id) DO NOTHING RETURNING payout_id",
                );
                let created = sqlx::query(&q)
                    .bind(p.payout_id.to_string())
                    .bind(p.account_id.clone())
                    .bind(p.amount_minor)
                    .bind(p.currency.clone())
                    .bind(p.beneficiary_ref.clone())
                    .bind(at)
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(db_error)?;
                if created.is_none() {
                    return Ok(CreatePayoutOutcome::PayoutExists);
                }
                Ok(CreatePayoutOutcome::Created(PayoutView {
                    payout_id: p.payout_id,
                    account_id: p.account_id.clone(),
                    amount_minor: p.amount_minor,
                    currency: p.currency.clone(),
                    beneficiary_ref: p.beneficiary_ref.clone(),
                    state: PayoutState::Pending,
                    attempt_count: 0,
                    claim_token: None,
                    claimed_by: None,
                    claimed_at: None,
                    created_at: at,
                    updated_at: at,
                    submissions: Vec::new(),
                }))
            }
        }
    };
}

create_op!(PgPaymentStore, sqlx::Postgres, super::pg_sql, pg);
create_op!(SqlitePaymentStore, sqlx::Sqlite, super::sqlite_sql, sqlite);
