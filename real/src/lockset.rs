//! The lock-set workload, after Jepsen's etcd `lock-set`: clients add elements to a shared
//! set, each under a dlock lock, as read-modify-write (acquire, read the set, add one
//! element, write the set back, release), while a pause nemesis stalls a client inside its
//! critical section for [`STALL_MS`], past its [`LEASE_MS`] lease (a GC pause). Two sets run
//! side by side, each with its own clients and lock key:
//! - **fenced**: the read carries the grant's fencing token and raises the set's fence,
//!   refused unless the token is strictly above the one stored (`UPDATE … SET fence = $token
//!   WHERE fence < $token RETURNING elements`), and the write is accepted only while the
//!   fence is still that token, as dlock's claim and post are. A stalled client wakes
//!   fenced out and its write is refused. (A fence on the write alone is not enough for a
//!   read-modify-write: a stale write can land between a newer holder's read and its
//!   write, which then drops it; docs/real-runs.md "The lock-set workload".);
//! - **control**: the same clients and lock, and no fence: a stalled client wakes and
//!   overwrites the set with what it read before its stall, losing every element added
//!   meanwhile.
//!
//! An element is acknowledged when its write reported one row written. At the end every
//! acknowledged element must be in the fenced set ([`ids::LOCK_SET_KEEPS_ACKNOWLEDGED`]);
//! the control's lost elements are counted and reported beside it.
//!
//! Invariants: each set is a row of its own database (`setdb`), never paydb; a client
//! writes at most once per grant; the sets are bounded by [`ELEMENTS_MAX`] each.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_lock_client::{LockClient, LockClientConfig, LockClientError};
use dlock_rt::http::{BaseUrl, Bearer};
use dlock_rt::rand::Rng;

/// The ids of the workload's invariants.
pub mod ids {
    /// Every element a fenced write acknowledged is in the fenced set at the end.
    pub const LOCK_SET_KEEPS_ACKNOWLEDGED: &str = "lock_set_keeps_every_acknowledged_element";
}

/// Clients per set.
pub const CLIENTS: usize = 4;
/// The clients' lease, and the stall inside the critical section.
pub const LEASE_MS: u64 = crate::run::LEASE_MS;
pub const STALL_MS: u64 = crate::run::STALL_MS;
/// Probability that a client stalls inside one critical section.
pub const STALL_RATE: f64 = 0.2;
/// Bound on each set's elements (the workload stops adding past it).
pub const ELEMENTS_MAX: usize = 20_000;
/// A client's pause after a refused acquire.
pub const BACKOFF_MS: u64 = 50;

/// One set's outcome.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SetOutcome {
    pub acknowledged: usize,
    pub refused: usize,
    pub final_size: usize,
    pub lost: Vec<String>,
}

/// Both sets' outcomes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LockSetOutcome {
    pub fenced: SetOutcome,
    pub control: SetOutcome,
}

struct Shared {
    pool: sqlx::PgPool,
    acked: [Mutex<BTreeSet<String>>; 2],
    refused: [Mutex<usize>; 2],
}

fn err(e: sqlx::Error) -> String {
    e.to_string()
}

const SETS: [&str; 2] = ["fenced", "control"];

/// The running workload.
pub struct LockSet {
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl LockSet {
    /// Creates `setdb` and its two sets, and starts the clients on the lock servers
    /// (`lock_urls`, alternating), acting with the worker credential in `token_file`.
    pub async fn start(
        paydb_url: &str,
        lock_urls: &[String],
        token_file: &std::path::Path,
        seed: u64,
        stop: Arc<AtomicBool>,
    ) -> Result<LockSet, String> {
        let pool = crate::cluster::create_database(paydb_url, "setdb", u32::try_from(2 * CLIENTS).unwrap_or(8)).await?;
        sqlx::query("CREATE TABLE lock_sets (name TEXT PRIMARY KEY, elements TEXT NOT NULL, fence BIGINT NOT NULL)")
            .execute(&pool)
            .await
            .map_err(err)?;
        for name in SETS {
            sqlx::query("INSERT INTO lock_sets VALUES ($1, '', 0)").bind(name).execute(&pool).await.map_err(err)?;
        }
        let bearer = Bearer::file(token_file)?;
        let shared = Arc::new(Shared {
            pool,
            acked: [Mutex::new(BTreeSet::new()), Mutex::new(BTreeSet::new())],
            refused: [Mutex::new(0), Mutex::new(0)],
        });
        let mut tasks = Vec::new();
        for (s, name) in SETS.iter().enumerate() {
            for c in 0..CLIENTS {
                let url = lock_urls.get(c % lock_urls.len().max(1)).cloned().unwrap_or_default();
                let base = BaseUrl::parse(&url).map_err(|e| format!("{url}: {e:?}"))?;
                let owner = dlock_contract::headers::OwnerId::parse(&format!("lockset-{name}-{c}"))
                    .map_err(|e| format!("{e:?}"))?;
                let mut config = LockClientConfig::new(base, owner);
                config.lock_ttl_ms = LEASE_MS;
                config.bearer = Some(bearer.clone());
                let client = LockClient::new(config).map_err(|e| e.to_string())?;
                let (shared, stop) = (shared.clone(), stop.clone());
                let seed = seed ^ ((s * CLIENTS + c) as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                tasks.push(tokio::spawn(async move {
                    client_loop(client, shared, s, c, seed, stop).await;
                }));
            }
        }
        Ok(LockSet { shared, tasks })
    }

    /// Waits for the clients (after `stop`) and judges both sets.
    pub async fn finish(self) -> Result<LockSetOutcome, String> {
        for t in self.tasks {
            let _ = t.await;
        }
        let mut out = LockSetOutcome::default();
        for (s, name) in SETS.iter().enumerate() {
            let (elements,): (String,) = sqlx::query_as("SELECT elements FROM lock_sets WHERE name = $1")
                .bind(*name)
                .fetch_one(&self.shared.pool)
                .await
                .map_err(err)?;
            let present: BTreeSet<&str> = elements.split(',').filter(|e| !e.is_empty()).collect();
            let acked = self.shared.acked[s].lock().map(|g| g.clone()).unwrap_or_default();
            let o = SetOutcome {
                acknowledged: acked.len(),
                refused: self.shared.refused[s].lock().map(|g| *g).unwrap_or(0),
                final_size: present.len(),
                lost: acked.iter().filter(|e| !present.contains(e.as_str())).cloned().collect(),
            };
            if s == 0 {
                out.fenced = o;
            } else {
                out.control = o;
            }
        }
        Ok(out)
    }
}

/// One client: acquire, read, (stall), add, write, release, until `stop`.
async fn client_loop(client: LockClient, shared: Arc<Shared>, set: usize, c: usize, seed: u64, stop: Arc<AtomicBool>) {
    let mut rng = dlock_rt::rand::seeded(seed);
    let key = format!("lock-set-{}", SETS[set]);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let session = match client.open_session().await {
            Ok(s) => s,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(BACKOFF_MS)).await;
                continue;
            }
        };
        while !stop.load(Ordering::Relaxed) && session.is_alive() {
            let guard = match session.acquire(&key).await {
                Ok(g) => g,
                Err(LockClientError::Ambiguous { .. }) => break, // a new session (the crate's rule)
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(BACKOFF_MS)).await;
                    continue;
                }
            };
            let token = guard.token().get();
            // The fenced set's read passes the fence too and raises it (as dlock's claim does
            // before any payout moves): a stale holder that wakes after this read can no longer
            // write. A fence on the write alone would let a stale write land between a newer
            // holder's read and its write, and the newer write would then drop it.
            let read: Result<Option<(String,)>, sqlx::Error> = if set == 0 {
                sqlx::query_as("UPDATE lock_sets SET fence = $2 WHERE name = $1 AND fence < $2 RETURNING elements")
                    .bind(SETS[set])
                    .bind(token)
                    .fetch_optional(&shared.pool)
                    .await
            } else {
                sqlx::query_as("SELECT elements FROM lock_sets WHERE name = $1")
                    .bind(SETS[set])
                    .fetch_optional(&shared.pool)
                    .await
            };
            let elements = match read {
                Ok(Some((e,))) => e,
                Ok(None) => {
                    if let Ok(mut r) = shared.refused[set].lock() {
                        *r += 1;
                    }
                    let _ = guard.release().await;
                    continue;
                }
                Err(_) => {
                    let _ = guard.release().await;
                    continue;
                }
            };
            if elements.matches(',').count() + 1 >= ELEMENTS_MAX {
                let _ = guard.release().await;
                return;
            }
            if rng.gen_bool(STALL_RATE) {
                tokio::time::sleep(Duration::from_millis(STALL_MS)).await;
            }
            n += 1;
            let element = format!("c{c}-{n}");
            let written = if elements.is_empty() { element.clone() } else { format!("{elements},{element}") };
            let result = if set == 0 {
                sqlx::query("UPDATE lock_sets SET elements = $1 WHERE name = 'fenced' AND fence = $2")
                    .bind(&written)
                    .bind(token)
                    .execute(&shared.pool)
                    .await
            } else {
                sqlx::query("UPDATE lock_sets SET elements = $1 WHERE name = 'control'")
                    .bind(&written)
                    .execute(&shared.pool)
                    .await
            };
            match result {
                Ok(r) if r.rows_affected() == 1 => {
                    if let Ok(mut a) = shared.acked[set].lock() {
                        a.insert(element);
                    }
                }
                Ok(_) => {
                    if let Ok(mut r) = shared.refused[set].lock() {
                        *r += 1;
                    }
                }
                Err(_) => {} // unknown outcome: neither acknowledged nor counted refused
            }
            let _ = guard.release().await;
        }
        let _ = session.close().await;
    }
}
