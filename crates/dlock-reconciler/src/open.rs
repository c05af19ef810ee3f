//! Opening paydb for the reconciler: read only in intent. It applies no migration (the
//! services own the schema) and never creates a SQLite file: a wrong path is an unreadable
//! source, not a fresh empty paydb that would look clean.

use std::sync::Arc;

use dlock_db::Dialect;
use dlock_paydb::sql::{db_error, PG_MIGRATOR, SQLITE_MIGRATOR};
use dlock_paydb::StoreError;

use crate::budget::{with_budget, BudgetExhausted, ReadBudget, ReadError};
use crate::reconcile::Paydb;
use crate::store::SqlPaydb;

/// `url` without credentials or query: what the report may show.
pub fn describe_url(url: &str) -> String {
    let base = url.split('?').next().unwrap_or(url);
    match base.split_once("://") {
        Some((scheme, rest)) if scheme.starts_with("postgres") => {
            let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}/{path}")
        }
        _ => base.to_owned(),
    }
}

/// Connects to paydb at `url` within the connect budget (`budget.connect_timeout_ms` per
/// try, `budget.tries_max` tries).
pub async fn open_paydb(url: &str, budget: &ReadBudget) -> Result<Paydb, BudgetExhausted> {
    let what = "connect to paydb";
    let dialect = Dialect::of_url(url).map_err(|e| BudgetExhausted {
        what: what.into(),
        tries: 0,
        tries_max: budget.tries_max,
        message: e,
    })?;
    let describe = describe_url(url);
    match dialect {
        Dialect::Sqlite => {
            if let Some(path) = dlock_db::sqlite_path(url) {
                if !std::path::Path::new(path).is_file() {
                    return Err(BudgetExhausted {
                        what: what.into(),
                        tries: 0,
                        tries_max: budget.tries_max,
                        message: format!("no paydb file at {path}"),
                    });
                }
            }
            let pool = with_budget(budget, budget.connect_timeout_ms, what, move || async move {
                dlock_db::sqlite_pool(url).await.map_err(|e| ReadError::transient(dlock_db::describe(&e)))
            })
            .await?;
            Ok(Paydb { store: Arc::new(SqlPaydb::Sqlite(pool)), describe })
        }
        Dialect::Postgres => {
            let pool = with_budget(budget, budget.connect_timeout_ms, what, move || async move {
                dlock_db::pg_pool(url).await.map_err(|e| ReadError::transient(dlock_db::describe(&e)))
            })
            .await?;
            Ok(Paydb { store: Arc::new(SqlPaydb::Postgres(pool)), describe })
        }
    }
}

/// Opens paydb at `url` for `dlock resolve`, applying pending migrations first (as the
/// services do when they open it: a resolve against a fresh paydb finds the schema).
pub async fn open_migrated(url: &str) -> Result<SqlPaydb, StoreError> {
    let migrate = |e: sqlx::migrate::MigrateError| StoreError::Unavailable(format!("migrate: {e}"));
    match Dialect::of_url(url).map_err(StoreError::Unavailable)? {
        Dialect::Postgres => {
            let pool = dlock_db::pg_pool(url).await.map_err(db_error)?;
            PG_MIGRATOR.run(&pool).await.map_err(migrate)?;
            Ok(SqlPaydb::Postgres(pool))
        }
        Dialect::Sqlite => {
            let pool = dlock_db::sqlite_pool(url).await.map_err(db_error)?;
            SQLITE_MIGRATOR.run(&pool).await.map_err(migrate)?;
            Ok(SqlPaydb::Sqlite(pool))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_never_shows_credentials() {
        assert_eq!(
            describe_url("postgres://user:secret@db.example:5432/paydb?sslmode=require&password=x"),
            "postgres://db.example:5432/paydb"
        );
        assert_eq!(describe_url("postgresql://u@h/p"), "postgresql://h/p");
        assert_eq!(describe_url("sqlite://dlock-data/paydb.sqlite"), "sqlite://dlock-data/paydb.sqlite");
    }

    #[tokio::test]
    async fn a_missing_sqlite_file_is_not_created_and_not_read() {
        let dir = dlock_testkit::TempDir::new("reconcile-missing");
        let url = dlock_testkit::sqlite_url(&dir);
        let Err(e) = open_paydb(&url, &ReadBudget::default()).await else {
            panic!("opened a paydb that does not exist");
        };
        assert!(e.message.contains("no paydb file"), "{e}");
        assert!(!dir.path().join("paydb.sqlite").exists(), "the reconciler created a file");
    }
}
