//! The packaging and deploy assets (`deploy/docker/`, `deploy/compose/`, `deploy/k8s/`,
//! `deploy/systemd/`) speak about a `dlock` that exists, probe what C4 pins, and carry no
//! secret:
//!
//! - every `dlock <subcommand>` they run exists, every flag they pass is in its `--help`,
//!   and every `DLOCK_*` variable they set is a key of that service (its crate's `KEYS`,
//!   the shared `auth.*`, `tls.*`, `http.*` and `profile` keys, or a variable its `--help`
//!   lists); a file that names no service (the ConfigMap, the README) may only use keys
//!   some service has;
//! - every liveness probe asks `/health/live` and every readiness probe (and every compose
//!   healthcheck, which gates `depends_on`) `/health/ready` (C4 §4.6), every Deployment
//!   has both, and every Deployment has a PodDisruptionBudget;
//! - no file under `deploy/` holds something that looks like a secret value (a 32+ hex
//!   run, a 40+ character base64 run, a PEM private key, a password in a URL);
//! - `scripts/test.sh` runs the pinned schema checker on `deploy/k8s/` and the compose
//!   check on the compose file.
//!
//! The parsers are line-based over the restricted YAML style these files use (one key per
//! line, flow lists for `args`/`command`); each check has a unit test on a bad input.

#![cfg(not(madsim))]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Shortest run of hex digits taken for a secret (a 16-byte key is 32 hex digits).
const HEX_SECRET_CHARS_MIN: usize = 32;
/// Shortest run of base64 characters (mixed case and digits) taken for a secret (an
/// Ed25519 key in base64 is 44).
const BASE64_SECRET_CHARS_MIN: usize = 40;

/// Variables every subcommand reads besides its keys (C5 §5.2: `--config`, the log).
const PROCESS_VARS: [&str; 3] = ["DLOCK_CONFIG", "DLOCK_LOG", "DLOCK_LOG_FORMAT"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every file under `deploy/` (relative paths, sorted), the git-ignored secrets excepted.
fn deploy_files() -> Vec<String> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).collect();
        entries.sort_by_key(|e| e.as_ref().map(|e| e.path()).ok());
        for entry in entries {
            let path = entry.expect("dir entry").path();
            let rel = path.strip_prefix(base).expect("under root").to_string_lossy().into_owned();
            if rel == "deploy/secrets" {
                continue;
            }
            if path.is_dir() {
                walk(&path, base, out);
            } else {
                out.push(rel);
            }
        }
    }
    let base = root().canonicalize().expect("root");
    let mut out = Vec::new();
    walk(&base.join("deploy"), &base, &mut out);
    out
}

// ---------------------------------------------------------------------------------------
// keys
// ---------------------------------------------------------------------------------------

/// The keys every service reads (C5): profile, http, tls, auth.
fn common_keys() -> Vec<&'static str> {
    let mut keys = vec![dlock_config::PROFILE_KEY, "http.header-bytes-max", "trace.file"];
    keys.extend_from_slice(dlock_config::tls::KEYS);
    keys.extend_from_slice(dlock_http::auth::KEYS);
    keys
}

/// The keys of one subcommand's service (`None`: not a service subcommand we know).
fn service_keys(sub: &str) -> Option<&'static [&'static str]> {
    Some(match sub {
        "lock-server" => dlock_lock_server::config::KEYS,
        "payment-resource" => dlock_payment_resource::config::KEYS,
        "rail-proxy" => dlock_rail_proxy::config::KEYS,
        "rail-stub" => dlock_rail_stub::config::KEYS,
        "executor" => dlock_executor::config::KEYS,
        "reconcile" | "resolve" => dlock_reconciler::config::KEYS,
        // `dlock migrate` reads the database URL keys of paydb and lockdb.
        "migrate" => &["rail.proxy.database-url", "lock.server.database-url"],
        _ => return None,
    })
}

/// `DLOCK_*` variables a subcommand accepts: its keys, the common keys, the process
/// variables, and every `[env: ...]` its `--help` lists.
fn allowed_vars(sub: &str, help: &str) -> BTreeSet<String> {
    let mut vars: BTreeSet<String> = PROCESS_VARS.iter().map(|v| v.to_string()).collect();
    for key in common_keys().into_iter().chain(service_keys(sub).unwrap_or(&[]).iter().copied()) {
        vars.insert(dlock_config::env_name(key));
    }
    vars.extend(dlock_vars(help));
    vars
}

/// The variables any service accepts (for files that name no service).
fn any_service_vars() -> BTreeSet<String> {
    let mut vars: BTreeSet<String> = PROCESS_VARS.iter().map(|v| v.to_string()).collect();
    for sub in ["lock-server", "payment-resource", "rail-proxy", "rail-stub", "executor", "reconcile", "migrate"] {
        for key in common_keys().into_iter().chain(service_keys(sub).unwrap_or(&[]).iter().copied()) {
            vars.insert(dlock_config::env_name(key));
        }
    }
    vars
}

/// Every `DLOCK_[A-Z0-9_]+` token in `text` that starts a word; a `_FROM_FILE` suffix
/// (deploy/docker/entrypoint: the value comes from a file) is dropped.
fn dlock_vars(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut out = BTreeSet::new();
    let mut i = 0;
    while let Some(pos) = text[i..].find("DLOCK_") {
        let start = i + pos;
        let word_start = start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start + "DLOCK_".len();
        while end < bytes.len()
            && (bytes[end].is_ascii_uppercase() || bytes[end].is_ascii_digit() || bytes[end] == b'_')
        {
            end += 1;
        }
        let token = text[start..end].trim_end_matches('_');
        if word_start && token.len() > "DLOCK".len() {
            out.insert(token.strip_suffix("_FROM_FILE").unwrap_or(token).to_owned());
        }
        i = end.max(start + 1);
    }
    out
}

/// The items of a YAML flow list on one line (`args: ["a", "--b"]` -> a, --b).
fn flow_list(line: &str) -> Option<Vec<String>> {
    let (_, rest) = line.split_once(':')?;
    let inner = rest.trim().strip_prefix('[')?.strip_suffix(']')?;
    Some(
        inner
            .split(',')
            .map(|s| s.trim().trim_matches('"').trim_matches('\'').to_owned())
            .filter(|s| !s.is_empty())
            .collect(),
    )
}

/// What one unit of a deploy file runs: the subcommand and flags, and the variables it sets.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Unit {
    /// Where it is (file and unit name), for messages.
    name: String,
    /// `[subcommand, flags...]`; empty when the unit runs no dlock (postgres, a ConfigMap).
    argv: Vec<String>,
    vars: BTreeSet<String>,
}

/// A compose file's services (the lines under `services:` at indent 2 start a service;
/// `command:` is its dlock argv). Lines outside `services:` form a unit of their own.
fn compose_units(file: &str, text: &str) -> Vec<Unit> {
    let mut units = vec![Unit { name: format!("{file} (outside services)"), ..Unit::default() }];
    let mut in_services = false;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let body = line.trim();
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        if indent == 0 {
            in_services = body == "services:";
            units.push(Unit { name: format!("{file} top-level {body}"), ..Unit::default() });
            continue;
        }
        // `name:` or `name: &anchor` starts a service.
        let header = body
            .split_once(':')
            .filter(|(k, v)| !k.starts_with('-') && (v.is_empty() || v.trim_start().starts_with('&')));
        if let (true, 2, Some((name, _))) = (in_services, indent, header) {
            units.push(Unit { name: format!("{file} service {name}"), ..Unit::default() });
            continue;
        }
        let unit = units.last_mut().expect("one unit");
        if in_services && body.starts_with("command:") {
            unit.argv = flow_list(body).unwrap_or_default();
        }
        unit.vars.extend(dlock_vars(line));
    }
    units
}

/// A multi-document Kubernetes file's documents (`args:` is the dlock argv).
fn k8s_units(file: &str, text: &str) -> Vec<Unit> {
    text.split("\n---")
        .enumerate()
        .map(|(n, doc)| {
            let mut unit = Unit { name: format!("{file} document {n}"), ..Unit::default() };
            for line in doc.lines().filter(|l| !l.trim_start().starts_with('#')) {
                if line.trim_start().starts_with("args:") {
                    unit.argv = flow_list(line).unwrap_or_default();
                }
            }
            // Comments count too: a variable a comment tells the reader to set must exist.
            unit.vars = dlock_vars(doc);
            unit
        })
        .collect()
}

/// A systemd unit: `ExecStart=/usr/local/bin/dlock SUB FLAGS...`.
fn systemd_unit(file: &str, text: &str) -> Unit {
    let mut unit = Unit { name: file.to_owned(), vars: dlock_vars(text), ..Unit::default() };
    for line in text.lines() {
        if let Some(cmd) = line.strip_prefix("ExecStart=") {
            let mut words = cmd.split_whitespace();
            if words.next().is_some_and(|bin| bin.ends_with("/dlock")) {
                unit.argv = words.map(str::to_owned).collect();
            }
        }
    }
    unit
}

/// Every unit of every deploy file that can run or configure dlock.
fn all_units() -> Vec<Unit> {
    let mut units = Vec::new();
    for file in deploy_files() {
        let text = read(&file);
        if file.starts_with("deploy/compose/") && file.ends_with(".yaml") {
            units.extend(compose_units(&file, &text));
        } else if file.starts_with("deploy/k8s/") {
            units.extend(k8s_units(&file, &text));
        } else if file.starts_with("deploy/systemd/") {
            units.push(systemd_unit(&file, &text));
        } else {
            units.push(Unit { name: file.clone(), vars: dlock_vars(&text), ..Unit::default() });
        }
    }
    units
}

/// `dlock SUB --help`, or why it failed.
fn help_of(sub: &str) -> Result<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock")).args([sub, "--help"]).output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("dlock {sub} --help exited {}: {}", out.status, String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The problems of one unit: an unknown subcommand, a flag not in its help, a variable
/// not among its keys.
fn unit_problems(
    unit: &Unit,
    help: &mut dyn FnMut(&str) -> Result<String, String>,
    any: &BTreeSet<String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(sub) = unit.argv.first() else {
        for var in unit.vars.difference(any) {
            problems.push(format!("{}: {var} is no key of any dlock service", unit.name));
        }
        return problems;
    };
    if service_keys(sub).is_none() {
        problems.push(format!("{}: `dlock {sub}` is not a service subcommand", unit.name));
    }
    let text = match help(sub) {
        Ok(text) => text,
        Err(e) => {
            problems.push(format!("{}: {e}", unit.name));
            return problems;
        }
    };
    for flag in unit.argv.iter().skip(1).filter(|a| a.starts_with("--")) {
        let name = flag.split('=').next().unwrap_or(flag);
        if !text.split(|c: char| c.is_whitespace() || c == ',').any(|w| w == name) {
            problems.push(format!("{}: `dlock {sub}` has no flag {name}", unit.name));
        }
    }
    let allowed = allowed_vars(sub, &text);
    for var in unit.vars.difference(&allowed) {
        problems.push(format!("{}: {var} is no key of `dlock {sub}`", unit.name));
    }
    problems
}

#[test]
fn every_subcommand_flag_and_variable_the_deploy_files_use_exists() {
    let units = all_units();
    let any = any_service_vars();
    let mut helps: BTreeMap<String, Result<String, String>> = BTreeMap::new();
    let mut help = |sub: &str| helps.entry(sub.to_owned()).or_insert_with(|| help_of(sub)).clone();
    let problems: Vec<String> = units.iter().flat_map(|u| unit_problems(u, &mut help, &any)).collect();
    assert!(problems.is_empty(), "deploy files use what dlock does not have:\n{}", problems.join("\n"));
    // The files do run every long-running service (a parser that found nothing proves nothing).
    let subs: BTreeSet<&str> = units.iter().filter_map(|u| u.argv.first().map(String::as_str)).collect();
    for sub in ["lock-server", "payment-resource", "rail-proxy", "rail-stub", "executor", "reconcile", "migrate"] {
        assert!(subs.contains(sub), "no deploy file runs `dlock {sub}` (found {subs:?})");
    }
    let vars: BTreeSet<&String> = units.iter().flat_map(|u| &u.vars).collect();
    for var in [
        "DLOCK_AUTH_CREDENTIALS_FILE",
        "DLOCK_LOCK_GRANTS_SIGNING_KEY_FILE",
        "DLOCK_PAYMENT_GRANTS_VERIFY_KEYS_FILE",
        "DLOCK_RAIL_PROXY_GRANTS_VERIFY_KEYS_FILE",
        "DLOCK_EXECUTOR_AUTH_TOKEN_FILE",
        "DLOCK_TLS_ENABLED",
    ] {
        assert!(vars.contains(&var.to_owned()), "no deploy file sets {var}");
    }
}

#[test]
fn a_wrong_subcommand_flag_or_variable_is_reported() {
    let any = any_service_vars();
    let mut help = |sub: &str| help_of(sub);
    let unit = |argv: &[&str], vars: &[&str]| Unit {
        name: "bad".into(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        vars: vars.iter().map(|s| s.to_string()).collect(),
    };
    // A key of another service: the executor has no database URL.
    let wrong_service = unit(&["executor"], &["DLOCK_PAYMENT_RESOURCE_DATABASE_URL"]);
    assert_eq!(unit_problems(&wrong_service, &mut help, &any).len(), 1);
    let typo = unit(&["lock-server"], &["DLOCK_LOCK_SERVER_ETCD_ENDPOINT"]);
    assert_eq!(unit_problems(&typo, &mut help, &any).len(), 1);
    let no_flag = unit(&["rail-proxy", "--fencing-off"], &[]);
    assert_eq!(unit_problems(&no_flag, &mut help, &any).len(), 1);
    let no_sub = unit(&["lock-sever"], &[]);
    assert!(!unit_problems(&no_sub, &mut help, &any).is_empty());
    let unowned = unit(&[], &["DLOCK_NO_SUCH_KEY"]);
    assert_eq!(unit_problems(&unowned, &mut help, &any).len(), 1);
    let fine =
        unit(&["lock-server", "--config"], &["DLOCK_LOCK_SERVER_BACKEND", "DLOCK_AUTH_CREDENTIALS_FILE", "DLOCK_LOG"]);
    assert_eq!(unit_problems(&fine, &mut help, &any), Vec::<String>::new());
}

#[test]
fn the_parsers_find_each_units_subcommand_and_variables() {
    assert_eq!(
        dlock_vars("a DLOCK_X_URL_FROM_FILE=1 XDLOCK_Y ${DLOCK_Z:-1} DLOCK_"),
        ["DLOCK_X_URL", "DLOCK_Z"].iter().map(|s| s.to_string()).collect()
    );
    let compose = "x-env: &env\n  DLOCK_A: 1\nservices:\n  zero: &z\n    command: [\"migrate\"]\n  one:\n    command: [\"executor\"]\n    environment:\n      DLOCK_B: x\n  two:\n    image: p\n";
    let units = compose_units("c", compose);
    let one = units.iter().find(|u| u.name == "c service one").expect("service one");
    assert_eq!(one.argv, vec!["executor"]);
    assert!(one.vars.contains("DLOCK_B") && !one.vars.contains("DLOCK_A"));
    assert!(units.iter().any(|u| u.vars.contains("DLOCK_A") && u.argv.is_empty()));
    let zero = units.iter().find(|u| u.name == "c service zero").expect("an anchored service");
    assert_eq!(zero.argv, vec!["migrate"]);
    let k8s = k8s_units("k", "kind: A\n  args: [\"rail-proxy\", \"--listen\"]\n  - {name: DLOCK_C}\n---\nkind: B\n");
    assert_eq!(k8s[0].argv, vec!["rail-proxy", "--listen"]);
    assert!(k8s[0].vars.contains("DLOCK_C") && k8s[1].vars.is_empty());
    let sd = systemd_unit("s", "ExecStart=/usr/local/bin/dlock rail-stub --config /x\nEnvironment=DLOCK_D=1\n");
    assert_eq!(sd.argv, vec!["rail-stub", "--config", "/x"]);
    assert!(sd.vars.contains("DLOCK_D"));
}

// ---------------------------------------------------------------------------------------
// probes
// ---------------------------------------------------------------------------------------

/// The problems of one Kubernetes file's probes: a liveness probe not on `/health/live`, a
/// readiness probe not on `/health/ready`, a Deployment without both or without a PDB.
fn probe_problems(file: &str, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut deployments = BTreeSet::new();
    let mut pdbs = BTreeSet::new();
    for doc in text.split("\n---") {
        let kind = doc.lines().find_map(|l| l.strip_prefix("kind:")).map(str::trim).unwrap_or("");
        let name =
            doc.lines().find_map(|l| l.trim_start().strip_prefix("name:")).map(str::trim).unwrap_or("").to_owned();
        match kind {
            "Deployment" => {
                deployments.insert(name.clone());
                for probe in ["livenessProbe:", "readinessProbe:"] {
                    if !doc.lines().any(|l| l.trim() == probe) {
                        problems.push(format!("{file}: Deployment {name} has no {probe}"));
                    }
                }
            }
            "PodDisruptionBudget" => {
                if let Some(target) =
                    doc.lines().find_map(|l| l.trim().strip_prefix("matchLabels: {app.kubernetes.io/name: "))
                {
                    pdbs.insert(target.trim_end_matches('}').trim().to_owned());
                }
            }
            _ => {}
        }
    }
    for d in deployments.difference(&pdbs) {
        problems.push(format!("{file}: Deployment {d} has no PodDisruptionBudget"));
    }
    for (i, line) in lines.iter().enumerate() {
        let want = match line.trim() {
            "livenessProbe:" => "/health/live",
            "readinessProbe:" | "startupProbe:" => "/health/ready",
            _ => continue,
        };
        let indent = line.len() - line.trim_start().len();
        // The probe's block: the following lines indented deeper.
        let path = lines[i + 1..]
            .iter()
            .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
            .find_map(|l| {
                l.split_once("path:")
                    .map(|(_, p)| p.trim_start().split([',', '}', ' ']).next().unwrap_or("").to_owned())
            });
        if path.as_deref() != Some(want) {
            problems.push(format!("{file}:{}: {} must ask {want} (C4 §4.6), asks {path:?}", i + 1, line.trim()));
        }
    }
    problems
}

/// Every `/health/...` path a compose file's healthchecks name must be `/health/ready`.
fn compose_health_problems(file: &str, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim_start().starts_with('#')) {
        let mut rest = line;
        while let Some(pos) = rest.find("/health/") {
            let path: String = rest[pos..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '/').collect();
            if path != "/health/ready" {
                problems
                    .push(format!("{file}:{}: a healthcheck gates depends_on: ask /health/ready, not {path}", i + 1));
            }
            rest = &rest[pos + path.len()..];
        }
    }
    problems
}

#[test]
fn every_probe_asks_the_health_endpoint_c4_pins() {
    let mut problems = Vec::new();
    let mut deployments = 0;
    for file in deploy_files() {
        let text = read(&file);
        if file.starts_with("deploy/k8s/") {
            deployments += text.lines().filter(|l| l.trim() == "kind: Deployment").count();
            problems.extend(probe_problems(&file, &text));
        } else if file.starts_with("deploy/compose/") {
            problems.extend(compose_health_problems(&file, &text));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(deployments >= 5, "expected a Deployment per service, found {deployments}");
}

#[test]
fn a_probe_on_the_wrong_endpoint_or_a_missing_probe_is_reported() {
    let swapped = "kind: Deployment\nmetadata:\n  name: a\n  livenessProbe:\n    httpGet: {path: /health/ready, port: 1}\n  readinessProbe:\n    httpGet: {path: /health/ready, port: 1}\n---\nkind: PodDisruptionBudget\n    matchLabels: {app.kubernetes.io/name: a}\n";
    assert_eq!(probe_problems("f", swapped).len(), 1, "{:?}", probe_problems("f", swapped));
    let missing =
        "kind: Deployment\nmetadata:\n  name: a\n  livenessProbe:\n    httpGet: {path: /health/live, port: 1}\n";
    // No readiness probe, and no PodDisruptionBudget.
    assert_eq!(probe_problems("f", missing).len(), 2, "{:?}", probe_problems("f", missing));
    let good = swapped.replacen("/health/ready", "/health/live", 1);
    assert_eq!(probe_problems("f", &good), Vec::<String>::new());
    assert_eq!(compose_health_problems("c", "test: [\"CMD\", \"x /health/live y\"]").len(), 1);
    assert!(compose_health_problems("c", "test: [\"x GET /health/ready HTTP\"]").is_empty());
    assert!(compose_health_problems("c", "  # /health/live is the process itself").is_empty());
}

// ---------------------------------------------------------------------------------------
// secrets
// ---------------------------------------------------------------------------------------

/// Whatever in `text` looks like a secret value.
fn secret_findings(file: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    if text.contains(&format!("{} PRIVATE KEY", "BEGIN")) || text.contains("PRIVATE KEY-----") {
        found.push(format!("{file}: a PEM private key"));
    }
    for (i, line) in text.lines().enumerate() {
        let at = format!("{file}:{}", i + 1);
        // Runs of hex digits, and of base64 characters.
        for run in line.split(|c: char| !c.is_ascii_hexdigit()) {
            if run.len() >= HEX_SECRET_CHARS_MIN {
                found.push(format!("{at}: a {}-digit hex value", run.len()));
            }
        }
        for run in line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '+' || c == '/' || c == '=')) {
            let mixed = run.chars().any(|c| c.is_ascii_digit())
                && run.chars().any(|c| c.is_ascii_uppercase())
                && run.chars().any(|c| c.is_ascii_lowercase());
            if run.len() >= BASE64_SECRET_CHARS_MIN && mixed {
                found.push(format!("{at}: a {}-character base64-like value", run.len()));
            }
        }
        // user:password@ in a URL, unless the password is a placeholder (..., %s, $VAR).
        let mut rest = line;
        while let Some(pos) = rest.find("://") {
            rest = &rest[pos + 3..];
            let authority = rest.split(['/', ' ', '"', '\'']).next().unwrap_or("");
            if let Some((userinfo, _)) = authority.rsplit_once('@') {
                if let Some((_, password)) = userinfo.split_once(':') {
                    let placeholder = password.chars().all(|c| c == '.') || password.starts_with(['%', '$', '<']);
                    if !placeholder {
                        found.push(format!("{at}: a password in a URL"));
                    }
                }
            }
        }
    }
    found
}

#[test]
fn no_deploy_file_holds_a_secret_value() {
    let files = deploy_files();
    assert!(files.len() >= 15, "expected the deploy tree, found {files:?}");
    let found: Vec<String> = files.iter().flat_map(|f| secret_findings(f, &read(f))).collect();
    assert!(found.is_empty(), "secret-looking values under deploy/:\n{}", found.join("\n"));
    // The secrets are made where git does not look.
    assert!(read(".gitignore").lines().any(|l| l.trim() == "/deploy/secrets"), "deploy/secrets is not git-ignored");
    assert!(read("deploy/make-secrets.sh").contains("deploy/secrets"));
}

#[test]
fn a_token_a_key_or_a_password_is_found() {
    let hex = "0123456789abcdef".repeat(4);
    assert_eq!(secret_findings("f", &format!("worker {hex}")).len(), 1);
    assert_eq!(secret_findings("f", "key: 3q2+7w0123456789ABCDEFghijklmnopqrstuvwxyz=").len(), 1);
    assert_eq!(secret_findings("f", &format!("-----{} PRIVATE KEY-----", "BEGIN")).len(), 1);
    assert_eq!(secret_findings("f", "url: postgres://dlock:hunter2@db/paydb").len(), 1);
    for clean in [
        "postgres://dlock:...@host/paydb",
        "printf 'postgres://dlock:%s@postgres:5432/paydb'",
        "mountPath: /run/secrets/grant-verify/verify.keys",
        "DLOCK_RAIL_PROXY_GRANTS_VERIFY_KEYS_FILE=%d/grant-verify.keys",
    ] {
        assert_eq!(secret_findings("f", clean), Vec::<String>::new(), "{clean}");
    }
}

// ---------------------------------------------------------------------------------------
// CI
// ---------------------------------------------------------------------------------------

/// The problems of test.sh's manifest stage: not run, not on every manifest, not pinned.
fn ci_problems(test_sh: &str, requirements: &str, k8s_files: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    if !test_sh.lines().any(|l| l.trim() == "run_stage \"deploy manifests\" deploy_manifests") {
        problems.push("test.sh does not run_stage deploy_manifests".to_owned());
    }
    let body: String = test_sh
        .lines()
        .skip_while(|l| !l.starts_with("deploy_manifests()"))
        .take_while(|l| !l.starts_with('}'))
        .collect::<Vec<_>>()
        .join("\n");
    for needle in [
        "kubernetes-validate\" --strict",
        "deploy/k8s/*.yaml",
        "-r deploy/validate-requirements.txt",
        "scripts/check-compose.py deploy/compose/compose.yaml",
    ] {
        if !body.contains(needle) {
            problems.push(format!("deploy_manifests() lacks {needle:?}"));
        }
    }
    if !requirements.lines().any(|l| l.starts_with("kubernetes-validate==")) {
        problems.push("kubernetes-validate is not pinned (==)".to_owned());
    }
    for line in requirements.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        if !line.contains("==") {
            problems.push(format!("unpinned requirement {line:?}"));
        }
    }
    for f in k8s_files.iter().filter(|f| !f.ends_with(".yaml")) {
        problems.push(format!("{f} is not matched by deploy/k8s/*.yaml, so it is never validated"));
    }
    problems
}

#[test]
fn test_sh_validates_every_manifest_with_the_pinned_checker() {
    let k8s: Vec<String> = deploy_files().into_iter().filter(|f| f.starts_with("deploy/k8s/")).collect();
    let problems = ci_problems(&read("scripts/test.sh"), &read("deploy/validate-requirements.txt"), &k8s);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_missing_stage_an_unpinned_checker_or_an_unchecked_manifest_is_reported() {
    let good_sh = "deploy_manifests() {\n  \"$V/bin/pip\" install -r deploy/validate-requirements.txt \\\n && \"$V/bin/kubernetes-validate\" --strict deploy/k8s/*.yaml \\\n && python scripts/check-compose.py deploy/compose/compose.yaml\n}\nrun_stage \"deploy manifests\" deploy_manifests\n";
    let pins = "kubernetes-validate==1.31.0\nPyYAML==6.0.4\n";
    let files = vec!["deploy/k8s/a.yaml".to_owned()];
    assert_eq!(ci_problems(good_sh, pins, &files), Vec::<String>::new());
    let not_run = good_sh.replace("run_stage \"deploy manifests\" deploy_manifests", "");
    assert_eq!(ci_problems(&not_run, pins, &files).len(), 1);
    assert_eq!(ci_problems(good_sh, "kubernetes-validate\n", &files).len(), 2);
    assert_eq!(ci_problems(good_sh, pins, &["deploy/k8s/a.yml".to_owned()]).len(), 1);
    assert_eq!(ci_problems(&good_sh.replace("--strict ", ""), pins, &files).len(), 1);
}
