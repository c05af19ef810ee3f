//! Layered configuration (C5): built-in default < `--config FILE` (TOML) < environment
//! variable (`DLOCK_` + key in upper case, dots and dashes as underscores) < flag.
//!
//! clap resolves flag-over-environment; this module adds the file beneath both and the
//! defaults beneath that. Keys are the seed's dotted names, e.g. `rail.stub.latency-ms`.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

/// Every key a config file may set. An unknown key is an error, not a silent no-op: a typo
/// in a payment system's config should stop the process, not be ignored.
pub const KNOWN_KEYS: &[&str] = &[
    "profile",
    "rail.stub.listen",
    "rail.stub.latency-ms",
    "rail.stub.failure-rate",
    "rail.stub.duplicate-ack-rate",
    "rail.stub.decline-rate",
    "rail.stub.drop-hold-ms",
    "rail.stub.seed",
    "rail.proxy.listen",
    "rail.proxy.database-url",
    "rail.proxy.rail-url",
    "rail.proxy.connect-timeout-ms",
    "rail.proxy.read-timeout-ms",
    "rail.proxy.fencing.enabled",
    "rail.proxy.body-bytes-max",
    "rail.proxy.duplicate-guard.enabled",
    "payment.resource.listen",
    "payment.resource.database-url",
    "payment.resource.body-bytes-max",
    "payment.idempotency.retention-ms",
    "payment.idempotency.purge-interval-ms",
    "payment.idempotency.purge-batch-max",
    "payment.fencing.enabled",
    "executor.listen",
    "executor.lock-url",
    "executor.payment-url",
    "executor.proxy-url",
    "executor.owner-id",
    "executor.concurrency",
    "executor.poll-interval-ms",
    "executor.batch-max",
    "executor.lock-ttl-ms",
    "executor.write.connect-timeout-ms",
    "executor.write.read-timeout-ms",
    "executor.write.retries-max",
    "executor.submit.connect-timeout-ms",
    "executor.submit.read-timeout-ms",
    "executor.read.connect-timeout-ms",
    "executor.read.read-timeout-ms",
    "executor.read.tries-max",
    "executor.chaos.pause-rate",
    "executor.chaos.pause-ms",
    "executor.chaos.pause-hops",
    "reconcile.database-url",
    "reconcile.rail-url",
    "reconcile.intent-unresolved-ms-max",
    "reconcile.acked-unposted-ms-max",
    "resolve.database-url",
    "lock.server.listen",
    "lock.server.backend",
    "lock.server.database-url",
    "lock.server.etcd-endpoints",
    "lock.server.etcd-prefix",
    "lock.session.ttl-ms",
    "lock.default.ttl-ms",
    "lock.delay-ms",
    "lock.waiters-max",
    "lock.session.retention-ms",
    "lock.reaper.interval-ms",
    "lock.wait.poll-ms",
    "http.header-bytes-max",
];

/// The environment variable that sets `key`.
pub fn env_name(key: &str) -> String {
    format!("DLOCK_{}", key.to_ascii_uppercase().replace(['.', '-'], "_"))
}

/// A config file, flattened to dotted keys.
#[derive(Debug, Default, Clone)]
pub struct FileConfig {
    values: BTreeMap<String, toml::Value>,
    source: String,
}

impl FileConfig {
    pub fn load(path: Option<&Path>) -> Result<FileConfig, String> {
        let Some(path) = path else { return Ok(FileConfig::default()) };
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        FileConfig::parse(&text, &path.display().to_string())
    }

    pub fn parse(text: &str, source: &str) -> Result<FileConfig, String> {
        let table: toml::Table = text.parse().map_err(|e| format!("config {source} is not valid TOML: {e}"))?;
        let mut values = BTreeMap::new();
        flatten("", &toml::Value::Table(table), &mut values);
        if let Some(unknown) = values.keys().find(|k| !KNOWN_KEYS.contains(&k.as_str())) {
            return Err(format!("config {source}: unknown key {unknown:?} (known keys: {})", KNOWN_KEYS.join(", ")));
        }
        Ok(FileConfig { values, source: source.to_owned() })
    }

    /// The file's value for `key`, parsed as `T`.
    pub fn get<T: FromStr>(&self, key: &str) -> Result<Option<T>, String>
    where
        T::Err: std::fmt::Display,
    {
        let Some(v) = self.values.get(key) else { return Ok(None) };
        let text = match v {
            toml::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        text.parse::<T>()
            .map(Some)
            .map_err(|e| format!("config {}: {key} = {text}: {e} (or set {})", self.source, env_name(key)))
    }
}

fn flatten(prefix: &str, v: &toml::Value, out: &mut BTreeMap<String, toml::Value>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_owned(), other.clone());
        }
    }
}

/// Resolves one key: `cli` (flag or environment, from clap) wins, then the file, then
/// `default`.
pub fn resolve<T: FromStr>(cli: Option<T>, file: &FileConfig, key: &str, default: T) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    if let Some(v) = cli {
        return Ok(v);
    }
    Ok(file.get(key)?.unwrap_or(default))
}

/// The deployment profile. `unsafe-test` is the only one that may disable fencing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    Production,
    UnsafeTest,
}

impl FromStr for Profile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "production" => Ok(Profile::Production),
            "unsafe-test" => Ok(Profile::UnsafeTest),
            other => Err(format!("unknown profile {other:?} (production, unsafe-test)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_tables_and_dotted_keys_mean_the_same_key() {
        let nested = FileConfig::parse("[rail.stub]\nlatency-ms = 250\n", "a").expect("parse");
        let dotted = FileConfig::parse("rail.stub.latency-ms = 250\n", "b").expect("parse");
        assert_eq!(nested.get::<u64>("rail.stub.latency-ms"), Ok(Some(250)));
        assert_eq!(dotted.get::<u64>("rail.stub.latency-ms"), Ok(Some(250)));
    }

    #[test]
    fn unknown_keys_in_a_file_are_refused() {
        let err = FileConfig::parse("[rail.stub]\nlatency = 5\n", "f").expect_err("unknown");
        assert!(err.contains("rail.stub.latency"), "{err}");
    }

    #[test]
    fn flag_or_env_beats_file_beats_default() {
        let file = FileConfig::parse("[rail.proxy]\nread-timeout-ms = 100\n", "f").expect("parse");
        assert_eq!(resolve(Some(7u64), &file, "rail.proxy.read-timeout-ms", 8000), Ok(7));
        assert_eq!(resolve(None, &file, "rail.proxy.read-timeout-ms", 8000u64), Ok(100));
        assert_eq!(resolve(None, &file, "rail.proxy.connect-timeout-ms", 1000u64), Ok(1000));
    }

    #[test]
    fn env_names_follow_the_key() {
        assert_eq!(env_name("rail.stub.latency-ms"), "DLOCK_RAIL_STUB_LATENCY_MS");
        assert_eq!(env_name("rail.proxy.fencing.enabled"), "DLOCK_RAIL_PROXY_FENCING_ENABLED");
    }

    #[test]
    fn badly_typed_file_values_name_the_key() {
        let file = FileConfig::parse("[rail.stub]\nlatency-ms = \"soon\"\n", "f").expect("parse");
        let err = file.get::<u64>("rail.stub.latency-ms").expect_err("bad");
        assert!(err.contains("rail.stub.latency-ms"), "{err}");
    }
}
