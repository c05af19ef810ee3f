//! The lock server (C3 §3.3): sessions, leases and fencing tokens.
//!
//! A worker opens a session (L1) and keeps it alive with heartbeats (L2). It acquires a key
//! (L4) and receives a grant with a fencing token, strictly greater than every token issued
//! before; it renews (L5) and releases (L6) that grant by `(key, token)`. An operator can
//! revoke a grant (L8), which also raises the token floor so the evicted holder is fenced out
//! at the resource, not merely forgotten here.
//!
//! The store decides everything that must be atomic (see [`store`]); this crate's service
//! layer adds what is per-replica and advisory: the fair FIFO waiter queue for `waitMillis`,
//! the reaper, metrics and logs. A replica never answers a guess: when the backend cannot
//! decide, the answer is `503 NOT_LEADER`.

pub mod app;
pub mod service;
pub mod store;
pub mod store_etcd;
pub mod store_fault;
pub mod store_mem;
#[cfg(not(madsim))]
pub mod store_sql;
