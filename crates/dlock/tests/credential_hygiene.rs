//! No help text, log line or error of the real binary ever shows a database password, even
//! when every `DLOCK_*_DATABASE_URL` in the environment carries one.

#![cfg(not(madsim))]

use std::process::{Command, Output};

const SECRET: &str = "s3cret";
const URL: &str = "postgres://u:s3cret@127.0.0.1:1/x";
/// Every environment variable that names a database.
const DATABASE_URL_VARS: [&str; 5] = [
    "DLOCK_RAIL_PROXY_DATABASE_URL",
    "DLOCK_PAYMENT_RESOURCE_DATABASE_URL",
    "DLOCK_LOCK_SERVER_DATABASE_URL",
    "DLOCK_RECONCILE_DATABASE_URL",
    "DLOCK_RESOLVE_DATABASE_URL",
];

/// `dlock args…` with a password in every database URL of the environment, logging at
/// debug level.
fn dlock(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock"));
    cmd.args(args).env("DLOCK_LOG", "debug").env_remove("DLOCK_CONFIG");
    for var in DATABASE_URL_VARS {
        cmd.env(var, URL);
    }
    cmd.output().expect("run dlock")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The subcommand names listed under `Commands:` in `help`.
fn commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn help_of_every_subcommand_never_prints_a_database_password() {
    let root = dlock(&["--help"]);
    assert!(root.status.success());
    let mut paths: Vec<Vec<String>> = vec![vec![]];
    let mut i = 0;
    let mut saw_env_name = false;
    while i < paths.len() {
        let mut args: Vec<&str> = paths[i].iter().map(String::as_str).collect();
        args.push("--help");
        let out = dlock(&args);
        let help = text(&out);
        assert!(out.status.success(), "{args:?}: {help}");
        assert!(!help.contains(SECRET), "dlock {args:?} printed the password:\n{help}");
        saw_env_name |= help.contains("DLOCK_RAIL_PROXY_DATABASE_URL");
        for sub in commands(&help) {
            let mut p = paths[i].clone();
            p.push(sub);
            paths.push(p);
        }
        i += 1;
    }
    assert!(paths.len() > 10, "found only {paths:?}");
    assert!(paths.iter().any(|p| p == &["dev".to_owned(), "seed-payout".to_owned()]), "{paths:?}");
    // The variable is still documented, only its value is hidden.
    assert!(saw_env_name);
}

#[test]
fn startup_errors_never_print_a_database_password() {
    let cases: [&[&str]; 6] = [
        &["rail-proxy", "--listen", "127.0.0.1:0"],
        &["payment-resource", "--listen", "127.0.0.1:0"],
        &["lock-server", "--listen", "127.0.0.1:0"],
        &["lock-server", "--listen", "127.0.0.1:0", "--backend", "sqlite"],
        &["migrate", "--db", "paydb"],
        &["dev", "seed-payout", "--account", "acct-1", "--amount-minor", "100"],
    ];
    for args in cases {
        let out = dlock(args);
        let all = text(&out);
        assert!(!out.status.success(), "dlock {args:?} started against an unreachable database: {all}");
        assert!(all.contains("dlock: "), "dlock {args:?} gave no error: {all}");
        assert!(!all.contains(SECRET), "dlock {args:?} printed the password:\n{all}");
    }
}
