//! Randomness. In simulation every value derives from the seed; in production from the OS.
//!
//! Services that need a reproducible stream of their own (the rail-stub's chaos, with
//! `--seed`) take a [`SeededRng`]; everything else calls [`random_u64`].

use rand::SeedableRng;
pub use rand::{Rng, RngCore};

/// A reproducible random stream.
pub type SeededRng = rand_chacha::ChaCha8Rng;

/// A fresh random `u64` from the runtime.
#[cfg(not(madsim))]
pub fn random_u64() -> u64 {
    rand::random()
}

/// A fresh random `u64` from the runtime: the simulation's seeded stream inside a madsim
/// runtime; outside one (a plain unit test in a madsim build) there is no seed to honour.
#[cfg(madsim)]
pub fn random_u64() -> u64 {
    if madsim::runtime::Handle::try_current().is_ok() {
        madsim::rand::random()
    } else {
        rand::random()
    }
}

/// `N` bytes for a secret (a credential, a signing key): the operating system's generator
/// in production; inside a madsim runtime the seeded stream, so a simulated world replays
/// (a simulated secret guards nothing real).
pub fn secret_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    #[cfg(madsim)]
    if madsim::runtime::Handle::try_current().is_ok() {
        for chunk in out.chunks_mut(8) {
            let word = madsim::rand::random::<u64>().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        return out;
    }
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut out);
    out
}

/// A stream seeded with `seed`: the same seed gives the same stream on every run.
pub fn seeded(seed: u64) -> SeededRng {
    SeededRng::seed_from_u64(seed)
}

/// A stream seeded from the runtime (so, in simulation, from the simulation's seed).
pub fn from_runtime() -> SeededRng {
    seeded(random_u64())
}

/// A random (version 4) UUID drawn from the runtime, so ids replay under a seed.
pub fn uuid_v4() -> uuid::Uuid {
    let hi = random_u64().to_be_bytes();
    let lo = random_u64().to_be_bytes();
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&hi);
    bytes[8..].copy_from_slice(&lo);
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

/// 16 random bytes as 32 lowercase hex characters: an OpenTelemetry trace id.
pub fn trace_id() -> String {
    let hi = random_u64();
    let lo = random_u64();
    format!("{hi:016x}{lo:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_gives_the_same_stream() {
        let a: Vec<u64> = (0..8)
            .map({
                let mut r = seeded(7);
                move |_| r.gen()
            })
            .collect();
        let b: Vec<u64> = (0..8)
            .map({
                let mut r = seeded(7);
                move |_| r.gen()
            })
            .collect();
        assert_eq!(a, b);
    }

    #[test]
    fn secret_bytes_differ_between_draws() {
        let (a, b) = (secret_bytes::<32>(), secret_bytes::<32>());
        assert_ne!(a, b);
        assert_ne!(a, [0u8; 32]);
    }

    #[test]
    fn trace_ids_are_32_hex_chars() {
        let t = trace_id();
        assert_eq!(t.len(), 32);
        assert!(t.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }
}
