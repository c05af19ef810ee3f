//! Properties of the credential parsers (`dlock_contract::auth`) and of the grant-signature
//! check (`dlock_contract::grant`), shared by the fuzz targets (`fuzz/fuzz_targets/`) and
//! the corpus replay test (`crates/dlock-contract/tests/fuzz_corpus.rs`). Each checks the
//! code against an oracle written from C3-extensions E-13/E-14, not just "no panic".
#![allow(dead_code)] // each fuzz target uses one property of this file

use dlock_contract::auth::{bearer_of, parse_credentials, token_eq, Role, TOKEN_BYTES_MAX, TOKEN_BYTES_MIN};
use dlock_contract::grant::{self, testing, GrantError, GrantSignature, GrantSigner, SIGNATURE_HEADER_CHARS_MAX};

/// The reasons a credentials file may give for a refused line: a closed set, so no refusal
/// can echo a token (or anything else) of the file.
const CREDENTIAL_REFUSALS: &[&str] = &[
    "the first word must be worker, operator or reader",
    "a role must be followed by a token",
    "after the token only owners=<id>[,<id>...] may follow",
    "owners= is given twice",
    "owners= must list valid owner ids separated by commas",
    "this token is already listed on an earlier line",
];

/// `parse_credentials` on any text: a refusal is `credentials <source>, line <n>: <reason>`
/// with a reason from a closed set (it never echoes the file); an accepted file holds one
/// credential per non-comment line, each found by its own token with its own role, and a
/// token one byte longer than a listed one is not found unless it is listed too.
pub fn credential_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    match parse_credentials(text, "fuzz") {
        Err(msg) => {
            let rest = msg.strip_prefix("credentials fuzz, line ").unwrap_or_else(|| panic!("refusal {msg:?}"));
            let (n, reason) = rest.split_once(": ").unwrap_or_else(|| panic!("refusal {msg:?}"));
            let n: usize = n.parse().unwrap_or_else(|_| panic!("line number in {msg:?}"));
            assert!((1..=text.lines().count()).contains(&n), "line {n} of {msg:?}");
            let sized = format!("the token must be {TOKEN_BYTES_MIN}..={TOKEN_BYTES_MAX} printable ASCII characters");
            let bounded = reason.starts_with("at most ") && reason.ends_with(" per file")
                || reason.starts_with("at most ") && reason.ends_with(" owners per credential");
            assert!(CREDENTIAL_REFUSALS.contains(&reason) || reason == sized || bounded, "reason {reason:?}");
        }
        Ok(set) => {
            assert_eq!(set.len(), lines.len(), "one credential per line");
            let listed: Vec<(Role, &str)> = lines
                .iter()
                .map(|l| {
                    let mut w = l.split_whitespace();
                    let role = w.next().and_then(Role::parse).expect("an accepted line starts with its role");
                    (role, w.next().expect("an accepted line has a token"))
                })
                .collect();
            for (role, token) in &listed {
                let found = set.find(token.as_bytes()).expect("a listed token is found");
                assert_eq!(found.role, *role, "a token is found with its own role");
                let longer = format!("{token}x");
                if !listed.iter().any(|(_, t)| *t == longer) {
                    assert!(set.find(longer.as_bytes()).is_none(), "a longer token than a listed one was found");
                }
            }
        }
    }
}

/// `bearer_of` against its grammar: `<scheme> <token>` with the scheme `Bearer` in any case
/// and the token what follows the first space, trimmed and not empty; and `token_eq` is
/// byte equality (split at the input's first byte's value).
pub fn bearer_header(data: &[u8]) {
    if let Some((&cut, rest)) = data.split_first() {
        let (a, b) = rest.split_at(usize::from(cut).min(rest.len()));
        assert_eq!(token_eq(a, b), a == b, "token_eq is equality");
        assert!(token_eq(a, a));
    }
    let Ok(s) = std::str::from_utf8(data) else { return };
    let expected = s.split_once(' ').and_then(|(scheme, rest)| {
        let t = rest.trim();
        (scheme.eq_ignore_ascii_case("bearer") && !t.is_empty()).then_some(t)
    });
    assert_eq!(bearer_of(s), expected, "{s:?}");
}

/// Reads the next byte of `data` (0 once it runs out).
fn next(data: &mut &[u8]) -> u8 {
    let (b, rest) = data.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
    *data = rest;
    b
}

/// A short visible-ASCII string drawn from `data` (an account or owner id).
fn ident(data: &mut &[u8]) -> String {
    let len = usize::from(next(data) % 12) + 1;
    (0..len).map(|_| char::from(b'!' + next(data) % 94)).collect()
}

/// The grant-signature check: nothing unsigned, cross-key, cross-account, re-tokened or
/// re-owned passes, and a header has exactly one spelling.
///
/// - Any header text parses without a panic, and what parses prints back as itself (no
///   second spelling of one signature: re-cased ids, trailing base64 bits are refused).
/// - A grant the test key signed verifies for exactly its lock key, token and owner; any
///   one change (another account, token or owner, one byte of the header changed, a key the
///   verifier does not trust, no owner, no header) is refused, with the right error.
/// - The signed message is injective: two different grants never share a message.
pub fn grant_signature(data: &[u8]) {
    if let Ok(s) = std::str::from_utf8(data) {
        match GrantSignature::parse(s) {
            Ok(g) => assert_eq!(g.to_string(), s, "a header has one spelling"),
            Err(e) => assert!(matches!(e, GrantError::Missing | GrantError::Malformed), "{e:?}"),
        }
    }
    let mut d = data;
    let (account, owner) = (ident(&mut d), ident(&mut d));
    let token = i64::from_le_bytes(std::array::from_fn(|_| next(&mut d))).checked_abs().unwrap_or(1).max(1);
    let key = grant::payout_lock_key(&account);
    let header = testing::sign_payout(&account, token, &owner);
    assert!(header.len() <= SIGNATURE_HEADER_CHARS_MAX);
    let verifier = testing::verifier();
    assert!(verifier.verify(Some(&header), &key, token, Some(&owner)).is_ok(), "a real grant verifies");
    assert_eq!(verifier.verify(None, &key, token, Some(&owner)), Err(GrantError::Missing));
    assert_eq!(verifier.verify(Some(&header), &key, token, None), Err(GrantError::NoOwner));

    let other = ident(&mut d);
    let refused = |h: &str, k: &str, t: i64, o: &str| verifier.verify(Some(h), k, t, Some(o)).is_err();
    if other != account {
        assert!(refused(&header, &grant::payout_lock_key(&other), token, &owner), "cross-account passed");
    }
    if other != owner {
        assert!(refused(&header, &key, token, &other), "another owner passed");
    }
    let delta = i64::from(next(&mut d)) + 1;
    for t in [token.wrapping_add(delta), token.wrapping_sub(delta), i64::MAX] {
        if t > 0 && t != token {
            assert!(refused(&header, &key, t, &owner), "token {t} passed on a grant of {token}");
        }
    }
    // One byte of the header changed.
    let at = usize::from(next(&mut d)) % header.len();
    let mut bytes = header.clone().into_bytes();
    bytes[at] = bytes[at].wrapping_add(next(&mut d).max(1));
    if let Ok(changed) = String::from_utf8(bytes) {
        assert!(refused(&changed, &key, token, &owner), "a changed header passed: {changed:?}");
    }
    // A key the verifier does not trust, even when the header names the trusted key's id.
    let rogue = GrantSigner::from_seed(&std::array::from_fn(|i| next(&mut d) ^ (i as u8)));
    if rogue.key_id() != testing::signer().key_id() {
        let forged = rogue.sign(&key, token, &owner);
        assert_eq!(verifier.verify(Some(&forged), &key, token, Some(&owner)), Err(GrantError::UnknownKey));
        let relabelled = forged.replacen(&rogue.key_id().to_string(), &testing::signer().key_id().to_string(), 1);
        assert_eq!(verifier.verify(Some(&relabelled), &key, token, Some(&owner)), Err(GrantError::BadSignature));
    }
    // Injective message: another grant, another message.
    let (k2, o2) = (grant::payout_lock_key(&other), ident(&mut d));
    if (k2.as_str(), o2.as_str()) != (key.as_str(), owner.as_str()) {
        assert_ne!(grant::message(&key, token, &owner), grant::message(&k2, token, &o2));
    }
}
