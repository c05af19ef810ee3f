//! Layered configuration (C5), shared by every service crate and the binary.
//!
//! A key (a dotted name of the seed, e.g. `rail.stub.latency-ms`) resolves, highest first:
//!
//! 1. the flags layer: the command line (each service subcommand's flags, or the values
//!    `dlock up` / `dlock demo` impose, such as the ports they bound);
//! 2. the environment: `DLOCK_` + the key in upper case, dots and dashes as underscores
//!    ([`env_name`]);
//! 3. the `--config FILE` (TOML, nested tables or dotted keys; an unknown key is an error);
//! 4. the command's own defaults ([`Layers::set_default`]: what `dlock demo` chooses for
//!    its small cluster), then the service's built-in default.
//!
//! Every service crate owns a `config` module with its keys (`KEYS`) and one `resolve`
//! function reading a [`Layers`]; the separate processes, `dlock up`, `dlock demo`, the
//! simulation and the tests all go through it, so a key means the same everywhere.
//!
//! Invariant: a value that does not parse is an error naming the key and where it came
//! from; it never falls back to a lower layer.

pub mod telemetry;
pub mod tls;

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

/// The embedded default paydb (the proxy's, the payment-resource's and the reconciler's).
pub const PAYDB_URL_DEFAULT: &str = "sqlite://dlock-data/paydb.sqlite";
/// The embedded default lockdb.
pub const LOCKDB_URL_DEFAULT: &str = "sqlite://dlock-data/lockdb.sqlite";
/// The key of the deployment profile.
pub const PROFILE_KEY: &str = "profile";

/// The environment variable that sets `key`.
pub fn env_name(key: &str) -> String {
    format!("DLOCK_{}", key.to_ascii_uppercase().replace(['.', '-'], "_"))
}

/// A config file, flattened to dotted keys.
#[derive(Debug, Default, Clone)]
pub struct FileConfig {
    values: BTreeMap<String, String>,
    source: String,
}

impl FileConfig {
    /// Reads `path` (none: an empty file), refusing any key not in `known`.
    pub fn load(path: Option<&Path>, known: &[&str]) -> Result<FileConfig, String> {
        let Some(path) = path else { return Ok(FileConfig::default()) };
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        FileConfig::parse(&text, &path.display().to_string(), known)
    }

    /// Parses TOML `text` (named `source` in errors), refusing any key not in `known`.
    pub fn parse(text: &str, source: &str, known: &[&str]) -> Result<FileConfig, String> {
        let table: toml::Table = text.parse().map_err(|e| format!("config {source} is not valid TOML: {e}"))?;
        let mut values = BTreeMap::new();
        flatten("", &toml::Value::Table(table), &mut values);
        if let Some(unknown) = values.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(format!("config {source}: unknown key {unknown:?} (known keys: {})", known.join(", ")));
        }
        Ok(FileConfig { values, source: source.to_owned() })
    }
}

fn flatten(prefix: &str, v: &toml::Value, out: &mut BTreeMap<String, String>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        toml::Value::String(s) => {
            out.insert(prefix.to_owned(), s.clone());
        }
        other => {
            out.insert(prefix.to_owned(), other.to_string());
        }
    }
}

/// The layers one command resolves its keys from (see the module doc).
#[derive(Debug, Default, Clone)]
pub struct Layers {
    flags: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
    file: FileConfig,
    defaults: BTreeMap<String, String>,
}

impl Layers {
    /// Only `file` beneath (no flags, no environment).
    pub fn new(file: FileConfig) -> Layers {
        Layers { file, ..Layers::default() }
    }

    /// Only a flags layer of `pairs`: how the simulation and tests set non-default values.
    pub fn of(pairs: &[(&str, &str)]) -> Layers {
        let mut l = Layers::default();
        for (k, v) in pairs {
            l.set_flag(k, *v);
        }
        l
    }

    /// With this process's `DLOCK_*` environment variables as the environment layer.
    pub fn with_process_env(self) -> Layers {
        self.with_env(std::env::vars().filter(|(k, _)| k.starts_with("DLOCK_")))
    }

    /// With `vars` (name, value) as the environment layer.
    pub fn with_env(mut self, vars: impl IntoIterator<Item = (String, String)>) -> Layers {
        self.env = vars.into_iter().collect();
        self
    }

    /// Sets `key` in the flags layer (it beats the environment and the file).
    pub fn set_flag(&mut self, key: &str, value: impl ToString) {
        self.flags.insert(key.to_owned(), value.to_string());
    }

    /// Sets `key` in the flags layer when `value` is present.
    pub fn set_flag_opt<T: ToString>(&mut self, key: &str, value: Option<&T>) {
        if let Some(v) = value {
            self.set_flag(key, v.to_string());
        }
    }

    /// Sets the command's own default of `key`: beneath the file, above the built-in one.
    pub fn set_default(&mut self, key: &str, value: impl ToString) {
        self.defaults.insert(key.to_owned(), value.to_string());
    }

    /// The raw value of `key` and where it came from, highest layer first.
    pub fn raw(&self, key: &str) -> Option<(String, String)> {
        if let Some(v) = self.flags.get(key) {
            return Some((v.clone(), format!("flag for {key}")));
        }
        let env = env_name(key);
        if let Some(v) = self.env.get(&env) {
            return Some((v.clone(), env));
        }
        if let Some(v) = self.file.values.get(key) {
            return Some((v.clone(), format!("config {}: {key}", self.file.source)));
        }
        self.defaults.get(key).map(|v| (v.clone(), format!("default of {key}")))
    }

    /// `key` parsed as `T`, if any layer sets it.
    pub fn get_opt<T: FromStr>(&self, key: &str) -> Result<Option<T>, String>
    where
        T::Err: std::fmt::Display,
    {
        let Some((text, source)) = self.raw(key) else { return Ok(None) };
        text.parse::<T>().map(Some).map_err(|e| format!("{source} = {text}: {e} (key {key}, or set {})", env_name(key)))
    }

    /// `key` parsed as `T`, or `default`.
    pub fn get<T: FromStr>(&self, key: &str, default: T) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        Ok(self.get_opt(key)?.unwrap_or(default))
    }

    /// The deployment profile (key `profile`), production when unset.
    pub fn profile(&self) -> Result<Profile, String> {
        self.get(PROFILE_KEY, Profile::Production)
    }
}

/// The deployment profile. `unsafe-test` is the only one that may disable a fence.
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

/// Reads a safety switch (`true` by default) and refuses `false` outside `unsafe-test`
/// with the error every command gives: `{key}=false is refused outside --profile
/// unsafe-test: {why}`.
pub fn safety_switch(layers: &Layers, profile: Profile, key: &str, why: &str) -> Result<bool, String> {
    let on = layers.get(key, true)?;
    if !on && profile != Profile::UnsafeTest {
        return Err(format!("{key}=false is refused outside --profile unsafe-test: {why}"));
    }
    Ok(on)
}

/// The grant-verification keys of one resource (C3-extensions E-14), as text: what
/// `{prefix}.verify-keys` (public keys, comma-separated) and the file named by
/// `{prefix}.verify-keys-file` (one per line) hold, joined; and `{prefix}.accept-unsigned`,
/// the transition switch (default `false`; `true` is refused outside `--profile
/// unsafe-test`, like every unsafe switch).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantKeys {
    pub keys: String,
    pub accept_unsigned: bool,
}

/// Longest verify-keys file read, in bytes.
pub const VERIFY_KEYS_FILE_BYTES_MAX: u64 = 4_096;

/// Reads the `{prefix}.verify-keys`, `{prefix}.verify-keys-file` and
/// `{prefix}.accept-unsigned` keys (see [`GrantKeys`]).
pub fn grant_keys(layers: &Layers, profile: Profile, prefix: &str) -> Result<GrantKeys, String> {
    let mut keys = layers.get(&format!("{prefix}.verify-keys"), String::new())?;
    let file_key = format!("{prefix}.verify-keys-file");
    if let Some(path) = layers.get_opt::<String>(&file_key)? {
        let len = std::fs::metadata(&path).map_err(|e| format!("{file_key} = {path}: {e}"))?.len();
        if len > VERIFY_KEYS_FILE_BYTES_MAX {
            return Err(format!("{file_key} = {path}: larger than {VERIFY_KEYS_FILE_BYTES_MAX} bytes"));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{file_key} = {path}: {e}"))?;
        keys.push('\n');
        keys.push_str(&text);
    }
    let unsigned_key = format!("{prefix}.accept-unsigned");
    let accept_unsigned = layers.get(&unsigned_key, false)?;
    if accept_unsigned && profile != Profile::UnsafeTest {
        return Err(format!(
            "{unsigned_key}=true is refused outside --profile unsafe-test: an unsigned token can raise a fence to any value"
        ));
    }
    Ok(GrantKeys { keys, accept_unsigned })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: &[&str] = &["rail.stub.latency-ms", "rail.proxy.read-timeout-ms", "rail.proxy.connect-timeout-ms"];

    #[test]
    fn nested_tables_and_dotted_keys_mean_the_same_key() {
        let nested = FileConfig::parse("[rail.stub]\nlatency-ms = 250\n", "a", KNOWN).expect("parse");
        let dotted = FileConfig::parse("rail.stub.latency-ms = 250\n", "b", KNOWN).expect("parse");
        assert_eq!(Layers::new(nested).get_opt::<u64>("rail.stub.latency-ms"), Ok(Some(250)));
        assert_eq!(Layers::new(dotted).get_opt::<u64>("rail.stub.latency-ms"), Ok(Some(250)));
    }

    #[test]
    fn unknown_keys_in_a_file_are_refused() {
        let err = FileConfig::parse("[rail.stub]\nlatency = 5\n", "f", KNOWN).expect_err("unknown");
        assert!(err.contains("rail.stub.latency"), "{err}");
    }

    #[test]
    fn flag_beats_env_beats_file_beats_command_default_beats_builtin_default() {
        let key = "rail.proxy.read-timeout-ms";
        let file = FileConfig::parse("[rail.proxy]\nread-timeout-ms = 100\n", "f", KNOWN).expect("parse");
        let mut l = Layers::new(file).with_env([(env_name(key), "50".to_owned())]);
        l.set_default(key, 9);
        l.set_flag(key, 7);
        assert_eq!(l.get(key, 8000u64), Ok(7));
        let mut l = Layers::new(FileConfig::default()).with_env([(env_name(key), "50".to_owned())]);
        l.set_default(key, 9);
        assert_eq!(l.get(key, 8000u64), Ok(50));
        let file = FileConfig::parse("[rail.proxy]\nread-timeout-ms = 100\n", "f", KNOWN).expect("parse");
        let mut l = Layers::new(file);
        l.set_default(key, 9);
        assert_eq!(l.get(key, 8000u64), Ok(100));
        let mut l = Layers::default();
        l.set_default(key, 9);
        assert_eq!(l.get(key, 8000u64), Ok(9));
        assert_eq!(Layers::default().get("rail.proxy.connect-timeout-ms", 1000u64), Ok(1000));
    }

    #[test]
    fn env_names_follow_the_key() {
        assert_eq!(env_name("rail.stub.latency-ms"), "DLOCK_RAIL_STUB_LATENCY_MS");
        assert_eq!(env_name("rail.proxy.fencing.enabled"), "DLOCK_RAIL_PROXY_FENCING_ENABLED");
    }

    #[test]
    fn badly_typed_values_name_the_key_and_never_fall_back() {
        let file = FileConfig::parse("[rail.stub]\nlatency-ms = \"soon\"\n", "f", KNOWN).expect("parse");
        let err = Layers::new(file).get::<u64>("rail.stub.latency-ms", 0).expect_err("bad");
        assert!(err.contains("rail.stub.latency-ms"), "{err}");
        let env = Layers::default().with_env([(env_name("rail.stub.latency-ms"), "x".to_owned())]);
        assert!(env.get::<u64>("rail.stub.latency-ms", 0).is_err_and(|e| e.contains("DLOCK_RAIL_STUB_LATENCY_MS")));
    }

    #[test]
    fn a_safety_switch_turns_off_only_under_unsafe_test() {
        let off = Layers::of(&[("rail.proxy.fencing.enabled", "false")]);
        let err = safety_switch(&off, Profile::Production, "rail.proxy.fencing.enabled", "why").expect_err("refused");
        assert_eq!(err, "rail.proxy.fencing.enabled=false is refused outside --profile unsafe-test: why");
        assert_eq!(safety_switch(&off, Profile::UnsafeTest, "rail.proxy.fencing.enabled", "why"), Ok(false));
        assert_eq!(safety_switch(&Layers::default(), Profile::Production, "rail.proxy.fencing.enabled", "w"), Ok(true));
    }

    #[test]
    fn the_profile_is_a_key_like_any_other() {
        assert_eq!(Layers::default().profile(), Ok(Profile::Production));
        assert_eq!(Layers::of(&[("profile", "unsafe-test")]).profile(), Ok(Profile::UnsafeTest));
        assert!(Layers::of(&[("profile", "yolo")]).profile().is_err());
    }
}
