//! Bodies of the lock-server surface (C3 §3.3, L1–L8) and their bounds.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Shortest session TTL granted (C3 L1); shorter requests are clamped up.
pub const SESSION_TTL_MS_MIN: i64 = 1_000;
/// Longest session TTL granted (C3 L1); longer requests are clamped down.
pub const SESSION_TTL_MS_MAX: i64 = 60_000;
/// Longest lock lease granted per acquire or renew.
pub const LOCK_TTL_MS_MAX: i64 = 60_000;
/// Shortest lock lease granted per acquire or renew.
pub const LOCK_TTL_MS_MIN: i64 = 1_000;
/// Longest server-side wait an acquire may ask for (C3 L4 `waitMillis`).
pub const WAIT_MS_MAX: i64 = 30_000;
/// Longest lock key (C3 L4).
pub const LOCK_KEY_CHARS_MAX: usize = 128;
/// Shortest revoke reason (C3 L8).
pub const REVOKE_REASON_CHARS_MIN: usize = 8;
/// Longest revoke reason and operator name.
pub const REVOKE_TEXT_CHARS_MAX: usize = 512;
/// Keys one page of `GET /v1/locks` answers when the query names no `limit`
/// (C3-extensions E-23).
pub const LOCK_LIST_ITEMS_DEFAULT: usize = 100;
/// Largest `limit` of `GET /v1/locks` (C3-extensions E-23).
pub const LOCK_LIST_ITEMS_MAX: usize = 500;
const _: () = assert!(1 <= LOCK_LIST_ITEMS_DEFAULT && LOCK_LIST_ITEMS_DEFAULT <= LOCK_LIST_ITEMS_MAX);

/// Whether `key` is 1 to 128 characters of `[a-zA-Z0-9:._-]` (C3 L4).
pub fn is_lock_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= LOCK_KEY_CHARS_MAX
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'.' | b'_' | b'-'))
}

/// Clamps a requested session TTL into `[SESSION_TTL_MS_MIN, SESSION_TTL_MS_MAX]`.
pub fn clamp_session_ttl_ms(requested: i64) -> i64 {
    requested.clamp(SESSION_TTL_MS_MIN, SESSION_TTL_MS_MAX)
}

/// `201` body of `POST /v1/sessions` (L1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionOpened {
    pub session_id: Uuid,
    pub owner_id: String,
    pub ttl_millis: i64,
    #[serde(with = "crate::time::ms")]
    pub expires_at: DateTime<Utc>,
}

/// `200` body of `POST /v1/sessions/{id}/heartbeat` (L2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatAck {
    pub session_id: Uuid,
    #[serde(with = "crate::time::ms")]
    pub expires_at: DateTime<Utc>,
    #[serde(with = "crate::time::ms")]
    pub server_time: DateTime<Utc>,
    pub held_lock_count: i64,
}

/// `200` body of acquire and renew (L4, L5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockGrant {
    pub key: String,
    pub owner_id: String,
    pub session_id: Uuid,
    pub fencing_token: i64,
    #[serde(with = "crate::time::ms")]
    pub acquired_at: DateTime<Utc>,
    #[serde(with = "crate::time::ms")]
    pub expires_at: DateTime<Utc>,
    /// The lock server's signature of (key, token, owner), the `X-Fencing-Signature` value
    /// to send with the token (C3-extensions E-14). Additive: absent from an unsigned server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_signature: Option<String>,
}

/// `200` body of `GET /v1/locks/{key}` (L7). Advisory: never decide "safe to act" from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockInfo {
    pub key: String,
    pub held: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "crate::time::ms_opt")]
    pub acquired_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "crate::time::ms_opt")]
    pub expires_at: Option<DateTime<Utc>>,
    pub waiter_count: i64,
    /// How long the live grant has left, judged by the lock server on its own clock (lockdb's
    /// on SQL, the answering replica's on etcd), not `expiresAt` minus the reader's clock
    /// (C3-extensions E-22). Present iff `held`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_remaining_ms: Option<i64>,
    /// How long a lock-delay on the key still runs, judged the same way (absent: none runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_delay_remaining_ms: Option<i64>,
    /// Every token granted after this read exceeds it (tokens are deployment-wide, so the
    /// floor is too): the highest token issued, or reserved by a revoke.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_floor: Option<i64>,
}

/// `200` body of `GET /v1/locks` (C3-extensions E-23): one page of the keys with a stored
/// grant, in key order, each exactly as L7 answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockList {
    pub items: Vec<LockInfo>,
    /// The `after` of the next page: absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `200` body of `POST /v1/locks/{key}/revoke` (L8), the `LockOutcome` record of C2 §2.3.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockOutcome {
    pub revoked_token: i64,
    pub new_token_floor: i64,
    pub revocation_id: Uuid,
}

/// `POST /v1/sessions` body (L1). The body is optional: the owner may come from `X-Owner-Id`
/// alone. Documents the wire shape; the server validates field by field.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpenSessionRequest {
    /// Must equal `X-Owner-Id` when both are given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[!-~]{1,64}$", example = "worker-1")]
    pub owner_id: Option<String>,
    /// Requested session TTL; clamped into `[SESSION_TTL_MS_MIN, SESSION_TTL_MS_MAX]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, example = 10_000)]
    pub ttl_millis: Option<i64>,
}

/// `POST /v1/locks/{key}/acquire` body (L4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AcquireRequest {
    pub session_id: Uuid,
    /// Requested lease; clamped into `[LOCK_TTL_MS_MIN, LOCK_TTL_MS_MAX]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, example = 15_000)]
    pub ttl_millis: Option<i64>,
    /// How long the server may hold the request while the key is held (0: answer at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 30_000, example = 0)]
    pub wait_millis: Option<i64>,
}

/// `POST /v1/locks/{key}/renew` body (L5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RenewRequest {
    pub session_id: Uuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, example = 15_000)]
    pub ttl_millis: Option<i64>,
}

/// `DELETE /v1/locks/{key}` body (L6), when `sessionId` is not in the query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseRequest {
    pub session_id: Uuid,
}

/// `POST /v1/locks/{key}/revoke` body (L8).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevokeRequest {
    #[schema(min_length = 1, max_length = 512, example = "alice")]
    pub operator: String,
    #[schema(min_length = 8, max_length = 512, example = "worker wedged on payout 4b6f1b5e")]
    pub reason: String,
    /// Revoke only if this is still the current grant's token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, example = 42)]
    pub expected_token: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_follow_c3_l4() {
        assert!(is_lock_key("payout:acct-1"));
        assert!(is_lock_key("a.b_c-d:9"));
        assert!(is_lock_key(&"k".repeat(128)));
        for bad in ["", "has space", "slash/no", "ü", &"k".repeat(129)] {
            assert!(!is_lock_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn session_ttl_is_clamped_into_range() {
        assert_eq!(clamp_session_ttl_ms(10), 1_000);
        assert_eq!(clamp_session_ttl_ms(5_000), 5_000);
        assert_eq!(clamp_session_ttl_ms(600_000), 60_000);
    }
}
