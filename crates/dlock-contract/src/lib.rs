//! The wire contract of dlock (C3, `docs/contracts/`), shared by every service and client.
//!
//! Invariants this crate owns:
//! - Every error code has exactly one HTTP status and one `retrySafe` verdict, both taken
//!   from the C3 §3.2 table and written down once, in [`ErrorCode::spec`].
//! - A fencing token is a decimal int64 strictly greater than zero, spelled canonically
//!   (`[1-9][0-9]*`). Anything else is rejected, never coerced (a coerced `0` would compare
//!   below every stored fence and look like a harmless no-op).
//! - Every non-2xx body on the wire is an [`ErrorEnvelope`].

pub mod auth;
pub mod batch;
pub mod currency;
pub mod defence;
pub mod error;
pub mod fenced;
pub mod grant;
pub mod headers;
pub mod lock;
pub mod payment;
pub mod payout;
pub mod planted;
pub mod rail;
pub mod resolution;
pub mod store;
pub mod stream;
pub mod time;

pub use error::{ErrorCode, ErrorEnvelope, ErrorSpec, FieldError};
pub use headers::{FencingToken, IdempotencyKey, OwnerId};

/// `Content-Type` of every request and response body, errors included (C3 §3.1).
pub const CONTENT_TYPE_JSON: &str = "application/json; charset=utf-8";
/// Header carrying the fencing token of a protected write (C3 §3.1, FR-15).
pub const HEADER_FENCING_TOKEN: &str = "x-fencing-token";
/// Header carrying the opaque worker identity (C3 §3.1, FR-30).
pub const HEADER_OWNER_ID: &str = "x-owner-id";
/// Header carrying the caller's credential, `Bearer <token>` (C3-extensions E-13).
pub const HEADER_AUTHORIZATION: &str = "authorization";
/// Header carrying the payout's stable idempotency key (C3 §3.1).
pub const HEADER_IDEMPOTENCY_KEY: &str = "x-idempotency-key";
/// Header carrying the lock server's signature of the grant whose token is in
/// `X-Fencing-Token` (C3-extensions E-14, [`grant`]).
pub const HEADER_FENCING_SIGNATURE: &str = "x-fencing-signature";
