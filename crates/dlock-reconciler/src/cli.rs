//! The command-line surfaces of `dlock reconcile` and `dlock resolve`.
//!
//! The binary (`crates/dlock`) flattens these argument structs into its subcommands and
//! turns their flags into the flags layer; [`crate::config::resolve`] resolves every key
//! (flag > environment > file > default, C5) and hands the settings here. Nothing in this
//! module reads a config file.
//!
//! Keys (each flag's help starts with its key, like every other service's):
//!
//! | key | flag | default |
//! |---|---|---|
//! | `reconcile.database-url` | `dlock reconcile --database-url` | the value of `payment.resource.database-url` |
//! | `reconcile.rail-url` | `dlock reconcile --rail-url` | the value of `rail.proxy.rail-url` |
//! | `reconcile.intent-unresolved-ms-max` | `--intent-unresolved-ms-max` | 60 000 |
//! | `reconcile.acked-unposted-ms-max` | `--acked-unposted-ms-max` | 60 000 |
//! | `reconcile.record-findings` | `--record-findings` | true |
//! | `resolve.database-url` | `dlock resolve --database-url` | the value of `payment.resource.database-url` |
//!
//! Exit codes of `dlock reconcile`: 0 when every source was read and nothing
//! incident-grade was found (warnings such as quarantined payouts allowed); 1 when anything
//! incident-grade was found; 3 when nothing incident-grade was found but paydb or the rail
//! could not be read within its budget (`1 s / 30 s`, 3 tries); 2 for bad settings.
//!
//! Exit codes of `dlock resolve`: 0 resolved; 1 refused (the payout is not RAIL_AMBIGUOUS,
//! or there is no such payout; nothing changed); 2 bad input; 3 paydb could not decide or
//! its answer was lost (run the same command again to learn which).

use clap::Args;
use uuid::Uuid;

use crate::reconcile::Bounds;
use crate::resolve::{parse_operator, parse_rail_reference, parse_reason, ResolveAs};

/// Default rail URL when neither `reconcile.rail-url` nor `rail.proxy.rail-url` is set.
pub const RAIL_URL_DEFAULT: &str = "http://127.0.0.1:8084";

/// `dlock reconcile`: a detective check over paydb and the rail's own record. It reports and
/// never repairs.
#[derive(Debug, Clone, Default, Args)]
pub struct ReconcileArgs {
    /// [reconcile.database-url] paydb to check: sqlite://PATH or postgres://... (default: payment.resource.database-url).
    #[arg(long, env = "DLOCK_RECONCILE_DATABASE_URL", value_name = "URL")]
    pub database_url: Option<String>,
    /// [reconcile.rail-url] Base URL of the rail whose own record (GET /calls) is read (default: rail.proxy.rail-url).
    #[arg(long, env = "DLOCK_RECONCILE_RAIL_URL", value_name = "URL")]
    pub rail_url: Option<String>,
    /// Print the report as JSON (camelCase) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// [reconcile.intent-unresolved-ms-max] Report an intent row still unresolved after this long.
    #[arg(long, env = "DLOCK_RECONCILE_INTENT_UNRESOLVED_MS_MAX", value_name = "MS")]
    pub intent_unresolved_ms_max: Option<u64>,
    /// [reconcile.acked-unposted-ms-max] Report a RAIL_ACKED payout not POSTED after this long.
    #[arg(long, env = "DLOCK_RECONCILE_ACKED_UNPOSTED_MS_MAX", value_name = "MS")]
    pub acked_unposted_ms_max: Option<u64>,
    /// [reconcile.record-findings] Record the findings in paydb (open and cleared, each a reconciler.finding event) (default true).
    #[arg(long, env = "DLOCK_RECONCILE_RECORD_FINDINGS", value_name = "BOOL")]
    pub record_findings: Option<bool>,
}

/// What the audit row records as the reference of a `--as failed` verdict given none.
pub const NO_RAIL_REFERENCE: &str = "none";

/// `dlock resolve PAYOUT --as posted|failed ...`: an operator's audited verdict on a
/// RAIL_AMBIGUOUS payout, backed by a rail reference.
#[derive(Debug, Clone, Args)]
pub struct ResolveArgs {
    /// The RAIL_AMBIGUOUS payout (its id).
    #[arg(value_name = "PAYOUT")]
    pub payout: Uuid,
    /// posted: the rail paid (writes the ledger entries); failed: it did not (releases the reservation).
    #[arg(long = "as", value_enum, value_name = "VERDICT")]
    pub resolved_as: ResolveAs,
    /// Who resolves (1 to 64 visible ASCII characters), for the audit row.
    #[arg(long, value_parser = parse_operator, value_name = "NAME")]
    pub operator: String,
    /// Why (at least 8 characters): what the rail's statement shows.
    #[arg(long, value_parser = parse_reason, value_name = "TEXT")]
    pub reason: String,
    /// The rail's reference (or statement line) the verdict rests on. Required with
    /// `--as posted`; with `--as failed` (the rail shows no payment) it defaults to `none`.
    #[arg(long, value_parser = parse_rail_reference, value_name = "REF")]
    pub rail_reference: Option<String>,
    /// [resolve.database-url] paydb: sqlite://PATH or postgres://... (default: payment.resource.database-url).
    #[arg(long, env = "DLOCK_RESOLVE_DATABASE_URL", value_name = "URL")]
    pub database_url: Option<String>,
}

impl ResolveArgs {
    pub fn request(&self) -> crate::resolve::ResolveRequest {
        crate::resolve::ResolveRequest {
            payout_id: self.payout,
            resolved_as: self.resolved_as,
            operator: self.operator.clone(),
            reason: self.reason.clone(),
            rail_reference: match (&self.rail_reference, self.resolved_as) {
                (Some(r), _) => r.clone(),
                // Refused by `validate`: a payment is settled only from the rail's reference.
                (None, ResolveAs::Posted) => String::new(),
                (None, ResolveAs::Failed) => NO_RAIL_REFERENCE.to_owned(),
            },
        }
    }
}

/// Every `dlock reconcile` setting, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileSettings {
    pub database_url: String,
    pub rail_url: String,
    pub json: bool,
    pub bounds: Bounds,
    /// `reconcile.record-findings`: record the run's findings in paydb (`crate::record`).
    pub record_findings: bool,
}

#[cfg(not(madsim))]
pub use run::{reconcile_once, run_reconcile, run_resolve};

#[cfg(not(madsim))]
mod run {
    use std::process::ExitCode;

    use chrono::{DateTime, Utc};
    use dlock_rt::http::BaseUrl;

    use super::{ReconcileSettings, ResolveArgs};
    use crate::budget::ReadBudget;
    use crate::rail::HttpRailRecord;
    use crate::reconcile::{reconcile, reconcile_without_paydb, Params};
    use crate::report::Report;
    use crate::resolve::ResolveError;

    /// One run at `now` with `budget`. `Err` only for settings that cannot be used (exit
    /// code 2); an unreadable source is a report (exit code 3).
    pub async fn reconcile_once(
        s: &ReconcileSettings,
        now: DateTime<Utc>,
        budget: ReadBudget,
    ) -> Result<Report, String> {
        let base = BaseUrl::parse(&s.rail_url).map_err(|e| format!("reconcile.rail-url: {e}"))?;
        dlock_db::Dialect::of_url(&s.database_url).map_err(|e| format!("reconcile.database-url: {e}"))?;
        let rail = HttpRailRecord::new(base, &budget);
        let params = Params { now, bounds: s.bounds, budget };
        Ok(match crate::open::open_paydb(&s.database_url, &budget).await {
            Ok(paydb) => {
                let report = reconcile(&paydb, &rail, &params).await;
                if s.record_findings {
                    // Recording is a report's side note: a paydb that refuses the write (an
                    // older schema, a read-only role) leaves the report and its exit code as
                    // they are, and says so.
                    match crate::record::record(paydb.store.as_ref(), &report).await {
                        Ok(Some(o)) => tracing::info!(
                            opened = o.opened,
                            cleared = o.cleared,
                            open = o.open,
                            dropped = o.dropped,
                            "reconcile_findings_recorded"
                        ),
                        Ok(None) => {}
                        Err(e) => {
                            tracing::warn!(cause = %e, "reconcile_findings_not_recorded");
                            eprintln!("dlock: the findings were not recorded in paydb: {e}");
                        }
                    }
                }
                report
            }
            Err(e) => {
                let source = crate::open::describe_url(&s.database_url);
                reconcile_without_paydb(&source, &e.to_string(), &rail, &params).await
            }
        })
    }

    /// `dlock reconcile`: prints the report (a table, or JSON with `--json`) to stdout and
    /// returns its exit code (module doc).
    pub async fn run_reconcile(s: &ReconcileSettings) -> ExitCode {
        let now = dlock_rt::Clock::system().wall();
        let report = match reconcile_once(s, now, ReadBudget::default()).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("dlock: {e}");
                return ExitCode::from(2);
            }
        };
        if s.json {
            match serde_json::to_string_pretty(&report) {
                Ok(text) => println!("{text}"),
                Err(e) => {
                    eprintln!("dlock: cannot render the report: {e}");
                    return ExitCode::from(2);
                }
            }
        } else {
            print!("{}", report.render_table());
        }
        tracing::info!(
            exitCode = report.exit_code(),
            incidents = report.incidents,
            warnings = report.warnings,
            clean = report.clean,
            "reconcile_finished"
        );
        ExitCode::from(report.exit_code())
    }

    /// `dlock resolve`, against the paydb at `database_url` (resolved by the caller from
    /// `resolve.database-url`): prints one line and returns the exit code (module doc).
    pub async fn run_resolve(args: &ResolveArgs, database_url: &str) -> ExitCode {
        let req = args.request();
        if let Err(e) = req.validate() {
            eprintln!("dlock: {e}");
            return ExitCode::from(2);
        }
        let store = match crate::open::open_migrated(database_url).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("dlock: paydb: {e}");
                return ExitCode::from(3);
            }
        };
        let now = dlock_rt::Clock::system().wall();
        match crate::resolve::resolve(&store, &req, now).await {
            Ok(r) => {
                println!(
                    "payout {} resolved as {} by {} (resolution {}); the account's balance is now {}",
                    req.payout_id,
                    r.state.as_str(),
                    req.operator,
                    r.resolution_id,
                    r.balance_minor
                );
                ExitCode::SUCCESS
            }
            Err(ResolveError::Invalid(e)) => {
                eprintln!("dlock: {e}");
                ExitCode::from(2)
            }
            Err(ResolveError::Refused(e)) => {
                eprintln!("dlock: refused: {e}");
                ExitCode::from(1)
            }
            Err(e @ ResolveError::Store(_)) => {
                eprintln!("dlock: {e} (run the same command again: a committed resolution answers that the payout is no longer RAIL_AMBIGUOUS)");
                ExitCode::from(3)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Debug, clap::Subcommand)]
    enum Command {
        Reconcile(ReconcileArgs),
        Resolve(ResolveArgs),
    }

    fn env_name(key: &str) -> String {
        format!("DLOCK_{}", key.to_ascii_uppercase().replace(['.', '-'], "_"))
    }

    #[test]
    fn reconcile_and_resolve_flags_name_their_config_keys() {
        let cmd = Cli::command();
        cmd.clone().debug_assert();
        let mut keys = Vec::new();
        for sub in cmd.get_subcommands() {
            for arg in sub.get_arguments() {
                let Some(help) = arg.get_help().map(|h| h.to_string()) else { continue };
                let Some(key) = help.strip_prefix('[').and_then(|h| h.split(']').next()) else { continue };
                let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
                assert_eq!(env, Some(env_name(key)), "{key}");
                keys.push(key.to_owned());
            }
        }
        assert_eq!(
            keys,
            [
                "reconcile.database-url",
                "reconcile.rail-url",
                "reconcile.intent-unresolved-ms-max",
                "reconcile.acked-unposted-ms-max",
                "reconcile.record-findings",
                "resolve.database-url"
            ]
        );
    }

    #[test]
    fn resolve_parses_its_verdict_and_refuses_bad_input_at_the_command_line() {
        let p = Uuid::new_v4().to_string();
        let ok = Cli::try_parse_from([
            "dlock",
            "resolve",
            &p,
            "--as",
            "posted",
            "--operator",
            "ops-alice",
            "--reason",
            "statement line 42",
            "--rail-reference",
            "RR-1",
        ])
        .expect("parses");
        let Command::Resolve(a) = ok.command else { panic!("not resolve") };
        assert_eq!((a.resolved_as, a.operator.as_str(), a.database_url), (ResolveAs::Posted, "ops-alice", None));
        let base = ["dlock", "resolve", &p, "--operator", "ops", "--rail-reference", "RR-1"];
        let with = |extra: &[&'static str]| base.iter().copied().chain(extra.iter().copied()).collect::<Vec<&str>>();
        assert!(Cli::try_parse_from(with(&["--as", "failed", "--reason", "statement line 42"])).is_ok());
        for (extra, why) in [
            (&["--as", "failed", "--reason", "short"][..], "reason under 8 characters"),
            (&["--as", "maybe", "--reason", "statement line 42"][..], "unknown verdict"),
            (&["--as", "failed"][..], "--reason is required"),
            (&["--reason", "statement line 42"][..], "--as is required"),
        ] {
            assert!(Cli::try_parse_from(with(extra)).is_err(), "{why}");
        }
        assert!(Cli::try_parse_from(["dlock", "resolve", "not-a-uuid", "--as", "failed"]).is_err());
    }
}

#[cfg(test)]
mod resolve_args_tests {
    use super::*;

    fn args(resolved_as: ResolveAs, rail_reference: Option<&str>) -> ResolveArgs {
        ResolveArgs {
            payout: Uuid::nil(),
            resolved_as,
            operator: "alice".into(),
            reason: "statement line 42 shows it".into(),
            rail_reference: rail_reference.map(str::to_owned),
            database_url: None,
        }
    }

    #[test]
    fn resolve_as_posted_needs_a_rail_reference_and_as_failed_does_not() {
        assert!(args(ResolveAs::Posted, None).request().validate().is_err_and(|e| e.contains("--rail-reference")));
        assert_eq!(args(ResolveAs::Posted, Some("RR-1")).request().validate(), Ok(()));
        let failed = args(ResolveAs::Failed, None).request();
        assert_eq!(failed.validate(), Ok(()));
        assert_eq!(failed.rail_reference, NO_RAIL_REFERENCE);
    }
}
