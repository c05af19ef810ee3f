//! The P1 keyset cursor (design §5).
//!
//! `cursor = b64url(payload) "." b64url(HMAC-SHA256(key, "dlock/p1-cursor/v1\0" ‖ payload))`,
//! where `payload = {"v":1,"st":"PENDING","acct":null|"…","snap":ms,"ca":ms,"id":"<uuid>"}`
//! and `b64url` is unpadded URL-safe base64. The cursor carries the last row's keyset
//! (`created_at`, `payout_id`), the filter it was issued for and the first page's snapshot
//! instant. The MAC makes it tamper-evident and binds it to this deployment's key; the
//! payload is readable, which is fine: it holds nothing the caller did not already see.
//! `limit` is deliberately not bound.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use dlock_contract::payment::CURSOR_CHARS_MAX;
use dlock_contract::payout::PayoutState;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use uuid::Uuid;

/// Domain separation: this key signs nothing else, but a MAC over a tagged message cannot be
/// replayed as one over another format.
const MAC_CONTEXT: &[u8] = b"dlock/p1-cursor/v1\0";
/// The payload format this code writes and reads.
const VERSION: u32 = 1;

type HmacSha256 = Hmac<Sha256>;

/// The deployment's cursor key (`paydb_secrets.name = 'p1-cursor'`). `Debug` never shows it.
#[derive(Clone)]
pub struct CursorKey([u8; 32]);

/// What a cursor says: the filter it was issued for, the snapshot bound and the keyset of
/// the last row returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorPayload {
    pub state: PayoutState,
    pub account_id: Option<String>,
    /// The first page's wall clock, in ms since the epoch: rows created later never appear.
    pub snapshot_ms: i64,
    /// `created_at` of the last row returned, in ms since the epoch.
    pub created_at_ms: i64,
    /// `payout_id` of the last row returned.
    pub payout_id: Uuid,
}

/// Why a cursor was refused. Both answer 400 `VALIDATION_FAILED` naming the field `cursor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CursorError {
    /// Too long, not base64, a bad MAC (tampered, or another deployment's), not JSON, or an
    /// unknown version.
    #[error("is not a cursor this service issued")]
    NotIssuedHere,
    /// Authentic, but issued for another `state` or `accountId`.
    #[error("was issued for another filter")]
    OtherFilter,
}

impl CursorError {
    /// The `problem` text of the `cursor` field error. It never echoes the cursor.
    pub fn problem(&self) -> &'static str {
        match self {
            CursorError::NotIssuedHere => "is not a cursor this service issued",
            CursorError::OtherFilter => "was issued for another filter",
        }
    }
}

#[derive(Serialize)]
struct WireOut<'a> {
    v: u32,
    st: PayoutState,
    acct: Option<&'a str>,
    snap: i64,
    ca: i64,
    id: Uuid,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireIn {
    v: u32,
    st: PayoutState,
    acct: Option<String>,
    snap: i64,
    ca: i64,
    id: Uuid,
}

impl fmt::Debug for CursorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CursorKey(<redacted>)")
    }
}

impl CursorKey {
    pub fn new(bytes: [u8; 32]) -> CursorKey {
        CursorKey(bytes)
    }

    /// The key the event stream's cursors are signed with (C3-extensions E-20): this key
    /// under another domain-separation tag (`dlock_http::stream`), so neither cursor can
    /// pass for the other.
    pub fn event_key(&self) -> [u8; 32] {
        self.0
    }

    /// A MAC already fed with the domain-separation tag.
    fn mac(&self) -> HmacSha256 {
        let mut mac = match HmacSha256::new_from_slice(&self.0) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC accepts a key of any length"),
        };
        mac.update(MAC_CONTEXT);
        mac
    }

    /// Signs raw payload bytes into the wire form.
    fn sign(&self, payload: &[u8]) -> String {
        let mut mac = self.mac();
        mac.update(payload);
        let tag = mac.finalize().into_bytes();
        format!("{}.{}", URL_SAFE_NO_PAD.encode(payload), URL_SAFE_NO_PAD.encode(tag))
    }

    /// The cursor for the page after the row `p` names.
    pub fn encode(&self, p: &CursorPayload) -> String {
        let wire = WireOut {
            v: VERSION,
            st: p.state,
            acct: p.account_id.as_deref(),
            snap: p.snapshot_ms,
            ca: p.created_at_ms,
            id: p.payout_id,
        };
        // Cannot fail: a struct of strings, integers and a uuid. Were it ever to, the empty
        // payload would decode as `NotIssuedHere`, a 400, not a panic.
        let payload = serde_json::to_vec(&wire).unwrap_or_default();
        self.sign(&payload)
    }

    /// Checks a cursor presented with the filter (`state`, `account_id`) of this request.
    /// Authenticity is checked before anything in the payload is believed, in constant time.
    pub fn decode(
        &self,
        raw: &str,
        state: PayoutState,
        account_id: Option<&str>,
    ) -> Result<CursorPayload, CursorError> {
        // Bytes, not chars: anything non-ASCII is refused below anyway.
        if raw.len() > CURSOR_CHARS_MAX {
            return Err(CursorError::NotIssuedHere);
        }
        let (payload_b64, tag_b64) = raw.split_once('.').ok_or(CursorError::NotIssuedHere)?;
        let payload = URL_SAFE_NO_PAD.decode(payload_b64).map_err(|_| CursorError::NotIssuedHere)?;
        let tag = URL_SAFE_NO_PAD.decode(tag_b64).map_err(|_| CursorError::NotIssuedHere)?;
        let mut mac = self.mac();
        mac.update(&payload);
        mac.verify_slice(&tag).map_err(|_| CursorError::NotIssuedHere)?;
        let wire: WireIn = serde_json::from_slice(&payload).map_err(|_| CursorError::NotIssuedHere)?;
        if wire.v != VERSION {
            return Err(CursorError::NotIssuedHere);
        }
        if wire.st != state || wire.acct.as_deref() != account_id {
            return Err(CursorError::OtherFilter);
        }
        Ok(CursorPayload {
            state: wire.st,
            account_id: wire.acct,
            snapshot_ms: wire.snap,
            created_at_ms: wire.ca,
            payout_id: wire.id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_contract::rail::ACCOUNT_ID_CHARS_MAX;

    fn key() -> CursorKey {
        CursorKey::new([7; 32])
    }

    fn id() -> Uuid {
        Uuid::parse_str("4b6f1b5e-8d0a-4a39-9f5e-2f1d1a0c9e11").expect("uuid")
    }

    fn payload(account_id: Option<&str>) -> CursorPayload {
        CursorPayload {
            state: PayoutState::Pending,
            account_id: account_id.map(str::to_owned),
            snapshot_ms: 1_764_500_730_123,
            created_at_ms: 1_764_500_700_001,
            payout_id: id(),
        }
    }

    fn payload_json(raw: &str) -> String {
        let (p, _) = raw.split_once('.').expect("dot");
        String::from_utf8(URL_SAFE_NO_PAD.decode(p).expect("b64")).expect("utf8")
    }

    #[test]
    fn cursor_round_trips_with_and_without_an_account() {
        for acct in [None, Some("acct:1")] {
            let p = payload(acct);
            let raw = key().encode(&p);
            assert_eq!(key().decode(&raw, PayoutState::Pending, acct), Ok(p));
            assert!(raw.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')), "{raw}");
        }
    }

    #[test]
    fn cursor_payload_has_the_documented_layout() {
        let raw = key().encode(&payload(None));
        assert_eq!(
            payload_json(&raw),
            r#"{"v":1,"st":"PENDING","acct":null,"snap":1764500730123,"ca":1764500700001,"id":"4b6f1b5e-8d0a-4a39-9f5e-2f1d1a0c9e11"}"#
        );
        let raw = key().encode(&payload(Some("acct:1")));
        assert!(payload_json(&raw).contains(r#""acct":"acct:1""#));
    }

    #[test]
    fn the_mac_covers_the_context_tag_and_the_payload() {
        let raw = key().encode(&payload(None));
        let (p, t) = raw.split_once('.').expect("dot");
        let mut mac = HmacSha256::new_from_slice(&[7; 32]).expect("key");
        mac.update(b"dlock/p1-cursor/v1\0");
        mac.update(&URL_SAFE_NO_PAD.decode(p).expect("b64"));
        assert_eq!(URL_SAFE_NO_PAD.decode(t).expect("b64"), mac.finalize().into_bytes().to_vec());
    }

    #[test]
    fn the_longest_possible_cursor_fits_the_limit() {
        let p = CursorPayload {
            state: PayoutState::RailAmbiguous,
            account_id: Some("a".repeat(ACCOUNT_ID_CHARS_MAX)),
            snapshot_ms: i64::MIN,
            created_at_ms: i64::MIN,
            payout_id: id(),
        };
        let raw = key().encode(&p);
        assert!(raw.len() <= CURSOR_CHARS_MAX, "{}", raw.len());
        assert_eq!(key().decode(&raw, PayoutState::RailAmbiguous, p.account_id.as_deref()), Ok(p));
    }

    #[test]
    fn a_tampered_payload_is_refused() {
        let raw = key().encode(&payload(None));
        let (_, tag) = raw.split_once('.').expect("dot");
        // The same MAC over a payload that moves the keyset back to the beginning.
        let forged = payload_json(&raw).replace("1764500700001", "0000000000001");
        let tampered = format!("{}.{tag}", URL_SAFE_NO_PAD.encode(forged.as_bytes()));
        assert_eq!(key().decode(&tampered, PayoutState::Pending, None), Err(CursorError::NotIssuedHere));
        // A flipped character in the encoded payload.
        let mut bytes = raw.into_bytes();
        bytes[3] = if bytes[3] == b'A' { b'B' } else { b'A' };
        let flipped = String::from_utf8(bytes).expect("ascii");
        assert_eq!(key().decode(&flipped, PayoutState::Pending, None), Err(CursorError::NotIssuedHere));
    }

    #[test]
    fn a_tampered_mac_is_refused() {
        let raw = key().encode(&payload(None));
        let (p, tag) = raw.split_once('.').expect("dot");
        let mut tag = URL_SAFE_NO_PAD.decode(tag).expect("b64");
        tag[0] ^= 1;
        let flipped = format!("{p}.{}", URL_SAFE_NO_PAD.encode(&tag));
        assert_eq!(key().decode(&flipped, PayoutState::Pending, None), Err(CursorError::NotIssuedHere));
        let truncated = format!("{p}.{}", URL_SAFE_NO_PAD.encode(&tag[..16]));
        assert_eq!(key().decode(&truncated, PayoutState::Pending, None), Err(CursorError::NotIssuedHere));
        let missing = format!("{p}.");
        assert_eq!(key().decode(&missing, PayoutState::Pending, None), Err(CursorError::NotIssuedHere));
    }

    #[test]
    fn another_deployments_cursor_is_refused() {
        let raw = CursorKey::new([8; 32]).encode(&payload(None));
        assert_eq!(key().decode(&raw, PayoutState::Pending, None), Err(CursorError::NotIssuedHere));
    }

    #[test]
    fn a_cursor_for_another_state_or_account_is_refused() {
        let k = key();
        let unfiltered = k.encode(&payload(None));
        assert_eq!(k.decode(&unfiltered, PayoutState::Claimed, None), Err(CursorError::OtherFilter));
        assert_eq!(k.decode(&unfiltered, PayoutState::Pending, Some("acct:1")), Err(CursorError::OtherFilter));
        let filtered = k.encode(&payload(Some("acct:1")));
        assert_eq!(k.decode(&filtered, PayoutState::Pending, None), Err(CursorError::OtherFilter));
        assert_eq!(k.decode(&filtered, PayoutState::Pending, Some("acct:2")), Err(CursorError::OtherFilter));
        assert_eq!(k.decode(&filtered, PayoutState::Posted, Some("acct:1")), Err(CursorError::OtherFilter));
    }

    #[test]
    fn an_authentic_cursor_of_another_version_or_shape_is_refused() {
        let k = key();
        for payload in [
            r#"{"v":2,"st":"PENDING","acct":null,"snap":1,"ca":1,"id":"4b6f1b5e-8d0a-4a39-9f5e-2f1d1a0c9e11"}"#,
            r#"{"v":1,"st":"PENDING","acct":null,"snap":1,"ca":1,"id":"4b6f1b5e-8d0a-4a39-9f5e-2f1d1a0c9e11","x":0}"#,
            r#"{"v":1,"st":"NOPE","acct":null,"snap":1,"ca":1,"id":"4b6f1b5e-8d0a-4a39-9f5e-2f1d1a0c9e11"}"#,
            r#"{"v":1,"st":"PENDING","acct":null,"snap":1,"ca":1}"#,
            r#"[1,2,3]"#,
            "not json",
            "",
        ] {
            let raw = k.sign(payload.as_bytes());
            assert_eq!(k.decode(&raw, PayoutState::Pending, None), Err(CursorError::NotIssuedHere), "{payload}");
        }
    }

    #[test]
    fn a_cursor_over_the_length_limit_is_refused_before_anything_else() {
        let raw = key().encode(&payload(None));
        let padded = format!("{raw}{}", "A".repeat(CURSOR_CHARS_MAX + 1 - raw.len()));
        assert_eq!(padded.len(), CURSOR_CHARS_MAX + 1);
        assert_eq!(key().decode(&padded, PayoutState::Pending, None), Err(CursorError::NotIssuedHere));
        let huge = "A".repeat(1 << 20);
        assert_eq!(key().decode(&huge, PayoutState::Pending, None), Err(CursorError::NotIssuedHere));
    }

    #[test]
    fn garbage_is_refused() {
        let raw = key().encode(&payload(None));
        let (p, t) = raw.split_once('.').expect("dot");
        for garbage in [
            String::new(),
            ".".into(),
            "abc".into(),
            "a.b.c".into(),
            "!!!.???".into(),
            "é.é".into(),
            p.to_owned(),
            format!("{p}=.{t}"),
            format!("{p}.{t}="),
            format!("{p}.{t}.{t}"),
            format!("{t}.{p}"),
            format!("{p} .{t}"),
            raw.replace('-', "+").replace('_', "/") + "+/",
        ] {
            assert_eq!(
                key().decode(&garbage, PayoutState::Pending, None),
                Err(CursorError::NotIssuedHere),
                "{garbage}"
            );
        }
    }

    #[test]
    fn problems_have_the_documented_wording() {
        assert_eq!(CursorError::NotIssuedHere.problem(), "is not a cursor this service issued");
        assert_eq!(CursorError::OtherFilter.problem(), "was issued for another filter");
        assert_eq!(CursorError::OtherFilter.to_string(), CursorError::OtherFilter.problem());
    }

    #[test]
    fn the_key_never_appears_in_debug_output() {
        assert_eq!(format!("{:?}", key()), "CursorKey(<redacted>)");
    }
}
