//! The lock server's keys (`lock.*`) and their one resolver, used by `dlock lock-server`,
//! `dlock up`/`demo`, the simulation and the tests alike (see `dlock_config`).

use std::net::SocketAddr;

use dlock_config::{Layers, Profile, LOCKDB_URL_DEFAULT};

use dlock_contract::grant::GrantSigner;

use crate::service::LockServerConfig;

/// Every key the lock server reads.
pub const KEYS: &[&str] = &[
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
    "lock.grants.signing-key-file",
    "lock.events.retention-events",
    "lock.events.purge-interval-ms",
];

/// Longest signing key file read, in bytes.
pub const SIGNING_KEY_FILE_BYTES_MAX: u64 = 4_096;

/// The signer of `lock.grants.signing-key-file`, if set (C3-extensions E-14): a one-line
/// file holding the 32-byte Ed25519 seed, base64 or hex.
fn signer(layers: &Layers) -> Result<Option<GrantSigner>, String> {
    let key = "lock.grants.signing-key-file";
    let Some(path) = layers.get_opt::<String>(key)? else { return Ok(None) };
    let len = std::fs::metadata(&path).map_err(|e| format!("{key} = {path}: {e}"))?.len();
    if len > SIGNING_KEY_FILE_BYTES_MAX {
        return Err(format!("{key} = {path}: larger than {SIGNING_KEY_FILE_BYTES_MAX} bytes"));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{key} = {path}: {e}"))?;
    let seed = dlock_contract::grant::parse_seed(&text).map_err(|e| format!("{key} = {path}: {e}"))?;
    Ok(Some(GrantSigner::from_seed(&seed)))
}

/// Default `lock.server.listen`.
pub const LISTEN_DEFAULT: ([u8; 4], u16) = ([127, 0, 0, 1], 8081);

/// Where the lock server keeps its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockBackend {
    /// lockdb on SQLite or PostgreSQL, at this URL.
    Sql(String),
    /// etcd, at these endpoints, under this key prefix.
    Etcd(Vec<String>, String),
}

/// The lock server's resolved settings.
#[derive(Debug, Clone)]
pub struct LockServerSettings {
    pub listen: SocketAddr,
    pub backend: LockBackend,
    pub config: LockServerConfig,
}

fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// Resolves every `lock.*` key; the backend follows `lock.server.backend`, else the URL.
pub fn resolve(layers: &Layers, profile: Profile) -> Result<LockServerSettings, String> {
    let d = LockServerConfig::default();
    let listen = layers.get("lock.server.listen", SocketAddr::from(LISTEN_DEFAULT))?;
    let url = layers.get("lock.server.database-url", LOCKDB_URL_DEFAULT.to_owned())?;
    let backend = match layers.get_opt::<String>("lock.server.backend")? {
        Some(b) => b,
        None => if is_postgres(&url) { "postgres" } else { "sqlite" }.to_owned(),
    };
    let backend = match backend.as_str() {
        "sqlite" if url.starts_with("sqlite:") => LockBackend::Sql(url),
        "postgres" if is_postgres(&url) => LockBackend::Sql(url),
        "etcd" => {
            let endpoints = layers.get("lock.server.etcd-endpoints", String::new())?;
            let endpoints: Vec<String> =
                endpoints.split(',').map(str::trim).filter(|e| !e.is_empty()).map(str::to_owned).collect();
            if endpoints.is_empty() {
                return Err("lock.server.backend=etcd needs --etcd-endpoints http://HOST:PORT[,...]".into());
            }
            let prefix = layers.get("lock.server.etcd-prefix", crate::store_etcd::DEFAULT_PREFIX.to_owned())?;
            if !prefix.starts_with('/') || prefix.len() < 2 {
                return Err("lock.server.etcd-prefix must start with / and name something, e.g. /dlock".into());
            }
            LockBackend::Etcd(endpoints, prefix)
        }
        "sqlite" | "postgres" => {
            // Only the URL's scheme: the rest may carry a credential.
            let scheme = url.split(':').next().unwrap_or_default();
            return Err(format!(
                "lock.server.backend={backend} does not match lock.server.database-url ({scheme}:...)"
            ));
        }
        other => return Err(format!("unknown lock.server.backend {other:?} (sqlite, postgres, etcd)")),
    };
    let config = LockServerConfig {
        session_ttl_ms_default: layers.get("lock.session.ttl-ms", d.session_ttl_ms_default)?,
        lock_ttl_ms_default: layers.get("lock.default.ttl-ms", d.lock_ttl_ms_default)?,
        delay_ms: layers.get("lock.delay-ms", d.delay_ms)?.max(0),
        waiters_per_key_max: layers.get("lock.waiters-max", d.waiters_per_key_max)?,
        session_retention_ms: layers.get("lock.session.retention-ms", d.session_retention_ms)?,
        reap_interval_ms: layers.get("lock.reaper.interval-ms", d.reap_interval_ms)?,
        reap_batch_max: d.reap_batch_max,
        wait_poll_ms: layers.get("lock.wait.poll-ms", d.wait_poll_ms)?,
        signer: signer(layers)?,
        auth: dlock_http::auth::resolve(layers, profile)?,
        event_retention_events: {
            let n = layers.get("lock.events.retention-events", d.event_retention_events)?;
            if n < dlock_contract::stream::EVENT_RETENTION_EVENTS_MIN {
                return Err(format!(
                    "lock.events.retention-events must be >= {}",
                    dlock_contract::stream::EVENT_RETENTION_EVENTS_MIN
                ));
            }
            n
        },
        event_purge_interval_ms: {
            let ms = layers.get("lock.events.purge-interval-ms", d.event_purge_interval_ms)?;
            if ms == 0 {
                return Err("lock.events.purge-interval-ms must be > 0".into());
            }
            ms
        },
    };
    Ok(LockServerSettings { listen, backend, config })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Layers of `pairs` with a credential, as every resolved service needs (E-13).
    fn authed(pairs: &[(&str, &str)]) -> Layers {
        let mut l = Layers::of(pairs);
        l.set_flag("auth.credentials", "worker unit-test-token-0000000001");
        l
    }

    fn backend(pairs: &[(&str, &str)]) -> Result<LockBackend, String> {
        resolve(&authed(pairs), Profile::Production).map(|s| s.backend)
    }

    #[test]
    fn lock_backend_follows_the_keys_and_refuses_mismatches() {
        let s = resolve(&authed(&[]), Profile::Production).expect("defaults");
        assert_eq!(s.listen.port(), 8081);
        assert_eq!(s.backend, LockBackend::Sql(LOCKDB_URL_DEFAULT.to_owned()));
        assert_eq!(
            backend(&[("lock.server.database-url", "postgres://u@h/lockdb")]),
            Ok(LockBackend::Sql("postgres://u@h/lockdb".into()))
        );
        assert_eq!(
            backend(&[("lock.server.backend", "etcd"), ("lock.server.etcd-endpoints", "http://a:2379, http://b:2379")]),
            Ok(LockBackend::Etcd(vec!["http://a:2379".into(), "http://b:2379".into()], "/dlock".into()))
        );
        assert!(backend(&[("lock.server.backend", "etcd")]).is_err());
        assert!(backend(&[("lock.server.backend", "postgres")]).is_err());
        assert!(backend(&[("lock.server.backend", "zookeeper")]).is_err());
    }

    #[test]
    fn the_signing_key_file_gives_the_signer_and_a_bad_file_is_refused() {
        assert!(resolve(&authed(&[]), Profile::Production).expect("defaults").config.signer.is_none());
        let dir = std::env::temp_dir().join(format!("dlock-signing-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (good, bad) = (dir.join("good.key"), dir.join("bad.key"));
        std::fs::write(&good, dlock_contract::grant::seed_text(&dlock_contract::grant::testing::SEED)).expect("write");
        std::fs::write(&bad, "not a key\n").expect("write");
        let path = good.display().to_string();
        let l = authed(&[("lock.grants.signing-key-file", path.as_str())]);
        let signer = resolve(&l, Profile::Production).expect("ok").config.signer.expect("a signer");
        assert_eq!(signer.key_id(), dlock_contract::grant::testing::signer().key_id());
        let path = bad.display().to_string();
        let l = authed(&[("lock.grants.signing-key-file", path.as_str())]);
        assert!(resolve(&l, Profile::Production).is_err_and(|e| e.contains("lock.grants.signing-key-file")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn service_knobs_read_their_keys() {
        let l = authed(&[("lock.reaper.interval-ms", "200"), ("lock.waiters-max", "1"), ("lock.delay-ms", "-5")]);
        let c = resolve(&l, Profile::Production).expect("ok").config;
        assert_eq!((c.reap_interval_ms, c.waiters_per_key_max, c.delay_ms), (200, 1, 0));
        assert_eq!(c.event_purge_interval_ms, crate::service::EVENT_PURGE_INTERVAL_MS);
    }

    #[test]
    fn the_event_purge_interval_reads_its_key_and_refuses_zero() {
        let l = authed(&[("lock.events.purge-interval-ms", "1000")]);
        assert_eq!(resolve(&l, Profile::Production).expect("ok").config.event_purge_interval_ms, 1_000);
        let zero = authed(&[("lock.events.purge-interval-ms", "0")]);
        assert!(resolve(&zero, Profile::Production).is_err_and(|e| e.contains("lock.events.purge-interval-ms")));
    }
}
