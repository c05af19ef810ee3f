//! lockdb on etcd (`--backend etcd --etcd-endpoints …`), through `etcd-client` (in
//! simulation: `madsim-etcd-client`'s simulated server, through the same API).
//!
//! ## Key layout
//! Everything lives under one prefix `P` (default `/dlock`), so several deployments or test
//! runs can share one etcd:
//! - `P/s/{session_id}`: a session, JSON `{owner_id, ttl_ms, expires_at_ms, expired_marked}`.
//! - `P/g/{key}`: the grant of a key, JSON `{session_id, owner_id, acquired_at_ms,
//!   expires_at_ms, nonce}`. At most one per key, by construction (it is one etcd key).
//! - `P/k/{key}`: the key was seen (`info` answers `Some`), with its lock-delay
//!   `{delay_until_ms}`. Written by every grant and by every removal of a lost grant.
//! - `P/r/{revocation_id}`: the audit record of a revoke `{key, operator, reason,
//!   revoked_token, at_ms}`; its CreateRevision is the new token floor.
//!
//! Every value is non-empty JSON: the existence test below relies on it.
//!
//! ## Tokens (FR-10)
//! The token of a grant is the ModRevision of the transaction that wrote `P/g/{key}`. The
//! granting transaction requires the key to be absent, so that revision is also the key's
//! CreateRevision, which a renew (a put over the existing key) leaves alone: the token is read
//! back as `create_revision` wherever the grant is read. etcd's revision is one global
//! counter that every write transaction advances and that survives restarts (it is in the
//! WAL and the snapshot), so tokens strictly increase across keys, sessions and restarts.
//! Callers may rely only on their order (they are not dense: every write advances the
//! revision).
//!
//! **Floor.** A revoke writes its audit record in the same transaction that deletes the
//! grant, as that transaction's first put; the record's CreateRevision is the revoke's own
//! revision and is returned as `new_token_floor`. Every later transaction has a greater
//! revision, so every later token exceeds the floor, with no stored counter to keep in step:
//! the floor is etcd's revision counter itself, and it survives whatever etcd's data survives.
//!
//! ## Transactions and the value-compare trap
//! Each method reads what it needs (one read-only txn, or two when a grant's holder session
//! must be looked up), decides, and commits one guarded txn whose compares assert that every
//! record it decided on is unchanged; if a guard fails, it re-reads and decides again, at most
//! [`CAS_ATTEMPTS_MAX`] times (then `Unavailable`). That is optimistic concurrency control:
//! the committed txn is the atomic step, and its guards make it serialisable with every other.
//!
//! The simulator evaluates only *value* compares, and a `NotEqual` on a missing key is true
//! there but false on real etcd (real etcd fails every value compare on a missing key). So:
//! - "record unchanged" is `value(k) == bytes read` on a key that was read as present. Equal
//!   on a missing key is false on both. A grant carries a random `nonce`, so equal bytes mean
//!   the same grant (no ABA: a released and re-granted key never has the same value).
//! - "record absent" is expressed without `NotEqual`: `value(k) > ""` is true exactly when
//!   `k` exists (all values are non-empty; a missing key fails it on both), and the guarded
//!   ops go in the *else* branch: `if value(k) > "" then {} else { txn(rest) }`, nested once
//!   per key that must be absent. Nested txns are in etcd since 3.3 and in the simulator.
//! - `NotEqual`, `version`, `create_revision` and `mod_revision` compares are never used.
//!
//! A second simulator quirk: inside one txn it gives each put its own revision (`r+1`,
//! `r+2`, …) and then resets the store's revision to `r+1`, where real etcd gives every op
//! of a txn the same revision `r+1`. Only the *first* put of a txn gets the same revision on
//! both, so the one put whose revision is used (the grant's, the revocation record's) is
//! always the first op of its txn, and the revision is read back inside the same txn with a
//! `get` rather than taken from the header.
//!
//! ## Time
//! etcd has no clock API, and its leases cannot carry these semantics (see below). `now` is
//! this replica's wall clock ([`Clock`], with the node's skew in simulation), made monotonic
//! per process. The trait wants the backend's clock to decide, so that replicas agree; here
//! replicas with skewed clocks can disagree about *when* a grant died, by the skew. What
//! they cannot do is disagree about *which* grant exists: every grant, renew, release and
//! removal is a guarded txn on the one `P/g/{key}` record, so there is never more than one
//! grant of a key in the store (invariant 1 holds whatever the clocks say), and a grant is
//! only ever replaced after some replica judged it dead. A replica whose clock runs `d` ms
//! ahead of the granting replica's ends a grant `d` ms early in real time; the client treats
//! its lock as lost after 70% of the TTL (FR-11), so with the minimum TTL of 1 s the holder
//! has stopped before any replica reassigns the key as long as replica skew plus one round
//! trip stays under 300 ms (NTP keeps it to milliseconds). Past that bound, the fencing
//! token still rejects the old holder's writes at the resource, because every reassignment
//! issues a greater token. Operators running the etcd backend must keep replica clocks
//! synchronised; the PostgreSQL backend does not need it.
//!
//! ## Why sessions are not etcd leases
//! etcd leases have second granularity, a server-enforced minimum TTL (about 1.5 election
//! timeouts, typically 2 s+), and their expiry *deletes* the attached keys: the store could
//! no longer answer `SESSION_EXPIRED` (distinct from unknown, for a retention period), nor
//! record the lock-delay of a grant that died with its session, nor decide expiry at the
//! millisecond `expires_at` the contract returns. The simulator's leases tick once a second.
//! So sessions are records judged by `expires_at_ms`, like the SQL backends; the reaper
//! removes what died.
//!
//! ## Limits
//! - `heartbeat`, `close_session` and `reap` scan `P/g/` (all grants): O(grants) per call. A
//!   per-session index would make them O(held); not needed at the sizes this serves today.
//! - A session's grants are removed in chunks of [`GRANTS_PER_TXN_MAX`] to stay under etcd's
//!   `--max-txn-ops` (default 128); a session holding more is closed in several txns.
//! - Every RPC is bounded by [`RPC_MS_MAX`]; unreachable etcd, no leader (requests require
//!   one), a timeout or any etcd error is `Unavailable` (503 `NOT_LEADER`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};

use async_trait::async_trait;
use dlock_rt::{Clock, Duration};
use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::store::{
    AcquireRefusal, GrantRow, KeyInfo, LockStore, ReapReport, RenewRefusal, Revocation, RevokeRefusal, SessionRefusal,
    SessionRow, StoreError,
};

/// Bound on one etcd round trip (connect, read, or txn).
pub const RPC_MS_MAX: u64 = 2_000;
/// Bound on optimistic retries of one method whose guard failed under contention.
pub const CAS_ATTEMPTS_MAX: usize = 64;
/// Grants removed per txn (2 ops each, plus one for the session) under etcd's default
/// `--max-txn-ops` of 128.
pub const GRANTS_PER_TXN_MAX: usize = 40;
/// The prefix when the operator names none.
pub const DEFAULT_PREFIX: &str = "/dlock";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SessionVal {
    owner_id: String,
    ttl_ms: i64,
    expires_at_ms: i64,
    expired_marked: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct GrantVal {
    session_id: Uuid,
    owner_id: String,
    acquired_at_ms: i64,
    expires_at_ms: i64,
    /// Makes every grant's bytes unique, so a value compare identifies one grant.
    nonce: Uuid,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct KeyVal {
    delay_until_ms: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct RevocationVal {
    key: String,
    operator: String,
    reason: String,
    revoked_token: i64,
    at_ms: i64,
}

/// One stored record: its raw bytes (for guards), decoded value and CreateRevision.
#[derive(Debug, Clone)]
struct Rec<T> {
    key: String,
    raw: Vec<u8>,
    val: T,
    create_rev: i64,
}

/// One raw key-value as read.
#[derive(Debug, Clone)]
struct Entry {
    key: String,
    value: Vec<u8>,
    create_rev: i64,
}

impl Entry {
    fn decode<T: DeserializeOwned>(self) -> Result<Rec<T>, StoreError> {
        let val = serde_json::from_slice(&self.value)
            .map_err(|e| StoreError::Corrupt(format!("etcd value at {}: {e}", self.key)))?;
        Ok(Rec { key: self.key, raw: self.value, val, create_rev: self.create_rev })
    }
}

enum Read {
    Key(String),
    Prefix(String),
}

/// A guard of a commit.
enum Cond {
    /// The key holds exactly these bytes.
    Is(String, Vec<u8>),
    /// The key does not exist.
    Absent(String),
}

impl Cond {
    fn of<T>(rec: &Rec<T>) -> Cond {
        Cond::Is(rec.key.clone(), rec.raw.clone())
    }

    fn of_opt<T>(rec: Option<&Rec<T>>, key: String) -> Cond {
        rec.map_or(Cond::Absent(key), Cond::of)
    }
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(v).map_err(|e| StoreError::Corrupt(format!("encode: {e}")))
}

fn unavailable(e: etcd_client::Error) -> StoreError {
    StoreError::Unavailable(format!("etcd: {e}"))
}

fn contended(what: &str) -> StoreError {
    StoreError::Unavailable(format!("etcd: {what} kept conflicting after {CAS_ATTEMPTS_MAX} attempts"))
}

/// When a grant dies: its own lease end, or its session's, whichever is first.
fn died_at(g: &GrantVal, holder: &SessionVal) -> i64 {
    holder.expires_at_ms.min(g.expires_at_ms)
}

/// When a grant dies, given its holder session as read; `None` when that session is gone
/// (closed, or forgotten after retention). Such an orphan can only arise when an acquire
/// commits beside a concurrent close of the same session (neither changes the session's
/// value, so neither guard sees the other); it counts as released by the close: dead, with
/// no lock-delay.
fn death(g: &GrantVal, holder: Option<&SessionVal>) -> Option<i64> {
    holder.map(|s| died_at(g, s))
}

fn live(g: &GrantVal, holder: Option<&SessionVal>, now: i64) -> bool {
    death(g, holder).is_some_and(|t| now < t)
}

fn grant_row(key: &str, g: &Rec<GrantVal>) -> GrantRow {
    GrantRow {
        key: key.to_owned(),
        session_id: g.val.session_id,
        owner_id: g.val.owner_id.clone(),
        fencing_token: g.create_rev,
        acquired_at_ms: g.val.acquired_at_ms,
        expires_at_ms: g.val.expires_at_ms,
    }
}

fn session_row(id: Uuid, s: &SessionVal) -> SessionRow {
    SessionRow { session_id: id, owner_id: s.owner_id.clone(), ttl_ms: s.ttl_ms, expires_at_ms: s.expires_at_ms }
}

fn session_check(s: Option<&Rec<SessionVal>>, now: i64) -> Result<&Rec<SessionVal>, SessionRefusal> {
    match s {
        None => Err(SessionRefusal::Unknown),
        Some(s) if now < s.val.expires_at_ms => Ok(s),
        Some(_) => Err(SessionRefusal::Expired),
    }
}

/// lockdb on etcd.
pub struct EtcdLockStore {
    client: Client,
    prefix: String,
    clock: Clock,
    /// The greatest `now` handed out by this process: the clock never runs backwards.
    last_now: AtomicI64,
}

impl std::fmt::Debug for EtcdLockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLockStore").field("prefix", &self.prefix).field("clock", &self.clock).finish()
    }
}

impl EtcdLockStore {
    /// Connects to etcd at `endpoints` (`http://host:port`), keeping every record under
    /// `prefix`. Leases are judged by this node's wall clock.
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<EtcdLockStore, StoreError> {
        Self::connect_with_clock(endpoints, prefix, Clock::system()).await
    }

    /// [`EtcdLockStore::connect`] with the node's clock (its skew, in simulation).
    pub async fn connect_with_clock(
        endpoints: &[String],
        prefix: &str,
        clock: Clock,
    ) -> Result<EtcdLockStore, StoreError> {
        if endpoints.is_empty() {
            return Err(StoreError::Unavailable("etcd: no endpoints given".into()));
        }
        let prefix = prefix.trim_end_matches('/');
        let prefix = if prefix.is_empty() { DEFAULT_PREFIX.to_owned() } else { prefix.to_owned() };
        let client = Self::client(endpoints).await?;
        let store = EtcdLockStore { client, prefix, clock, last_now: AtomicI64::new(i64::MIN) };
        store.ping().await?;
        Ok(store)
    }

    #[cfg(not(madsim))]
    async fn client(endpoints: &[String]) -> Result<Client, StoreError> {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(std::time::Duration::from_millis(RPC_MS_MAX))
            .with_timeout(std::time::Duration::from_millis(RPC_MS_MAX))
            .with_require_leader(true);
        Self::bounded(Client::connect(endpoints, Some(options))).await
    }

    #[cfg(madsim)]
    async fn client(endpoints: &[String]) -> Result<Client, StoreError> {
        // The simulator dials `host:port` and takes the first endpoint only.
        let plain: Vec<String> = endpoints
            .iter()
            .map(|e| e.trim_start_matches("http://").trim_start_matches("https://").to_owned())
            .collect();
        Self::bounded(Client::connect(&plain, None)).await
    }

    async fn bounded<T>(f: impl std::future::Future<Output = Result<T, etcd_client::Error>>) -> Result<T, StoreError> {
        match dlock_rt::timeout(Duration::from_millis(RPC_MS_MAX), f).await {
            Some(r) => r.map_err(unavailable),
            None => Err(StoreError::Unavailable(format!("etcd: no answer within {RPC_MS_MAX} ms"))),
        }
    }

    fn now(&self) -> i64 {
        let wall = self.clock.wall().timestamp_millis();
        let prev = self.last_now.fetch_max(wall, Ordering::SeqCst);
        prev.max(wall)
    }

    fn session_key(&self, id: Uuid) -> String {
        format!("{}/s/{id}", self.prefix)
    }

    fn sessions_prefix(&self) -> String {
        format!("{}/s/", self.prefix)
    }

    fn grant_key(&self, key: &str) -> String {
        format!("{}/g/{key}", self.prefix)
    }

    fn grants_prefix(&self) -> String {
        format!("{}/g/", self.prefix)
    }

    fn key_key(&self, key: &str) -> String {
        format!("{}/k/{key}", self.prefix)
    }

    fn revocation_key(&self, id: Uuid) -> String {
        format!("{}/r/{id}", self.prefix)
    }

    /// The lock key of a grant record's etcd key.
    fn lock_key_of<'a>(&self, grant_key: &'a str) -> &'a str {
        grant_key.strip_prefix(&self.grants_prefix()).unwrap_or(grant_key)
    }

    /// One read-only txn: a consistent snapshot of every key or prefix asked for.
    async fn read(&self, reads: Vec<Read>) -> Result<Vec<Vec<Entry>>, StoreError> {
        let n = reads.len();
        let ops: Vec<TxnOp> = reads
            .into_iter()
            .map(|r| match r {
                // `None`: an exact get (the simulator's `GetOptions::new()` means prefix).
                Read::Key(k) => TxnOp::get(k, None),
                Read::Prefix(p) => TxnOp::get(p, Some(GetOptions::new().with_prefix())),
            })
            .collect();
        let mut kv = self.client.kv_client();
        let resp = Self::bounded(kv.txn(Txn::new().when(Vec::<Compare>::new()).and_then(ops))).await?;
        let mut out = Vec::with_capacity(n);
        for op in resp.op_responses() {
            let TxnOpResponse::Get(get) = op else {
                return Err(StoreError::Corrupt("etcd: read txn answered a non-get".into()));
            };
            let mut entries = Vec::new();
            for kv in get.kvs() {
                let key = String::from_utf8(kv.key().to_vec())
                    .map_err(|e| StoreError::Corrupt(format!("etcd: non-utf8 key: {e}")))?;
                entries.push(Entry { key, value: kv.value().to_vec(), create_rev: kv.create_revision() });
            }
            out.push(entries);
        }
        if out.len() != n {
            return Err(StoreError::Corrupt(format!("etcd: read txn answered {} of {n} gets", out.len())));
        }
        Ok(out)
    }

    async fn read_one<T: DeserializeOwned>(&self, key: String) -> Result<Option<Rec<T>>, StoreError> {
        let mut r = self.read(vec![Read::Key(key)]).await?;
        r.pop().and_then(|mut e| e.pop()).map(Entry::decode).transpose()
    }

    /// Commits `ops` iff every guard holds; returns the ops' responses, or `None` when a guard
    /// failed (nothing was written). See the module doc for how `Absent` is expressed.
    async fn commit(&self, conds: Vec<Cond>, ops: Vec<TxnOp>) -> Result<Option<Vec<TxnOpResponse>>, StoreError> {
        let mut equal = Vec::new();
        let mut absent = Vec::new();
        for c in conds {
            match c {
                Cond::Is(k, v) => equal.push(Compare::value(k, CompareOp::Equal, v)),
                Cond::Absent(k) => absent.push(k),
            }
        }
        let mut txn = Txn::new().when(equal).and_then(ops);
        for k in absent.iter().rev() {
            txn = Txn::new()
                .when(vec![Compare::value(k.as_str(), CompareOp::Greater, Vec::new())])
                .and_then(Vec::<TxnOp>::new())
                .or_else(vec![TxnOp::txn(txn)]);
        }
        let mut kv = self.client.kv_client();
        let mut resp = Self::bounded(kv.txn(txn)).await?;
        for _ in &absent {
            if resp.succeeded() {
                return Ok(None); // the key exists
            }
            match resp.op_responses().into_iter().next() {
                Some(TxnOpResponse::Txn(inner)) => resp = inner,
                _ => return Err(StoreError::Corrupt("etcd: nested txn answered no txn".into())),
            }
        }
        Ok(resp.succeeded().then(|| resp.op_responses()))
    }

    /// The holder session of a grant, reusing one already read when it is the same.
    async fn holder(&self, g: &GrantVal, known: Option<(Uuid, &SessionVal)>) -> Result<Option<SessionVal>, StoreError> {
        if let Some((id, s)) = known {
            if id == g.session_id {
                return Ok(Some(s.clone()));
            }
        }
        Ok(self.read_one::<SessionVal>(self.session_key(g.session_id)).await?.map(|r| r.val))
    }

    /// Key records of `keys`, for merging lock-delays.
    async fn key_records(&self, keys: &[String]) -> Result<BTreeMap<String, Rec<KeyVal>>, StoreError> {
        let mut out = BTreeMap::new();
        for chunk in keys.chunks(GRANTS_PER_TXN_MAX) {
            let reads = chunk.iter().map(|k| Read::Key(self.key_key(k))).collect();
            for (k, mut entries) in chunk.iter().zip(self.read(reads).await?) {
                if let Some(e) = entries.pop() {
                    out.insert(k.clone(), e.decode()?);
                }
            }
        }
        Ok(out)
    }

    /// Guards and ops removing grant `g`. A lost grant (`lost_at`: when it died)
    /// records its lock-delay, never lowering one already recorded.
    fn drop_ops(
        &self,
        g: &Rec<GrantVal>,
        rec: Option<&Rec<KeyVal>>,
        lost_at: Option<i64>,
        delay_ms: i64,
        (conds, ops): (&mut Vec<Cond>, &mut Vec<TxnOp>),
    ) -> Result<(), StoreError> {
        let key = self.lock_key_of(&g.key);
        conds.push(Cond::of(g));
        ops.push(TxnOp::delete(g.key.clone(), None));
        if let Some(died) = lost_at.filter(|_| delay_ms > 0) {
            let until = died + delay_ms;
            let old = rec.and_then(|r| r.val.delay_until_ms);
            let val = KeyVal { delay_until_ms: Some(old.map_or(until, |o| o.max(until))) };
            conds.push(Cond::of_opt(rec, self.key_key(key)));
            ops.push(TxnOp::put(self.key_key(key), encode(&val)?, None));
        }
        Ok(())
    }

    /// Removes the grants of session `s` (all, or in chunks) and then applies `last` (the
    /// session's own change) in the txn of the last chunk. `lost_at(g)` says whether and
    /// when each grant died. Returns how many grants were removed, or `None` if a guard
    /// failed (then the remaining chunks were not tried).
    async fn remove_session_grants(
        &self,
        grants: &[&Rec<GrantVal>],
        lost_at: impl Fn(&GrantVal) -> Option<i64>,
        delay_ms: i64,
        last: (Cond, TxnOp),
    ) -> Result<Option<u64>, StoreError> {
        let keys: Vec<String> = grants.iter().map(|g| self.lock_key_of(&g.key).to_owned()).collect();
        let records = if delay_ms > 0 && grants.iter().any(|g| lost_at(&g.val).is_some()) {
            self.key_records(&keys).await?
        } else {
            BTreeMap::new()
        };
        let chunks: Vec<&[&Rec<GrantVal>]> =
            if grants.is_empty() { vec![&[][..]] } else { grants.chunks(GRANTS_PER_TXN_MAX).collect() };
        let mut removed = 0;
        let mut last = Some(last);
        let n = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            let (mut conds, mut ops) = (Vec::new(), Vec::new());
            for g in chunk {
                let key = self.lock_key_of(&g.key);
                self.drop_ops(g, records.get(key), lost_at(&g.val), delay_ms, (&mut conds, &mut ops))?;
            }
            if i + 1 == n {
                if let Some((c, op)) = last.take() {
                    conds.push(c);
                    ops.push(op);
                }
            }
            if self.commit(conds, ops).await?.is_none() {
                return Ok(None);
            }
            removed += chunk.len() as u64;
        }
        Ok(Some(removed))
    }

    /// Every grant record, in key order.
    fn grants_of(entries: Vec<Entry>) -> Result<Vec<Rec<GrantVal>>, StoreError> {
        entries.into_iter().map(Entry::decode).collect()
    }
}

fn token_of(resps: &[TxnOpResponse]) -> Result<i64, StoreError> {
    for r in resps.iter().rev() {
        if let TxnOpResponse::Get(get) = r {
            if let Some(kv) = get.kvs().first() {
                return Ok(kv.create_revision());
            }
        }
    }
    Err(StoreError::Corrupt("etcd: the granting txn did not read its record back".into()))
}

#[async_trait]
impl LockStore for EtcdLockStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.read(vec![Read::Key(format!("{}/ping", self.prefix))]).await.map(|_| ())
    }

    async fn now_ms(&self) -> Result<i64, StoreError> {
        Ok(self.now())
    }

    async fn open_session(&self, session_id: Uuid, owner_id: &str, ttl_ms: i64) -> Result<SessionRow, StoreError> {
        let now = self.now();
        let val =
            SessionVal { owner_id: owner_id.to_owned(), ttl_ms, expires_at_ms: now + ttl_ms, expired_marked: false };
        let ops = vec![TxnOp::put(self.session_key(session_id), encode(&val)?, None)];
        self.commit(Vec::new(), ops).await?;
        Ok(session_row(session_id, &val))
    }

    async fn heartbeat(&self, session_id: Uuid) -> Result<Result<(SessionRow, i64), SessionRefusal>, StoreError> {
        for _ in 0..CAS_ATTEMPTS_MAX {
            let now = self.now();
            let mut r =
                self.read(vec![Read::Key(self.session_key(session_id)), Read::Prefix(self.grants_prefix())]).await?;
            let grants = Self::grants_of(r.pop().unwrap_or_default())?;
            let session = r.pop().and_then(|mut e| e.pop()).map(Entry::decode::<SessionVal>).transpose()?;
            let s = match session_check(session.as_ref(), now) {
                Ok(s) => s,
                Err(refusal) => return Ok(Err(refusal)),
            };
            let held = grants.iter().filter(|g| g.val.session_id == session_id && now < g.val.expires_at_ms).count();
            let val = SessionVal { expires_at_ms: now + s.val.ttl_ms, ..s.val.clone() };
            let ops = vec![TxnOp::put(s.key.clone(), encode(&val)?, None)];
            if self.commit(vec![Cond::of(s)], ops).await?.is_some() {
                return Ok(Ok((session_row(session_id, &val), held as i64)));
            }
        }
        Err(contended("heartbeat"))
    }

    async fn close_session(&self, session_id: Uuid, delay_ms: i64) -> Result<Result<(), SessionRefusal>, StoreError> {
        for _ in 0..CAS_ATTEMPTS_MAX {
            let now = self.now();
            let mut r =
                self.read(vec![Read::Key(self.session_key(session_id)), Read::Prefix(self.grants_prefix())]).await?;
            let grants = Self::grants_of(r.pop().unwrap_or_default())?;
            let Some(s) = r.pop().and_then(|mut e| e.pop()).map(Entry::decode::<SessionVal>).transpose()? else {
                return Ok(Err(SessionRefusal::Unknown));
            };
            let mine: Vec<&Rec<GrantVal>> = grants.iter().filter(|g| g.val.session_id == session_id).collect();
            // Died before the close (lease or session lapsed): its lock-delay stands.
            let lost_at = |g: &GrantVal| Some(died_at(g, &s.val)).filter(|d| *d <= now);
            let last = (Cond::of(&s), TxnOp::delete(s.key.clone(), None));
            if self.remove_session_grants(&mine, lost_at, delay_ms, last).await?.is_some() {
                return Ok(Ok(()));
            }
        }
        Err(contended("close"))
    }

    async fn acquire(
        &self,
        key: &str,
        session_id: Uuid,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, AcquireRefusal>, StoreError> {
        let (skey, gkey, kkey) = (self.session_key(session_id), self.grant_key(key), self.key_key(key));
        for _ in 0..CAS_ATTEMPTS_MAX {
            let now = self.now();
            let mut r =
                self.read(vec![Read::Key(skey.clone()), Read::Key(gkey.clone()), Read::Key(kkey.clone())]).await?;
            let rec = r.pop().and_then(|mut e| e.pop()).map(Entry::decode::<KeyVal>).transpose()?;
            let grant = r.pop().and_then(|mut e| e.pop()).map(Entry::decode::<GrantVal>).transpose()?;
            let session = r.pop().and_then(|mut e| e.pop()).map(Entry::decode::<SessionVal>).transpose()?;
            // The session is checked in the same txn that grants (Jepsen etcd 3.4.3).
            let s = match session_check(session.as_ref(), now) {
                Ok(s) => s,
                Err(refusal) => return Ok(Err(AcquireRefusal::Session(refusal))),
            };
            if let Some(g) = grant {
                let holder = self.holder(&g.val, Some((session_id, &s.val))).await?;
                let died = death(&g.val, holder.as_ref());
                if died.is_some_and(|t| now < t) {
                    return Ok(Err(if g.val.session_id == session_id {
                        AcquireRefusal::AlreadyHeld { fencing_token: g.create_rev, expires_at_ms: g.val.expires_at_ms }
                    } else {
                        AcquireRefusal::Contended {
                            holder_owner_id: g.val.owner_id,
                            expires_at_ms: g.val.expires_at_ms,
                        }
                    }));
                }
                // A dead grant in the way: remove it (recording its lock-delay) in its own
                // txn, then decide again. Death is final, so only the grant itself is guarded.
                let (mut conds, mut ops) = (Vec::new(), Vec::new());
                self.drop_ops(&g, rec.as_ref(), died, delay_ms, (&mut conds, &mut ops))?;
                self.commit(conds, ops).await?;
                continue;
            }
            if let Some(until) = rec.as_ref().and_then(|r| r.val.delay_until_ms).filter(|u| now < *u) {
                return Ok(Err(AcquireRefusal::Delayed { until_ms: until }));
            }
            let val = GrantVal {
                session_id,
                owner_id: s.val.owner_id.clone(),
                acquired_at_ms: now,
                expires_at_ms: now + ttl_ms,
                nonce: dlock_rt::rand::uuid_v4(),
            };
            let conds = vec![Cond::of(s), Cond::Absent(gkey.clone()), Cond::of_opt(rec.as_ref(), kkey.clone())];
            let ops = vec![
                // First op: its revision is the token on real etcd and in the simulator alike.
                TxnOp::put(gkey.clone(), encode(&val)?, None),
                TxnOp::put(kkey.clone(), encode(&KeyVal::default())?, None),
                TxnOp::get(gkey.clone(), None),
            ];
            if let Some(resps) = self.commit(conds, ops).await? {
                let token = token_of(&resps)?;
                return Ok(Ok(GrantRow {
                    key: key.to_owned(),
                    session_id,
                    owner_id: val.owner_id,
                    fencing_token: token,
                    acquired_at_ms: val.acquired_at_ms,
                    expires_at_ms: val.expires_at_ms,
                }));
            }
        }
        Err(contended("acquire"))
    }

    async fn renew(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
    ) -> Result<Result<GrantRow, RenewRefusal>, StoreError> {
        for _ in 0..CAS_ATTEMPTS_MAX {
            let now = self.now();
            let mut r =
                self.read(vec![Read::Key(self.session_key(session_id)), Read::Key(self.grant_key(key))]).await?;
            let grant = r.pop().and_then(|mut e| e.pop()).map(Entry::decode::<GrantVal>).transpose()?;
            let session = r.pop().and_then(|mut e| e.pop()).map(Entry::decode::<SessionVal>).transpose()?;
            let s = match session_check(session.as_ref(), now) {
                Ok(s) => s,
                Err(refusal) => return Ok(Err(RenewRefusal::Session(refusal))),
            };
            let Some(g) = grant else { return Ok(Err(RenewRefusal::Lost { stored_token: None })) };
            // The session is live, so the grant is live iff its own lease is.
            if g.create_rev != token || g.val.session_id != session_id || now >= g.val.expires_at_ms {
                return Ok(Err(RenewRefusal::Lost { stored_token: Some(g.create_rev) }));
            }
            let val = GrantVal { expires_at_ms: now + ttl_ms, ..g.val.clone() };
            let ops = vec![TxnOp::put(g.key.clone(), encode(&val)?, None)];
            if self.commit(vec![Cond::of(s), Cond::of(&g)], ops).await?.is_some() {
                return Ok(Ok(grant_row(key, &Rec { val, ..g })));
            }
        }
        Err(contended("renew"))
    }

    async fn release(&self, key: &str, token: i64) -> Result<Result<(), Option<i64>>, StoreError> {
        for _ in 0..CAS_ATTEMPTS_MAX {
            let now = self.now();
            let Some(g) = self.read_one::<GrantVal>(self.grant_key(key)).await? else { return Ok(Err(None)) };
            if g.create_rev != token {
                return Ok(Err(Some(g.create_rev)));
            }
            let holder = self.holder(&g.val, None).await?;
            if !live(&g.val, holder.as_ref(), now) {
                return Ok(Err(Some(g.create_rev)));
            }
            if self.commit(vec![Cond::of(&g)], vec![TxnOp::delete(g.key.clone(), None)]).await?.is_some() {
                return Ok(Ok(()));
            }
        }
        Err(contended("release"))
    }

    async fn info(&self, key: &str) -> Result<Option<KeyInfo>, StoreError> {
        let now = self.now();
        let mut r = self.read(vec![Read::Key(self.key_key(key)), Read::Key(self.grant_key(key))]).await?;
        let grant = r.pop().and_then(|mut e| e.pop()).map(Entry::decode::<GrantVal>).transpose()?;
        let seen = r.pop().is_some_and(|e| !e.is_empty());
        if !seen {
            return Ok(None);
        }
        let Some(g) = grant else { return Ok(Some(KeyInfo { grant: None })) };
        let holder = self.holder(&g.val, None).await?;
        let live = live(&g.val, holder.as_ref(), now);
        Ok(Some(KeyInfo { grant: live.then(|| grant_row(key, &g)) }))
    }

    async fn revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        expected_token: Option<i64>,
        revocation_id: Uuid,
    ) -> Result<Result<Revocation, RevokeRefusal>, StoreError> {
        let rkey = self.revocation_key(revocation_id);
        for _ in 0..CAS_ATTEMPTS_MAX {
            let now = self.now();
            let Some(g) = self.read_one::<GrantVal>(self.grant_key(key)).await? else {
                return Ok(Err(RevokeRefusal::NotHeld));
            };
            let holder = self.holder(&g.val, None).await?;
            if !live(&g.val, holder.as_ref(), now) {
                return Ok(Err(RevokeRefusal::NotHeld));
            }
            if expected_token.is_some_and(|e| e != g.create_rev) {
                return Ok(Err(RevokeRefusal::Stale { current_token: g.create_rev }));
            }
            let audit = RevocationVal {
                key: key.to_owned(),
                operator: operator.to_owned(),
                reason: reason.to_owned(),
                revoked_token: g.create_rev,
                at_ms: now,
            };
            let ops = vec![
                // First op: its revision (the floor) is the txn's on both etcd and the simulator.
                TxnOp::put(rkey.clone(), encode(&audit)?, None),
                TxnOp::delete(g.key.clone(), None),
                TxnOp::get(rkey.clone(), None),
            ];
            if let Some(resps) = self.commit(vec![Cond::of(&g), Cond::Absent(rkey.clone())], ops).await? {
                let floor = token_of(&resps)?;
                return Ok(Ok(Revocation { revoked_token: g.create_rev, new_token_floor: floor, revocation_id }));
            }
        }
        Err(contended("revoke"))
    }

    async fn reap(&self, limit: i64, delay_ms: i64, retention_ms: i64) -> Result<ReapReport, StoreError> {
        let now = self.now();
        let limit = usize::try_from(limit.max(0)).unwrap_or(0);
        let mut report = ReapReport::default();
        let mut r = self.read(vec![Read::Prefix(self.sessions_prefix()), Read::Prefix(self.grants_prefix())]).await?;
        let mut grants = Self::grants_of(r.pop().unwrap_or_default())?;
        let mut sessions = BTreeMap::new();
        for e in r.pop().unwrap_or_default() {
            let rec = e.decode::<SessionVal>()?;
            let id = rec.key.strip_prefix(&self.sessions_prefix()).and_then(|raw| Uuid::parse_str(raw).ok());
            let Some(id) = id else { return Err(StoreError::Corrupt(format!("etcd: bad session key {}", rec.key))) };
            sessions.insert(id, rec);
        }
        // 1. Lapsed sessions: mark them, removing their grants (all dead with them).
        let lapsed: Vec<Uuid> = sessions
            .iter()
            .filter(|(_, s)| !s.val.expired_marked && s.val.expires_at_ms <= now)
            .map(|(id, _)| *id)
            .take(limit)
            .collect();
        let mut gone = std::collections::BTreeSet::new();
        for id in lapsed {
            let Some(s) = sessions.get(&id).cloned() else { continue };
            let mine: Vec<&Rec<GrantVal>> = grants.iter().filter(|g| g.val.session_id == id).collect();
            let marked = SessionVal { expired_marked: true, ..s.val.clone() };
            let raw = encode(&marked)?;
            let last = (Cond::of(&s), TxnOp::put(s.key.clone(), raw.clone(), None));
            let lost_at = |g: &GrantVal| Some(died_at(g, &s.val));
            if let Some(n) = self.remove_session_grants(&mine, lost_at, delay_ms, last).await? {
                report.expired_sessions += 1;
                report.released_grants += n;
                gone.extend(mine.iter().map(|g| g.key.clone()));
                let updated = Rec { key: s.key.clone(), raw, val: marked, create_rev: s.create_rev };
                sessions.insert(id, updated);
            }
        }
        grants.retain(|g| !gone.contains(&g.key));
        // 2. Grants whose own lease lapsed.
        let lapsed: Vec<&Rec<GrantVal>> = grants.iter().filter(|g| g.val.expires_at_ms <= now).take(limit).collect();
        let keys: Vec<String> = lapsed.iter().map(|g| self.lock_key_of(&g.key).to_owned()).collect();
        let records = if delay_ms > 0 { self.key_records(&keys).await? } else { BTreeMap::new() };
        for (g, key) in lapsed.into_iter().zip(keys) {
            let died = death(&g.val, sessions.get(&g.val.session_id).map(|s| &s.val));
            let (mut conds, mut ops) = (Vec::new(), Vec::new());
            self.drop_ops(g, records.get(&key), died, delay_ms, (&mut conds, &mut ops))?;
            if self.commit(conds, ops).await?.is_some() {
                report.released_grants += 1;
            }
        }
        // 3. Expired sessions past retention: forget them.
        let forgotten: Vec<&Rec<SessionVal>> = sessions
            .values()
            .filter(|s| s.val.expired_marked && s.val.expires_at_ms.saturating_add(retention_ms) <= now)
            .take(limit)
            .collect();
        for s in forgotten {
            if self.commit(vec![Cond::of(s)], vec![TxnOp::delete(s.key.clone(), None)]).await?.is_some() {
                report.forgotten_sessions += 1;
            }
        }
        Ok(report)
    }
}
