//! The forger in a real run (docs/real-runs.md, "The forger"): the simulation's forger
//! (`dlock_sim::forger`), the same code, aimed at the real cluster after the settle phase
//! and before the checks, as a swarm seed runs it after its liveness phase.
//!
//! - **Forged writes**: [`dlock_sim::forger::FORGED_WRITES_PER_SEED`] fenced writes (claim,
//!   post or submission) at settled payouts read from paydb, under grants the lock server
//!   never signed for it (`dlock_sim::forger::Forgery`). Invariant `forged_write_refused`.
//! - **Owner attacks**: a victim bound to `owners=forger-victim/*` takes a grant; the forger,
//!   bound to `owners=forger/*`, sends each owner attack at it. Invariant
//!   `owner_attack_refused`.
//! - **A lapsed session**: a grant outlives nothing; once its session lapsed, renew and
//!   rotate must fail. Invariant `dead_grant_never_revived`.
//! - **A cross-account batch**: a claim batch of its own account `forger-a`, under a grant of
//!   that account's key signed with the cluster's key, naming a payout of its own account
//!   `forger-b`; the payout must come back `NOT_FOUND`. Invariant
//!   `fenced_write_within_its_account`.
//!
//! The two bound credentials are the run's own ([`Credentials`], handed to up.sh with
//! `--credentials-extra`); the grant key is the cluster's (`secrets/grant-signing.key`); its
//! forged writes carry the executors' worker credential, its own accounts and payout the
//! operator's. Its draws come from the run's seed. It does not replay the executors' signed
//! writes (a real run records no request headers): `plants.rs` says which planted bug that
//! leaves to the simulation.
//!
//! Invariants: every write it sends aims at a settled payout or at its own keys and
//! accounts (`forger-victim:*`, `forger-lapse:*`, `forger-a`, `forger-b`), so a forgery that
//! got through changes nothing the rest of the judgement reads; its credentials never reach
//! any output (`Secret`).

use std::path::Path;

use dlock_contract::auth::Secret;
use dlock_contract::grant::GrantSigner;
use dlock_rt::http::{BaseUrl, Bearer};
use dlock_rt::rand::Rng;
use dlock_sim::forger::{self, Aim, ForgerLog, Target};
use sqlx::Row;

/// Salt of the forger's draws from the run's seed.
const FORGER_SALT: u64 = 0x666f_7267_6572;

/// The two bound worker credentials of a run: the forger's and its victim's.
pub struct Credentials {
    pub forger: Secret,
    pub victim: Secret,
}

impl Credentials {
    /// Fresh random tokens (the operating system's generator: they guard a live cluster).
    pub fn fresh() -> Credentials {
        let token = || Secret::new(dlock_contract::auth::hex(&dlock_rt::rand::secret_bytes::<32>()));
        Credentials { forger: token(), victim: token() }
    }

    /// Their lines of a credentials file (C3-extensions E-13, E-9 "Owner binding").
    pub fn lines(&self) -> String {
        format!(
            "worker {} owners=forger/*\nworker {} owners=forger-victim/*\n",
            self.forger.expose(),
            self.victim.expose()
        )
    }
}

/// The forger's aim at a cluster: its URLs, its signing key (`secrets/grant-signing.key`
/// under `dir`), the executors' token for its writes, and the run's bound credentials.
pub fn aim(
    dir: &Path,
    payment: &[String],
    proxy: &[String],
    lock: &[String],
    creds: &Credentials,
) -> Result<Aim, String> {
    let parse = |urls: &[String]| -> Result<Vec<BaseUrl>, String> {
        urls.iter().map(|u| BaseUrl::parse(u).map_err(|e| format!("{u}: {e}"))).collect()
    };
    let key_file = dir.join("secrets/grant-signing.key");
    let text = std::fs::read_to_string(&key_file).map_err(|e| format!("{}: {e}", key_file.display()))?;
    let seed = dlock_contract::grant::parse_seed(&text).map_err(|e| format!("{}: {e}", key_file.display()))?;
    let writer = Bearer::file(&dir.join("secrets/executor-token"))?;
    let creator = Bearer::file(&dir.join("secrets/operator-token"))?;
    Ok(Aim {
        payment: parse(payment)?,
        proxy: parse(proxy)?,
        lock: parse(lock)?,
        signer: GrantSigner::from_seed(&seed),
        writer: Some(writer),
        creator: Some(creator),
        forger_token: creds.forger.clone(),
        victim_token: creds.victim.clone(),
    })
}

/// Settled payouts (POSTED or FAILED) in paydb, at most `TARGETS_MAX`, by id.
async fn settled(pool: &sqlx::PgPool) -> Result<Vec<Target>, String> {
    let q = "SELECT payout_id, account_id, amount_minor, currency, beneficiary_ref FROM payouts \
             WHERE state IN ('POSTED', 'FAILED') ORDER BY payout_id LIMIT $1";
    let rows = sqlx::query(q).bind(forger::TARGETS_MAX).fetch_all(pool).await.map_err(|e| e.to_string())?;
    rows.iter()
        .map(|r| {
            let id: String = r.try_get(0).map_err(|e| e.to_string())?;
            Ok(Target {
                payout_id: id.parse().map_err(|e| format!("payout id {id}: {e}"))?,
                account_id: r.try_get(1).map_err(|e| e.to_string())?,
                amount_minor: r.try_get(2).map_err(|e| e.to_string())?,
                currency: r.try_get(3).map_err(|e| e.to_string())?,
                beneficiary_ref: r.try_get(4).map_err(|e| e.to_string())?,
            })
        })
        .collect()
}

/// Runs the forger to its end (module doc); what it sent and what each got.
pub async fn run(aim: &Aim, pool: &sqlx::PgPool, seed: u64) -> Result<ForgerLog, String> {
    let mut rng = dlock_rt::rand::seeded(seed ^ FORGER_SALT);
    let log = ForgerLog::default();
    let targets = settled(pool).await?;
    let mut rogue_seed = [0u8; 32];
    rng.fill(&mut rogue_seed);
    let rogue = GrantSigner::from_seed(&rogue_seed);
    if !targets.is_empty() {
        for _ in 0..forger::FORGED_WRITES_PER_SEED {
            let target = &targets[rng.gen_range(0..targets.len())];
            forger::forge_one(aim, &rogue, target, rng.gen(), &log).await;
        }
    }
    forger::run_owner_attacks(aim, rng.gen(), &log).await;
    forger::run_lapsed_session(aim, rng.gen(), &log).await;
    forger::run_cross_account_batch(aim, rng.gen(), &log).await;
    Ok(log)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_credentials_are_fresh_and_never_printed() {
        let (a, b) = (Credentials::fresh(), Credentials::fresh());
        assert_ne!(a.forger.expose(), b.forger.expose());
        assert_ne!(a.forger.expose(), a.victim.expose());
        let lines = a.lines();
        assert!(lines.contains(&format!("worker {} owners=forger/*\n", a.forger.expose())), "{lines}");
        assert!(lines.contains(&format!("worker {} owners=forger-victim/*\n", a.victim.expose())), "{lines}");
        assert_eq!(format!("{:?}", a.forger), "***");
    }
}
