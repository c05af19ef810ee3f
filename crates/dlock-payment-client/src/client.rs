//! The calls. Each builds its path and headers, serialises the contract's request type,
//! and hands the send to one of two loops: [`PaymentClient::write`] (re-sends only what
//! [`PaymentRefusal::write_retry_pause_ms`] allows) or [`PaymentClient::read`] (advisory,
//! `read_tries_max` tries).

use bytes::Bytes;
use dlock_contract::batch::BatchAnswer;
use dlock_contract::grant::SignedToken;
use dlock_contract::payment::{
    AccountBody, ClaimAck, ClaimBatchRequest, ClaimRequest, NewAccountRequest, NewPayoutRequest, PayoutBody,
    PayoutPage, PostAck, PostBatchRequest, PostRequest,
};
use dlock_contract::payout::PayoutState;
use dlock_contract::{
    IdempotencyKey, OwnerId, CONTENT_TYPE_JSON, HEADER_FENCING_TOKEN, HEADER_IDEMPOTENCY_KEY, HEADER_OWNER_ID,
};
use dlock_rt::http::HttpClient;
use dlock_rt::Duration;
use serde::de::DeserializeOwned;
use serde::Serialize;
use uuid::Uuid;

use crate::config::{PaymentClientConfig, READ_RETRY_PAUSE_MS};
use crate::refusal::{decode, Operation, PaymentRefusal};

/// A P1 query: one state, optionally one account, a page size and the previous page's
/// `nextCursor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    pub state: PayoutState,
    pub account_id: Option<String>,
    /// `None` lets the service choose (`P1_LIMIT_DEFAULT`).
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

impl ListQuery {
    /// The first page of `state`, at the service's default size.
    pub fn new(state: PayoutState) -> ListQuery {
        ListQuery { state, account_id: None, limit: None, cursor: None }
    }

    /// This query with a page size.
    pub fn limit(mut self, limit: u32) -> ListQuery {
        self.limit = Some(limit);
        self
    }

    fn path(&self) -> String {
        let mut path = format!("/v1/payouts?state={}", self.state.as_str());
        if let Some(a) = &self.account_id {
            path.push_str("&accountId=");
            path.push_str(&query_escape(a));
        }
        if let Some(l) = self.limit {
            path.push_str(&format!("&limit={l}"));
        }
        if let Some(c) = &self.cursor {
            path.push_str("&cursor=");
            path.push_str(&query_escape(c));
        }
        path
    }
}

/// `/v1/accounts/{account_id}` and, when `tail` is not empty, `/{tail}`; an account id that
/// is not path-safe is refused before anything is sent.
fn account_path(operation: Operation, account_id: &str, tail: &str) -> Result<String, PaymentRefusal> {
    if !dlock_contract::rail::is_account_id(account_id) {
        return Err(PaymentRefusal::NothingSent {
            operation,
            cause: "accountId must be 1 to 64 characters of [a-zA-Z0-9:._-]".into(),
        });
    }
    Ok(if tail.is_empty() { format!("/v1/accounts/{account_id}") } else { format!("/v1/accounts/{account_id}/{tail}") })
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn query_escape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The client. Cheap to clone; clones share its kept-alive connections.
#[derive(Debug, Clone)]
pub struct PaymentClient {
    cfg: PaymentClientConfig,
    write_budget: HttpClient,
    read_budget: HttpClient,
}

/// The headers of one write.
struct WriteHeaders {
    token: Option<String>,
    signature: Option<String>,
    owner: String,
    key: String,
}

impl WriteHeaders {
    /// The headers of a fenced write: the token and, when the grant carries one, its
    /// signature (`X-Fencing-Signature`, C3-extensions E-14).
    fn fenced(t: SignedToken, owner: &OwnerId, key: &IdempotencyKey) -> WriteHeaders {
        WriteHeaders {
            token: Some(t.token.to_string()),
            signature: t.signature,
            owner: owner.to_string(),
            key: key.to_string(),
        }
    }

    fn pairs(&self) -> Vec<(&str, &str)> {
        let mut h = vec![
            ("content-type", CONTENT_TYPE_JSON),
            ("accept", CONTENT_TYPE_JSON),
            (HEADER_OWNER_ID, self.owner.as_str()),
            (HEADER_IDEMPOTENCY_KEY, self.key.as_str()),
        ];
        if let Some(t) = &self.token {
            h.push((HEADER_FENCING_TOKEN, t.as_str()));
        }
        if let Some(sig) = &self.signature {
            h.push((dlock_contract::HEADER_FENCING_SIGNATURE, sig.as_str()));
        }
        h
    }
}

impl PaymentClient {
    /// A client with validated settings.
    pub fn new(cfg: PaymentClientConfig) -> Result<PaymentClient, String> {
        cfg.validate()?;
        // Kept alive (cut 9): a lost answer of any call here is already safe to ask again.
        let write_budget = HttpClient::new(cfg.write_connect_timeout_ms, cfg.write_read_timeout_ms)
            .with_bearer(cfg.bearer.clone())
            .with_keep_alive();
        let read_budget = HttpClient::new(cfg.read_connect_timeout_ms, cfg.read_read_timeout_ms)
            .with_bearer(cfg.bearer.clone())
            .with_keep_alive();
        Ok(PaymentClient { cfg, write_budget, read_budget })
    }

    pub fn config(&self) -> &PaymentClientConfig {
        &self.cfg
    }

    /// Connections this client has opened (writes and reads together): with keep-alive,
    /// far fewer than its requests.
    pub fn connections_opened(&self) -> u64 {
        self.write_budget.connections_opened() + self.read_budget.connections_opened()
    }

    /// P1: one page of payouts in a state (advisory).
    pub async fn list(&self, query: &ListQuery) -> Result<PayoutPage, PaymentRefusal> {
        self.read(Operation::List, &query.path()).await
    }

    /// P4: one payout with its submissions (advisory).
    pub async fn payout(&self, payout_id: Uuid) -> Result<PayoutBody, PaymentRefusal> {
        self.read(Operation::Payout, &format!("/v1/payouts/{payout_id}")).await
    }

    /// P5: one account, its balance and fence (advisory).
    pub async fn account(&self, account_id: &str) -> Result<AccountBody, PaymentRefusal> {
        let path = account_path(Operation::Account, account_id, "")?;
        self.read(Operation::Account, &path).await
    }

    /// P2: claims `payout_id` under `token` (the grant's fencing token).
    pub async fn claim(
        &self,
        payout_id: Uuid,
        token: impl Into<SignedToken>,
        owner: &OwnerId,
        key: &IdempotencyKey,
        body: &ClaimRequest,
    ) -> Result<ClaimAck, PaymentRefusal> {
        let headers = WriteHeaders::fenced(token.into(), owner, key);
        self.write(Operation::Claim, &format!("/v1/payouts/{payout_id}/claim"), &headers, body).await
    }

    /// P3: posts the ledger entries of `payout_id` under `token`.
    pub async fn post(
        &self,
        payout_id: Uuid,
        token: impl Into<SignedToken>,
        owner: &OwnerId,
        key: &IdempotencyKey,
        body: &PostRequest,
    ) -> Result<PostAck, PaymentRefusal> {
        let headers = WriteHeaders::fenced(token.into(), owner, key);
        self.write(Operation::Post, &format!("/v1/payouts/{payout_id}/post"), &headers, body).await
    }

    /// P2b: claims several payouts of `account_id` under one `token` (C3-extensions E-19):
    /// the grant is `payout:{account_id}`'s and `key` the batch's own. The answer carries each
    /// payout's P2 answer as an item; a refusal of the whole batch (`FENCED_OUT`, an unknown
    /// account, a conflict, a store failure) is a [`PaymentRefusal`], re-sent under the same
    /// rule as a claim's.
    pub async fn claim_batch(
        &self,
        account_id: &str,
        token: impl Into<SignedToken>,
        owner: &OwnerId,
        key: &IdempotencyKey,
        body: &ClaimBatchRequest,
    ) -> Result<BatchAnswer, PaymentRefusal> {
        let path = account_path(Operation::ClaimBatch, account_id, "claims")?;
        let headers = WriteHeaders::fenced(token.into(), owner, key);
        self.write(Operation::ClaimBatch, &path, &headers, body).await
    }

    /// P3b: posts several acknowledged payouts of `account_id` under one `token`
    /// (C3-extensions E-19), as [`PaymentClient::claim_batch`].
    pub async fn post_batch(
        &self,
        account_id: &str,
        token: impl Into<SignedToken>,
        owner: &OwnerId,
        key: &IdempotencyKey,
        body: &PostBatchRequest,
    ) -> Result<BatchAnswer, PaymentRefusal> {
        let path = account_path(Operation::PostBatch, account_id, "posts")?;
        let headers = WriteHeaders::fenced(token.into(), owner, key);
        self.write(Operation::PostBatch, &path, &headers, body).await
    }

    /// `POST /v1/accounts`: opens an account with its opening balance.
    pub async fn create_account(
        &self,
        owner: &OwnerId,
        key: &IdempotencyKey,
        body: &NewAccountRequest,
    ) -> Result<AccountBody, PaymentRefusal> {
        let headers = WriteHeaders { token: None, signature: None, owner: owner.to_string(), key: key.to_string() };
        self.write(Operation::CreateAccount, "/v1/accounts", &headers, body).await
    }

    /// `POST /v1/payouts`: creates a PENDING payout.
    pub async fn create_payout(
        &self,
        owner: &OwnerId,
        key: &IdempotencyKey,
        body: &NewPayoutRequest,
    ) -> Result<PayoutBody, PaymentRefusal> {
        let headers = WriteHeaders { token: None, signature: None, owner: owner.to_string(), key: key.to_string() };
        self.write(Operation::CreatePayout, "/v1/payouts", &headers, body).await
    }

    /// Sends one write, and re-sends the identical bytes at most `write_retries_max` times,
    /// only when the refusal allows it.
    async fn write<B: Serialize, T: DeserializeOwned>(
        &self,
        operation: Operation,
        path: &str,
        headers: &WriteHeaders,
        body: &B,
    ) -> Result<T, PaymentRefusal> {
        assert!(!operation.is_read(), "a write is not an advisory read");
        let bytes = match serde_json::to_vec(body) {
            Ok(b) => Bytes::from(b),
            Err(e) => return Err(PaymentRefusal::NothingSent { operation, cause: e.to_string() }),
        };
        let pairs = headers.pairs();
        let sends_max = 1 + self.cfg.write_retries_max;
        let mut sends: u32 = 1;
        loop {
            let sent =
                self.write_budget.send(&self.cfg.base_url, http::Method::POST, path, &pairs, Some(bytes.clone())).await;
            let refusal = match decode::<T>(operation, sent) {
                Ok(answer) => return Ok(answer),
                Err(refusal) => refusal,
            };
            let Some(pause_ms) = refusal.write_retry_pause_ms() else {
                return Err(refusal);
            };
            if sends >= sends_max {
                return Err(refusal);
            }
            tracing::debug!(operation = operation.as_str(), send = sends, pause_ms, cause = %refusal,
                "payment_client_retry");
            if pause_ms > 0 {
                dlock_rt::sleep(Duration::from_millis(pause_ms)).await;
            }
            sends += 1;
        }
    }

    /// An advisory GET: at most `read_tries_max` tries, [`READ_RETRY_PAUSE_MS`] apart.
    async fn read<T: DeserializeOwned>(&self, operation: Operation, path: &str) -> Result<T, PaymentRefusal> {
        assert!(operation.is_read(), "only an advisory read is retried on a lost answer");
        let headers = [("accept", CONTENT_TYPE_JSON)];
        let mut tries: u32 = 1;
        loop {
            let sent = self.read_budget.send(&self.cfg.base_url, http::Method::GET, path, &headers, None).await;
            let refusal = match decode::<T>(operation, sent) {
                Ok(answer) => return Ok(answer),
                Err(refusal) => refusal,
            };
            if !refusal.read_retries() || tries >= self.cfg.read_tries_max {
                return Err(refusal);
            }
            dlock_rt::sleep(Duration::from_millis(READ_RETRY_PAUSE_MS)).await;
            tries += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_queries_name_only_what_is_set_and_escape_values() {
        assert_eq!(ListQuery::new(PayoutState::Pending).path(), "/v1/payouts?state=PENDING");
        let q = ListQuery {
            state: PayoutState::RailAcked,
            account_id: Some("acct:1".into()),
            limit: Some(50),
            cursor: Some("a+b/c=".into()),
        };
        assert_eq!(q.path(), "/v1/payouts?state=RAIL_ACKED&accountId=acct%3A1&limit=50&cursor=a%2Bb%2Fc%3D");
    }
}
