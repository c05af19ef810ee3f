//! The submission and its budget.

use bytes::Bytes;
use dlock_contract::batch::BatchAnswer;
use dlock_contract::rail::{SubmissionAck, SubmissionBatchRequest, SubmissionRequest};
use dlock_contract::{
    IdempotencyKey, OwnerId, CONTENT_TYPE_JSON, HEADER_FENCING_TOKEN, HEADER_IDEMPOTENCY_KEY, HEADER_OWNER_ID,
};
use dlock_rt::http::{BaseUrl, HttpClient};

use crate::refusal::{decode, RailRefusal};

/// The proxy's one write.
pub const SUBMISSIONS_PATH: &str = "/v1/rail/submissions";
/// The proxy's batch of that write (R1b, C3-extensions E-19).
pub const SUBMISSION_BATCHES_PATH: &str = "/v1/rail/submission-batches";
/// Submit connect budget (C3 §3.8: 1 s / rail read timeout + 2 s).
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 1_000;
/// The proxy's default read timeout towards the rail (`rail.proxy.read-timeout-ms`).
pub const RAIL_READ_TIMEOUT_MS_DEFAULT: u64 = 8_000;
/// What the submit read budget adds to the rail's read timeout (C3 §3.8 "+ 2 s").
pub const READ_MARGIN_MS: u64 = 2_000;
/// Longest either budget may be set to.
pub const TIMEOUT_MS_CEILING_MAX: u64 = 60_000;

/// The client's settings. There is no retry setting: a submission is never re-sent.
#[derive(Debug, Clone)]
pub struct RailClientConfig {
    /// The rail-proxy, `http://host:port`.
    pub base_url: BaseUrl,
    pub connect_timeout_ms: u64,
    /// Must exceed the proxy's own read timeout towards the rail (C3 §3.8).
    pub read_timeout_ms: u64,
    /// The credential every request presents (C3-extensions E-13); none: no header.
    pub bearer: Option<dlock_rt::http::Bearer>,
}

impl RailClientConfig {
    /// Settings with the C3 §3.8 defaults.
    pub fn new(base_url: BaseUrl) -> RailClientConfig {
        RailClientConfig {
            base_url,
            connect_timeout_ms: CONNECT_TIMEOUT_MS_DEFAULT,
            read_timeout_ms: RAIL_READ_TIMEOUT_MS_DEFAULT + READ_MARGIN_MS,
            bearer: None,
        }
    }

    /// Refuses settings outside their ranges, naming the field.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [("connect_timeout_ms", self.connect_timeout_ms), ("read_timeout_ms", self.read_timeout_ms)] {
            if v == 0 || v > TIMEOUT_MS_CEILING_MAX {
                return Err(format!("{name} must be 1..={TIMEOUT_MS_CEILING_MAX}"));
            }
        }
        Ok(())
    }
}

/// The client. Cheap to clone; holds no connection.
#[derive(Debug, Clone)]
pub struct RailClient {
    cfg: RailClientConfig,
    budget: HttpClient,
}

impl RailClient {
    /// A client with validated settings.
    pub fn new(cfg: RailClientConfig) -> Result<RailClient, String> {
        cfg.validate()?;
        let budget = HttpClient::new(cfg.connect_timeout_ms, cfg.read_timeout_ms).with_bearer(cfg.bearer.clone());
        Ok(RailClient { cfg, budget })
    }

    pub fn config(&self) -> &RailClientConfig {
        &self.cfg
    }

    /// `POST /v1/rail/submissions`, sent once under `token`. Never retried, whatever the
    /// refusal: see the crate's invariant 1.
    pub async fn submit(
        &self,
        token: impl Into<dlock_contract::grant::SignedToken>,
        owner: &OwnerId,
        key: &IdempotencyKey,
        body: &SubmissionRequest,
    ) -> Result<SubmissionAck, RailRefusal> {
        self.send_once(SUBMISSIONS_PATH, token.into(), owner, Some(key), body).await
    }

    /// `POST /v1/rail/submission-batches` (R1b, C3-extensions E-19): several claimed payouts
    /// of `body`'s one account, sent once under `token`, never retried, whatever the
    /// refusal (the crate's invariant 1, for every payout of the batch at once). The answer
    /// has one item per submission, each the single submission's answer for its payout; a
    /// refusal ([`RailRefusal`]) concerns the whole batch, and an unknown outcome
    /// ([`RailRefusal::outcome_unknown`]) is unknown for every payout in it. No
    /// `X-Idempotency-Key`: each submission carries its payout's key in the body. The
    /// budget is [`RailClient::submit`]'s: the proxy forwards a batch's payouts at once.
    pub async fn submit_batch(
        &self,
        token: impl Into<dlock_contract::grant::SignedToken>,
        owner: &OwnerId,
        body: &SubmissionBatchRequest,
    ) -> Result<BatchAnswer, RailRefusal> {
        self.send_once(SUBMISSION_BATCHES_PATH, token.into(), owner, None, body).await
    }

    /// One fenced POST of `body` to `path` under `signed` (its signature beside its token,
    /// C3-extensions E-14), with `key` as `X-Idempotency-Key` when given; sent once.
    async fn send_once<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        signed: dlock_contract::grant::SignedToken,
        owner: &OwnerId,
        key: Option<&IdempotencyKey>,
        body: &B,
    ) -> Result<T, RailRefusal> {
        let bytes = match serde_json::to_vec(body) {
            Ok(b) => Bytes::from(b),
            Err(e) => return Err(RailRefusal::NothingSent { cause: e.to_string() }),
        };
        let token = signed.token.to_string();
        let mut headers = vec![
            ("content-type", CONTENT_TYPE_JSON),
            ("accept", CONTENT_TYPE_JSON),
            (HEADER_FENCING_TOKEN, token.as_str()),
            (HEADER_OWNER_ID, owner.as_str()),
        ];
        if let Some(key) = key {
            headers.push((HEADER_IDEMPOTENCY_KEY, key.as_str()));
        }
        if let Some(sig) = &signed.signature {
            headers.push((dlock_contract::HEADER_FENCING_SIGNATURE, sig.as_str()));
        }
        decode(self.budget.send(&self.cfg.base_url, http::Method::POST, path, &headers, Some(bytes)).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_c3_3_8_submit_budget() {
        let c = RailClientConfig::new(BaseUrl::parse("http://127.0.0.1:8083").expect("url"));
        assert_eq!((c.connect_timeout_ms, c.read_timeout_ms), (1_000, 10_000));
        assert_eq!(c.validate(), Ok(()));
        let mut c2 = c.clone();
        c2.read_timeout_ms = 0;
        assert!(c2.validate().is_err_and(|e| e.contains("read_timeout_ms")));
        let mut c3 = c;
        c3.connect_timeout_ms = TIMEOUT_MS_CEILING_MAX + 1;
        assert!(c3.validate().is_err_and(|e| e.contains("connect_timeout_ms")));
    }
}
