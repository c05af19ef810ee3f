//! The rail's own record: every call the rail received, in arrival order, and whether each
//! moved money. The rail-stub's `GET /calls` stands in for the bank's statement (C3-extensions
//! E-7); `clientRef` is the payout id the proxy sent.

use async_trait::async_trait;
use dlock_contract::rail::{RailCall, RailCallLog};
use dlock_rt::http::{BaseUrl, HttpClient};

use crate::budget::{ReadBudget, ReadError};

/// Where the reconciler reads the rail's record. One call is one try; the caller spends the
/// budget ([`crate::budget::with_budget`]).
#[async_trait]
pub trait RailRecord: Send + Sync {
    /// Every call the rail has received, in arrival order.
    async fn calls(&self) -> Result<Vec<RailCall>, ReadError>;

    /// Where the record comes from, for the report.
    fn describe(&self) -> String;
}

/// `GET {rail}/calls` over one fresh connection, with the read budget's connect and read
/// timeouts.
#[derive(Debug, Clone)]
pub struct HttpRailRecord {
    pub base: BaseUrl,
    pub client: HttpClient,
}

impl HttpRailRecord {
    pub fn new(base: BaseUrl, budget: &ReadBudget) -> HttpRailRecord {
        HttpRailRecord {
            base,
            client: HttpClient::new(budget.connect_timeout_ms, budget.read_timeout_ms).without_bearer(),
        }
    }
}

#[async_trait]
impl RailRecord for HttpRailRecord {
    async fn calls(&self) -> Result<Vec<RailCall>, ReadError> {
        let resp = self
            .client
            .send(&self.base, http::Method::GET, "/calls", &[("accept", "application/json")], None)
            .await
            // A GET has no side effect: a lost answer may be asked again.
            .map_err(|e| ReadError::transient(e.to_string()))?;
        match resp.status {
            200 => serde_json::from_slice::<RailCallLog>(&resp.body)
                .map(|log| log.calls)
                .map_err(|e| ReadError::permanent(format!("GET /calls answered a body that is not a call log: {e}"))),
            s if s >= 500 => Err(ReadError::transient(format!("GET /calls answered {s}"))),
            s => Err(ReadError::permanent(format!("GET /calls answered {s}"))),
        }
    }

    fn describe(&self) -> String {
        format!("{}/calls", self.base.url())
    }
}
