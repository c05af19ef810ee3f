//! A typed client of the payment-resource (C3 §3.4): P1 list, P4 payout, P5 account, P2
//! claim, P3 post, the batches P2b and P3b (C3-extensions E-19), and the two creates, with
//! the executor's C3 §3.8 hop budgets inside.
//!
//! Every call takes the contract's request type (`dlock_contract::payment`) and returns the
//! contract's answer type or a [`PaymentRefusal`], which keeps apart what a caller must
//! never confuse: a C3 envelope (with its code, whose retry-safety is the *catalogue's*
//! verdict), a request that provably never left this process, a request that was sent and
//! never answered, and an answer that is not C3.
//!
//! # Invariants
//!
//! 1. **Kept-alive connections, fates kept exact** (`dlock_rt::http::HttpClient::with_keep_alive`,
//!    issue 14 cut 9): every call here is safe to ask again (reads are advisory, writes
//!    carry their idempotency key), so answered connections are reused. Only a failed
//!    connect of a *fresh* connection is [`PaymentRefusal::NothingSent`] (and may be
//!    retried); a read timeout or a broken connection, a reused one included, is
//!    [`PaymentRefusal::NoAnswer`], which a write never retries: the payout stays
//!    undecided and a later scan retries it under a new grant.
//! 2. **Writes** (claim, post, the batches, the creates) use the write budget (C3 §3.8: 500 ms / 3 s) and
//!    are re-sent at most `write_retries_max` (1) times, and only when nothing was sent or
//!    the answer is a 503 envelope whose code the catalogue calls retry-safe
//!    ([`WRITE_RETRY_CODES`]) and whose `retrySafe` agrees. Never on a 409, never on
//!    `INTERNAL`, never after a lost answer: the function that decides
//!    ([`PaymentRefusal::write_retry_pause_ms`]) answers `None` for every other refusal.
//!    A retry re-sends the identical bytes, token and idempotency key, so it replays.
//! 3. **Advisory reads** (P1, P4, P5) use the read budget (300 ms / 1 s) and are tried at
//!    most `read_tries_max` (2) times, [`READ_RETRY_PAUSE_MS`] apart, on anything but a 2xx
//!    or a 4xx. A read never decides a write; the fence does.
//! 4. **Every loop has a bound**: `1 + write_retries_max` sends per write, `read_tries_max`
//!    per read, and a server's `retryAfterMillis` is waited for at most
//!    [`WRITE_RETRY_AFTER_MS_MAX`]. Out-of-range settings are refused by
//!    [`PaymentClient::new`], never clamped.
//! 5. **Time and sockets come from `dlock_rt`**, so the client runs unchanged in the madsim
//!    simulation.

mod client;
pub mod config;
pub mod refusal;

pub use client::{ListQuery, PaymentClient};
pub use config::{PaymentClientConfig, READ_RETRY_PAUSE_MS, WRITE_RETRY_AFTER_MS_MAX, WRITE_RETRY_CODES};
pub use refusal::{Operation, PaymentRefusal};
