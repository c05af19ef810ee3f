//! The rail-stub's keys (`rail.stub.*`) and their one resolver, used by `dlock rail-stub`,
//! `dlock up`/`demo`, the simulation and the tests alike (see `dlock_config`).

use std::net::SocketAddr;

use dlock_config::{Layers, Profile};

use crate::StubConfig;

/// Every key the rail-stub reads.
pub const KEYS: &[&str] = &[
    "rail.stub.listen",
    "rail.stub.latency-ms",
    "rail.stub.failure-rate",
    "rail.stub.duplicate-ack-rate",
    "rail.stub.decline-rate",
    "rail.stub.drop-hold-ms",
    "rail.stub.seed",
];

/// Default `rail.stub.listen`.
pub const LISTEN_DEFAULT: ([u8; 4], u16) = ([127, 0, 0, 1], 8084);

/// The rail-stub's resolved settings.
#[derive(Debug, Clone, PartialEq)]
pub struct StubSettings {
    pub listen: SocketAddr,
    pub config: StubConfig,
}

/// Resolves every `rail.stub.*` key; `rail.stub.seed` is drawn from the runtime when unset.
pub fn resolve(layers: &Layers, _profile: Profile) -> Result<StubSettings, String> {
    let d = StubConfig::default();
    let listen = layers.get("rail.stub.listen", SocketAddr::from(LISTEN_DEFAULT))?;
    let seed = match layers.get_opt::<u64>("rail.stub.seed")? {
        Some(s) => s,
        None => dlock_rt::rand::random_u64(),
    };
    let config = StubConfig {
        latency_ms: layers.get("rail.stub.latency-ms", d.latency_ms)?,
        failure_rate: layers.get("rail.stub.failure-rate", d.failure_rate)?,
        duplicate_ack_rate: layers.get("rail.stub.duplicate-ack-rate", d.duplicate_ack_rate)?,
        decline_rate: layers.get("rail.stub.decline-rate", d.decline_rate)?,
        drop_hold_ms: layers.get("rail.stub.drop-hold-ms", d.drop_hold_ms)?,
        seed,
    };
    config.validate()?;
    Ok(StubSettings { listen, config })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_knob_reads_its_key_and_rates_are_checked() {
        let l =
            Layers::of(&[("rail.stub.decline-rate", "1"), ("rail.stub.seed", "7"), ("rail.stub.listen", "0.0.0.0:1")]);
        let s = resolve(&l, Profile::Production).expect("resolves");
        assert_eq!((s.config.decline_rate, s.config.seed, s.listen.port()), (1.0, 7, 1));
        let bad = Layers::of(&[("rail.stub.failure-rate", "1.5")]);
        assert!(resolve(&bad, Profile::Production).is_err_and(|e| e.contains("rail.stub.failure-rate")));
        assert_eq!(resolve(&Layers::default(), Profile::Production).expect("defaults").listen.port(), 8084);
    }
}
