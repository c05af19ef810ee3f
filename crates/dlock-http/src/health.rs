//! Health endpoints: `live` touches nothing; `ready` reports each dependency.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use dlock_contract::ErrorCode;
use serde_json::json;

use crate::ApiError;

/// `GET /health/live`: the process is up. Deliberately checks no dependency.
#[utoipa::path(get, path = "/health/live", tag = "health", operation_id = "health_live",
    responses((status = 200, description = "The process is up.", body = crate::openapi::Health,
        example = json!({ "status": "UP" }))))]
pub async fn live() -> Response {
    crate::json(StatusCode::OK, &json!({ "status": "UP" }))
}

/// Renders a readiness verdict from named component checks (`Ok` = UP).
pub fn ready(components: BTreeMap<&'static str, Result<(), String>>) -> Response {
    let all_up = components.values().all(Result::is_ok);
    let view: BTreeMap<_, _> =
        components.iter().map(|(k, v)| (*k, json!({ "status": if v.is_ok() { "UP" } else { "DOWN" } }))).collect();
    if all_up {
        crate::json(StatusCode::OK, &json!({ "status": "UP", "components": view }))
    } else {
        let causes: Vec<String> =
            components.iter().filter_map(|(k, v)| v.as_ref().err().map(|e| format!("{k}: {e}"))).collect();
        ApiError::new(ErrorCode::NotReady, "a dependency is unreachable; this instance fails closed")
            .with_details(json!({ "components": view }))
            .with_internal(causes.join("; "))
            .into_response()
    }
}
