//! Signed grants (issue 12, C3-extensions E-14): the lock server signs every grant it
//! issues (lock key, fencing token, owner) with an Ed25519 key, and the fenced resources
//! (payment-resource claim and post, rail-proxy submission) verify that signature, with
//! only the public key, before they compare tokens.
//!
//! Pure and shared: the lock server ([`GrantSigner`]) and the resources ([`GrantVerifier`])
//! both use this module, so neither depends on the other.
//!
//! - Signed message: `dlock-grant/1\n<lock key>\n<token decimal>\n<owner id>` ([`message`]).
//! - Header `X-Fencing-Signature` ([`crate::HEADER_FENCING_SIGNATURE`]), next to
//!   `X-Fencing-Token` (which is unchanged): `v1.<key id>.<signature>`, where the key id is
//!   the first 8 bytes of SHA-256 of the 32-byte public key in lowercase hex (16
//!   characters) and the signature is the 64-byte Ed25519 signature in base64url without
//!   padding (86 characters). At most [`SIGNATURE_HEADER_CHARS_MAX`] characters.
//! - Keys: a signing key file holds the 32-byte seed, one line, base64 (standard alphabet)
//!   or 64 hex characters ([`parse_seed`]); a public key is 32 bytes in base64
//!   ([`VerifyKey::parse`]).
//!
//! ## Invariants
//! - **A refusal writes nothing.** [`GrantVerifier::verify`] is pure; a caller that gets an
//!   error answers 400 `INVALID_TOKEN` before it asks its store for anything that writes.
//! - **Verification happens before fence comparison**: the resources call it before the
//!   store transaction that compares the token to the fence.
//! - **The key id never selects an untrusted key**: it is looked up among the configured
//!   public keys only; an id that names none of them is refused, whatever the signature.
//! - The lock key a resource verifies against is the one that protects the row as stored
//!   (`payout:{accountId}` of the stored payout), never one the caller names.
//! - An absent owner cannot match a signed owner: a request without `X-Owner-Id` is refused.
//! - A missing signature is accepted only when `accept_unsigned` is set (the transition
//!   switch, refused outside the `unsafe-test` profile); a present but malformed or wrong
//!   signature is refused even then.

use base64::Engine;
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use sha2::Digest;

/// Domain separation: the first line of every signed message.
pub const MESSAGE_DOMAIN: &str = "dlock-grant/1";
/// Version prefix of the header value.
pub const HEADER_VERSION: &str = "v1";
/// Length of a key id (hex characters).
pub const KEY_ID_HEX_CHARS: usize = 16;
/// Length of a signature in base64url without padding.
pub const SIGNATURE_B64_CHARS: usize = 86;
/// Longest accepted `X-Fencing-Signature` value (the exact form is 106 characters).
pub const SIGNATURE_HEADER_CHARS_MAX: usize = 128;
/// Most public keys a resource accepts at once (rotation needs two).
pub const VERIFY_KEYS_MAX: usize = 16;
/// Longest accepted signing-key or verify-key file, in bytes.
pub const KEY_FILE_BYTES_MAX: usize = 4_096;

/// Why a grant signature was refused (every variant answers 400 `INVALID_TOKEN`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error("X-Fencing-Signature is missing: the lock server signs every grant")]
    Missing,
    #[error("X-Fencing-Signature is malformed (expected v1.<16 hex key id>.<86 base64url characters>)")]
    Malformed,
    #[error("X-Fencing-Signature names a key this resource does not trust")]
    UnknownKey,
    #[error("X-Fencing-Signature does not sign this lock key, token and owner")]
    BadSignature,
    #[error("X-Owner-Id is missing: a signed grant names its owner")]
    NoOwner,
}

/// The exact bytes a grant signature covers.
pub fn message(lock_key: &str, token: i64, owner_id: &str) -> Vec<u8> {
    format!("{MESSAGE_DOMAIN}\n{lock_key}\n{token}\n{owner_id}").into_bytes()
}

/// The lock key that protects every payout of `account_id` (the executor's lock).
pub fn payout_lock_key(account_id: &str) -> String {
    format!("payout:{account_id}")
}

/// A key id: the first 8 bytes of SHA-256 of the public key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId([u8; 8]);

impl KeyId {
    pub fn of(public: &[u8; 32]) -> KeyId {
        let digest = sha2::Sha256::digest(public);
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        KeyId(id)
    }
}

impl std::fmt::Display for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// A parsed `X-Fencing-Signature` value (syntax only; [`GrantVerifier`] judges it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantSignature {
    pub key_id: KeyId,
    pub signature: [u8; 64],
}

impl GrantSignature {
    /// Parses a header value: `v1.<16 lowercase hex>.<86 base64url, no padding>`.
    pub fn parse(raw: &str) -> Result<GrantSignature, GrantError> {
        if raw.is_empty() {
            return Err(GrantError::Missing);
        }
        if raw.len() > SIGNATURE_HEADER_CHARS_MAX || !raw.is_ascii() {
            return Err(GrantError::Malformed);
        }
        let mut parts = raw.split('.');
        let (Some(version), Some(id), Some(sig), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(GrantError::Malformed);
        };
        if version != HEADER_VERSION
            || id.len() != KEY_ID_HEX_CHARS
            || !id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            || sig.len() != SIGNATURE_B64_CHARS
        {
            return Err(GrantError::Malformed);
        }
        let mut key_id = [0u8; 8];
        hex::decode_to_slice(id, &mut key_id).map_err(|_| GrantError::Malformed)?;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(sig).map_err(|_| GrantError::Malformed)?;
        let signature: [u8; 64] = bytes.try_into().map_err(|_| GrantError::Malformed)?;
        Ok(GrantSignature { key_id: KeyId(key_id), signature })
    }
}

impl std::fmt::Display for GrantSignature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.signature);
        write!(f, "{HEADER_VERSION}.{}.{sig}", self.key_id)
    }
}

/// The lock server's one signing key.
#[derive(Clone)]
pub struct GrantSigner {
    key: SigningKey,
    id: KeyId,
}

impl std::fmt::Debug for GrantSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the seed.
        f.debug_struct("GrantSigner").field("key_id", &self.id.to_string()).finish_non_exhaustive()
    }
}

impl GrantSigner {
    pub fn from_seed(seed: &[u8; 32]) -> GrantSigner {
        let key = SigningKey::from_bytes(seed);
        let id = KeyId::of(key.verifying_key().as_bytes());
        GrantSigner { key, id }
    }

    /// A secret of this deployment derived from the signing seed for another use, named by
    /// `context` (SHA-256 of the context and the seed): the event stream's cursor key
    /// (C3-extensions E-20). Neither the seed nor a signature can be had from it.
    pub fn derived_secret(&self, context: &[u8]) -> [u8; 32] {
        use sha2::Digest as _;
        let mut h = sha2::Sha256::new();
        h.update(context);
        h.update(self.key.to_bytes());
        h.finalize().into()
    }

    pub fn key_id(&self) -> KeyId {
        self.id
    }

    /// The public key, to configure the resources with.
    pub fn verify_key(&self) -> VerifyKey {
        VerifyKey { key: self.key.verifying_key(), id: self.id }
    }

    /// The `X-Fencing-Signature` value of a grant.
    pub fn sign(&self, lock_key: &str, token: i64, owner_id: &str) -> String {
        let signature = self.key.sign(&message(lock_key, token, owner_id)).to_bytes();
        GrantSignature { key_id: self.id, signature }.to_string()
    }
}

/// A trusted public key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyKey {
    key: VerifyingKey,
    id: KeyId,
}

impl VerifyKey {
    /// A public key: 32 bytes in base64 (standard alphabet, padding optional) or 64 hex.
    pub fn parse(raw: &str) -> Result<VerifyKey, String> {
        let bytes = decode_32(raw.trim()).ok_or("a public key is 32 bytes, in base64 or hex")?;
        let key = VerifyingKey::from_bytes(&bytes).map_err(|_| "not an Ed25519 public key".to_owned())?;
        Ok(VerifyKey { id: KeyId::of(&bytes), key })
    }

    pub fn key_id(&self) -> KeyId {
        self.id
    }

    /// The key in base64 (the form [`VerifyKey::parse`] reads).
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.key.as_bytes())
    }
}

fn decode_32(text: &str) -> Option<[u8; 32]> {
    let bytes = if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        hex::decode(text).ok()?
    } else {
        let engine = base64::engine::GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            base64::engine::GeneralPurposeConfig::new()
                .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
        );
        engine.decode(text).ok()?
    };
    bytes.try_into().ok()
}

/// A signing key file's seed: one line, 32 bytes in base64 or hex.
pub fn parse_seed(text: &str) -> Result<[u8; 32], String> {
    if text.len() > KEY_FILE_BYTES_MAX {
        return Err(format!("a signing key file is at most {KEY_FILE_BYTES_MAX} bytes"));
    }
    decode_32(text.trim()).ok_or_else(|| "a signing key file holds a 32-byte Ed25519 seed, in base64 or hex".into())
}

/// The text of a signing key file for `seed` (base64, one line).
pub fn seed_text(seed: &[u8; 32]) -> String {
    format!("{}\n", base64::engine::general_purpose::STANDARD.encode(seed))
}

/// A list of public keys: separated by commas or new lines; blank entries ignored.
pub fn parse_verify_keys(text: &str) -> Result<Vec<VerifyKey>, String> {
    if text.len() > KEY_FILE_BYTES_MAX {
        return Err(format!("a verify-key list is at most {KEY_FILE_BYTES_MAX} bytes"));
    }
    let keys = text
        .split([',', '\n'])
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(VerifyKey::parse)
        .collect::<Result<Vec<_>, _>>()?;
    if keys.len() > VERIFY_KEYS_MAX {
        return Err(format!("at most {VERIFY_KEYS_MAX} verify keys"));
    }
    Ok(keys)
}

/// How a grant was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A trusted key signed exactly this lock key, token and owner.
    Signed,
    /// No signature, and the transition switch accepts that.
    Unsigned,
}

/// What a resource trusts: a set of public keys, and the transition switch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantVerifier {
    keys: Vec<VerifyKey>,
    accept_unsigned: bool,
}

impl GrantVerifier {
    pub fn new(keys: Vec<VerifyKey>, accept_unsigned: bool) -> GrantVerifier {
        GrantVerifier { keys, accept_unsigned }
    }

    /// A resource's verifier from its configured key text and transition switch
    /// (`prefix`: its key prefix, for the messages). Refuses to build one that trusts no key
    /// and refuses every grant under the production profile: a resource there always verifies.
    pub fn from_config(keys: &str, accept_unsigned: bool, production: bool, prefix: &str) -> Result<Self, String> {
        let keys = parse_verify_keys(keys).map_err(|e| format!("{prefix}.verify-keys: {e}"))?;
        if production && keys.is_empty() && !accept_unsigned {
            return Err(format!(
                "{prefix}.verify-keys (or {prefix}.verify-keys-file) names no public key: the resource cannot verify \
                 the lock server's grant signatures and will not start (give it the lock server's public key)"
            ));
        }
        Ok(GrantVerifier { keys, accept_unsigned })
    }

    pub fn keys(&self) -> &[VerifyKey] {
        &self.keys
    }

    pub fn accepts_unsigned(&self) -> bool {
        self.accept_unsigned
    }

    /// Judges one fenced write's grant: `signature` is the raw header (if present),
    /// `lock_key` the key that protects the row as stored, `owner` the request's owner.
    pub fn verify(
        &self,
        signature: Option<&str>,
        lock_key: &str,
        token: i64,
        owner: Option<&str>,
    ) -> Result<Verdict, GrantError> {
        if crate::planted::on(crate::planted::Bug::SkipGrantSignatureCheck) {
            return Ok(Verdict::Signed);
        }
        let Some(raw) = signature else {
            return if self.accept_unsigned { Ok(Verdict::Unsigned) } else { Err(GrantError::Missing) };
        };
        let parsed = GrantSignature::parse(raw)?;
        let owner = owner.ok_or(GrantError::NoOwner)?;
        // The id selects among trusted keys only.
        let key = self.keys.iter().find(|k| k.id == parsed.key_id).ok_or(GrantError::UnknownKey)?;
        let sig = ed25519_dalek::Signature::from_bytes(&parsed.signature);
        key.key.verify_strict(&message(lock_key, token, owner), &sig).map_err(|_| GrantError::BadSignature)?;
        Ok(Verdict::Signed)
    }
}

/// A fencing token as a fenced write presents it: the token, and the lock server's
/// signature of its grant (absent only for a client of an unsigned lock server, in the
/// transition). A bare [`crate::FencingToken`] converts into an unsigned one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedToken {
    pub token: crate::FencingToken,
    pub signature: Option<String>,
}

impl SignedToken {
    pub fn new(token: crate::FencingToken, signature: Option<String>) -> SignedToken {
        SignedToken { token, signature }
    }
}

impl From<crate::FencingToken> for SignedToken {
    fn from(token: crate::FencingToken) -> SignedToken {
        SignedToken { token, signature: None }
    }
}

/// A fixed test key, for test harnesses only (its seed is public: never configure it).
pub mod testing {
    use super::{GrantSigner, GrantVerifier};

    /// The test signing key's seed.
    pub const SEED: [u8; 32] = [7; 32];
    /// A second test key (rotation tests).
    pub const SEED_NEXT: [u8; 32] = [11; 32];

    pub fn signer() -> GrantSigner {
        GrantSigner::from_seed(&SEED)
    }

    /// A verifier that trusts [`signer`] only.
    pub fn verifier() -> GrantVerifier {
        GrantVerifier::new(vec![signer().verify_key()], false)
    }

    /// The signature header of a grant of `payout:{account_id}` signed by [`signer`].
    pub fn sign_payout(account_id: &str, token: i64, owner_id: &str) -> String {
        signer().sign(&super::payout_lock_key(account_id), token, owner_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verifier() -> GrantVerifier {
        testing::verifier()
    }

    #[test]
    fn a_signed_grant_verifies_and_its_header_round_trips() {
        let s = testing::signer();
        let h = s.sign("payout:acct-1", 42, "worker-1");
        assert_eq!(h.len(), 3 + KEY_ID_HEX_CHARS + 1 + SIGNATURE_B64_CHARS);
        assert!(h.len() <= SIGNATURE_HEADER_CHARS_MAX);
        assert_eq!(GrantSignature::parse(&h).map(|g| g.to_string()), Ok(h.clone()));
        assert_eq!(verifier().verify(Some(&h), "payout:acct-1", 42, Some("worker-1")), Ok(Verdict::Signed));
    }

    #[test]
    fn a_signature_for_another_token_owner_or_lock_key_is_refused() {
        let h = testing::signer().sign("payout:acct-1", 42, "worker-1");
        let v = verifier();
        assert_eq!(v.verify(Some(&h), "payout:acct-1", 43, Some("worker-1")), Err(GrantError::BadSignature));
        assert_eq!(v.verify(Some(&h), "payout:acct-1", i64::MAX, Some("worker-1")), Err(GrantError::BadSignature));
        assert_eq!(v.verify(Some(&h), "payout:acct-1", 42, Some("worker-2")), Err(GrantError::BadSignature));
        assert_eq!(v.verify(Some(&h), "payout:acct-2", 42, Some("worker-1")), Err(GrantError::BadSignature));
        assert_eq!(v.verify(Some(&h), "payout:acct-1", 42, None), Err(GrantError::NoOwner));
    }

    #[test]
    fn a_signature_from_an_untrusted_key_is_refused_even_with_a_forged_key_id() {
        let other = GrantSigner::from_seed(&[9; 32]);
        let h = other.sign("payout:acct-1", 42, "worker-1");
        assert_eq!(verifier().verify(Some(&h), "payout:acct-1", 42, Some("worker-1")), Err(GrantError::UnknownKey));
        // The untrusted key's signature under the trusted key's id: the id selects the
        // trusted key, which refuses the signature.
        let mut forged = GrantSignature::parse(&h).expect("parses");
        forged.key_id = testing::signer().key_id();
        assert_eq!(
            verifier().verify(Some(&forged.to_string()), "payout:acct-1", 42, Some("worker-1")),
            Err(GrantError::BadSignature)
        );
    }

    #[test]
    fn truncated_non_base64_and_oversized_headers_are_malformed() {
        let h = testing::signer().sign("payout:acct-1", 42, "worker-1");
        let v = verifier();
        let bad = [
            h[..h.len() - 1].to_owned(),
            format!("{h}A"),
            h.replacen("v1.", "v2.", 1),
            h.replace('.', ","),
            format!("{}.{}", &h[..20], "!".repeat(SIGNATURE_B64_CHARS)),
            format!("{}{}", &h[..3], "G".repeat(KEY_ID_HEX_CHARS)) + &h[19..],
            "v1".to_owned(),
            "v1..".to_owned(),
            format!("{h}.x"),
            "x".repeat(SIGNATURE_HEADER_CHARS_MAX + 1),
            format!("{}{}", h, "=".repeat(2)),
            h.to_uppercase(),
        ];
        for raw in &bad {
            assert_eq!(v.verify(Some(raw), "payout:acct-1", 42, Some("worker-1")), Err(GrantError::Malformed), "{raw}");
        }
        assert_eq!(v.verify(Some(""), "payout:acct-1", 42, Some("worker-1")), Err(GrantError::Missing));
    }

    #[test]
    fn a_missing_signature_is_refused_unless_the_transition_switch_accepts_it() {
        assert_eq!(verifier().verify(None, "payout:a", 1, Some("w")), Err(GrantError::Missing));
        let t = GrantVerifier::new(vec![], true);
        assert_eq!(t.verify(None, "payout:a", 1, Some("w")), Ok(Verdict::Unsigned));
        // A present signature is still judged under the switch.
        let h = GrantSigner::from_seed(&[9; 32]).sign("payout:a", 1, "w");
        assert_eq!(t.verify(Some(&h), "payout:a", 1, Some("w")), Err(GrantError::UnknownKey));
    }

    #[test]
    fn rotation_accepts_every_configured_key_and_nothing_else() {
        let old = testing::signer();
        let new = GrantSigner::from_seed(&testing::SEED_NEXT);
        let both = GrantVerifier::new(vec![old.verify_key(), new.verify_key()], false);
        let only_new = GrantVerifier::new(vec![new.verify_key()], false);
        let (ho, hn) = (old.sign("k", 1, "w"), new.sign("k", 1, "w"));
        assert_eq!(both.verify(Some(&ho), "k", 1, Some("w")), Ok(Verdict::Signed));
        assert_eq!(both.verify(Some(&hn), "k", 1, Some("w")), Ok(Verdict::Signed));
        assert_eq!(only_new.verify(Some(&hn), "k", 1, Some("w")), Ok(Verdict::Signed));
        assert_eq!(only_new.verify(Some(&ho), "k", 1, Some("w")), Err(GrantError::UnknownKey));
    }

    #[test]
    fn key_files_parse_in_base64_and_hex_and_refuse_anything_else() {
        let seed = [5u8; 32];
        assert_eq!(parse_seed(&seed_text(&seed)), Ok(seed));
        assert_eq!(parse_seed(&hex::encode(seed)), Ok(seed));
        assert!(parse_seed("not a key").is_err());
        assert!(parse_seed(&base64::engine::general_purpose::STANDARD.encode([1u8; 31])).is_err());
        let s = GrantSigner::from_seed(&seed);
        let pk = s.verify_key().to_base64();
        let keys =
            parse_verify_keys(&format!("{pk}, {}\n\n", testing::signer().verify_key().to_base64())).expect("two keys");
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].key_id(), s.key_id());
        assert_eq!(keys[0].key_id().to_string().len(), KEY_ID_HEX_CHARS);
        assert!(parse_verify_keys("AAAA").is_err());
        assert!(parse_verify_keys(&vec![pk.as_str(); VERIFY_KEYS_MAX + 1].join(",")).is_err());
        assert_eq!(parse_verify_keys(""), Ok(vec![]));
    }

    #[test]
    fn the_message_is_domain_separated_and_fixed() {
        assert_eq!(message("payout:a", 7, "w-1"), b"dlock-grant/1\npayout:a\n7\nw-1".to_vec());
        assert_eq!(payout_lock_key("acct-9"), "payout:acct-9");
    }
}
