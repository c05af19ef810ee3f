//! Replays the committed seed corpus of each header fuzz target (`fuzz/corpus/<target>/`)
//! through the same property the target checks (`fuzz/props/headers.rs`, `auth.rs`), so the properties
//! run in every normal `cargo test`, on stable, without libFuzzer. The coverage-guided runs
//! are the `fuzz` stage of `scripts/test.sh` (`fuzz/README.md`).

#[path = "../../../fuzz/props/auth.rs"]
mod auth_props;
#[path = "../../../fuzz/props/replay.rs"]
mod corpus;
#[path = "../../../fuzz/props/headers.rs"]
mod props;
use corpus::replay;

use dlock_contract::headers::{FencingToken, HeaderError};

#[test]
fn fencing_token_corpus_keeps_the_canonical_spelling_property() {
    replay("fencing_token", props::fencing_token);
}

#[test]
fn owner_id_corpus_keeps_the_visible_ascii_property() {
    replay("owner_id", props::owner_id);
}

#[test]
fn idempotency_key_corpus_keeps_the_visible_ascii_property() {
    replay("idempotency_key", props::idempotency_key);
}

#[test]
fn submission_body_corpus_keeps_the_validated_body_property() {
    replay("submission_body", props::submission_body);
}

#[test]
#[should_panic(expected = "refused the canonical token")]
fn the_fencing_token_property_fails_a_parser_that_refuses_a_canonical_token() {
    props::fencing_token_check("1", Err(HeaderError::MalformedToken));
}

#[test]
#[should_panic(expected = "accepted a non-canonical token")]
fn the_fencing_token_property_fails_a_parser_that_accepts_a_padded_token() {
    props::fencing_token_check("01", FencingToken::parse("1"));
}

#[test]
fn credential_file_corpus_refuses_with_a_closed_set_of_reasons_and_finds_each_token_with_its_role() {
    replay("credential_file", auth_props::credential_file);
}

#[test]
fn bearer_header_corpus_follows_the_bearer_grammar_and_token_equality() {
    replay("bearer_header", auth_props::bearer_header);
}

#[test]
fn grant_signature_corpus_admits_only_the_exact_signed_grant() {
    replay("grant_signature", auth_props::grant_signature);
}
