//! The OpenAPI pieces every service's `GET /v1/openapi.json` shares (C3-extensions E-16).
//!
//! A service's document is generated from its code: `#[utoipa::path]` on each handler gives
//! the path, parameters, request body and success answers; [`complete`] then adds what is
//! written down once for every service:
//! - **security**, per operation, from the service's role table ([`dlock_contract::auth`]):
//!   an open route has none, an advisory read needs any credential (`bearer: []`), a write
//!   needs exactly one role (`bearer: ["worker"]`, OpenAPI 3.1 role names);
//! - **errors**, per operation, from the service's [`RouteErrors`] table plus the codes any
//!   route can answer (see [`TRANSPORT_CODES`] and the auth codes): one response per HTTP
//!   status, whose schema is the [`ErrorEnvelope`] with `code` narrowed to exactly the codes
//!   that status can carry on that route, and one example per code;
//! - the `traceparent` request header every route reads.
//!
//! Invariants:
//! - Every operation of the document has a [`RouteErrors`] row and every row names an
//!   operation of the document ([`complete`] refuses otherwise), so an endpoint cannot be
//!   published without its error list, nor an error list outlive its endpoint.
//! - The document is a pure function of the code: no clock, no randomness, maps in sorted
//!   order. The committed copies in `docs/api/` are compared byte for byte by a test.

use std::collections::BTreeMap;

use dlock_contract::auth::{need_for, Need, RouteRule};
use dlock_contract::{ErrorCode, ErrorEnvelope, FieldError};
use serde_json::{json, Value};
use utoipa::openapi::example::ExampleBuilder;
use utoipa::openapi::path::{Operation, Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, RefOr, Required, ResponseBuilder};

/// Name of the bearer security scheme in every document.
pub const SECURITY_SCHEME: &str = "bearer";
/// Content type of `GET /v1/openapi.json` (the contract's JSON type, like every body).
pub const DOCUMENT_CONTENT_TYPE: &str = dlock_contract::CONTENT_TYPE_JSON;
/// Media type key of every JSON body in a document (the wire adds `; charset=utf-8`).
const JSON_MEDIA_TYPE: &str = "application/json";
/// The route every service serves its document on.
pub const DOCUMENT_PATH: &str = "/v1/openapi.json";
/// Trace id shown in the generated error examples (the W3C example trace id).
const EXAMPLE_TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// Codes any route can answer whatever it does: a NUL in the target (`400`), an oversized
/// header section (`431`), an unexpected fault (`500`).
pub const TRANSPORT_CODES: &[ErrorCode] =
    &[ErrorCode::ValidationFailed, ErrorCode::HeadersTooLarge, ErrorCode::Internal];

/// Codes a route reading a JSON body can answer before the handler sees it.
pub const BODY_CODES: &[ErrorCode] =
    &[ErrorCode::ValidationFailed, ErrorCode::PayloadTooLarge, ErrorCode::UnsupportedMediaType];

/// One operation's error list: every code its handler can answer (the [`TRANSPORT_CODES`]
/// and the auth codes are added by [`complete`]), and the documented status overrides
/// (`status`, `code`) of C3-extensions C-1 and C-18.
#[derive(Debug, Clone, Copy)]
pub struct RouteErrors {
    pub method: &'static str,
    pub path: &'static str,
    pub codes: &'static [&'static [ErrorCode]],
    pub overrides: &'static [(u16, ErrorCode)],
}

/// [`RouteErrors`] without status overrides.
pub const fn errors(method: &'static str, path: &'static str, codes: &'static [&'static [ErrorCode]]) -> RouteErrors {
    RouteErrors { method, path, codes, overrides: &[] }
}

/// What [`complete`] needs to know about a service.
#[derive(Debug, Clone, Copy)]
pub struct ServiceDoc {
    /// The service's role table, or `None` for a service that never authenticates.
    pub roles: Option<&'static [RouteRule]>,
    pub errors: &'static [RouteErrors],
}

/// The `Prefer` request header of a snapshot read (P1, P4, L7; C3-extensions E-20,
/// "Snapshots"): `event-cursor` asks for the snapshot's event cursor, answered in
/// `X-Event-Cursor` and `X-Event-Seq`.
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
pub struct PreferEventCursorHeader {
    /// `event-cursor`: answer the cursor of the watermark read before the snapshot.
    #[param(rename = "Prefer", example = "event-cursor")]
    pub prefer: Option<String>,
}

/// The `X-Owner-Id` request header (C3 §3.1).
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
pub struct OwnerHeader {
    /// The caller's opaque worker identity: 1 to 64 visible ASCII characters.
    #[param(rename = "X-Owner-Id", pattern = "^[!-~]{1,64}$", example = "worker-1")]
    pub owner_id: String,
}

/// The `X-Fencing-Token` request header (C3 §3.1).
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
pub struct FencingTokenHeader {
    /// The fencing token of the caller's grant: a canonical decimal int64 greater than zero.
    #[param(rename = "X-Fencing-Token", pattern = "^[1-9][0-9]{0,17}$", example = "42")]
    pub fencing_token: String,
}

/// The `X-Fencing-Signature` request header (C3-extensions E-14).
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
pub struct FencingSignatureHeader {
    /// The lock server's signature of the grant (`v1.<key id>.<signature>`), as the grant's
    /// `fencingSignature` gave it. Required when the service trusts signing keys.
    #[param(rename = "X-Fencing-Signature", max_length = 256)]
    pub fencing_signature: Option<String>,
}

/// The `X-Idempotency-Key` request header (C3 §3.1).
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IdempotencyKeyHeader {
    /// The operation's stable idempotency key: 1 to 255 visible ASCII characters.
    #[param(rename = "X-Idempotency-Key", pattern = "^[!-~]{1,255}$", example = "payout-4b6f1b5e:claim")]
    pub idempotency_key: String,
}

/// `200` body of `GET /health/live` and `GET /health/ready` (C4).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Health {
    /// `UP`.
    #[schema(example = "UP")]
    pub status: String,
    /// Each dependency's verdict (readiness only).
    #[schema(value_type = Option<Object>)]
    pub components: Option<Value>,
}

/// Why [`complete`] refused a document: an operation without an error row, or a row
/// without an operation (`METHOD path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DocError {
    NoErrorRow(String),
    NoOperation(String),
}

impl std::fmt::Display for DocError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DocError::NoErrorRow(op) => write!(f, "{op} is documented but has no RouteErrors row"),
            DocError::NoOperation(op) => write!(f, "{op} has a RouteErrors row but is not documented"),
        }
    }
}

/// Every `(METHOD, path)` of `doc`, sorted.
pub fn operations(doc: &OpenApi) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (path, item) in &doc.paths.paths {
        for (method, op) in [("GET", &item.get), ("POST", &item.post), ("DELETE", &item.delete), ("PUT", &item.put)] {
            if op.is_some() {
                out.push((method.to_owned(), path.clone()));
            }
        }
        for (method, op) in [("PATCH", &item.patch), ("HEAD", &item.head), ("OPTIONS", &item.options)] {
            if op.is_some() {
                out.push((method.to_owned(), path.clone()));
            }
        }
    }
    out.sort();
    out
}

/// Adds security, error responses and `traceparent` to every operation of `doc` (see the
/// module documentation).
pub fn complete(mut doc: OpenApi, svc: &ServiceDoc) -> Result<OpenApi, DocError> {
    let mut rows: BTreeMap<(String, String), &RouteErrors> = BTreeMap::new();
    for r in svc.errors {
        rows.insert((r.method.to_owned(), r.path.to_owned()), r);
    }
    let ops = operations(&doc);
    for (method, path) in &rows.keys().cloned().collect::<Vec<_>>() {
        if !ops.iter().any(|(m, p)| m == method && p == path) {
            return Err(DocError::NoOperation(format!("{method} {path}")));
        }
    }
    let mut schemes_used = false;
    for (path, item) in doc.paths.paths.iter_mut() {
        let methods = [
            ("GET", &mut item.get),
            ("POST", &mut item.post),
            ("DELETE", &mut item.delete),
            ("PUT", &mut item.put),
            ("PATCH", &mut item.patch),
        ];
        for (method, op) in methods {
            let Some(op) = op.as_mut() else { continue };
            let row = rows
                .get(&(method.to_owned(), path.clone()))
                .ok_or_else(|| DocError::NoErrorRow(format!("{method} {path}")))?;
            let need = svc.roles.map(|table| need_for(table, method, path));
            schemes_used |= need.is_some_and(|n| n != Need::Open);
            decorate(op, row, need);
        }
    }
    if schemes_used {
        let components = doc.components.get_or_insert_with(Default::default);
        components.security_schemes.insert(
            SECURITY_SCHEME.to_owned(),
            SecurityScheme::Http(
                Http::builder()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A credential from the service's credentials file (C3-extensions E-13). A route that needs a \
                         role lists it; a route listing none takes any valid credential.",
                    ))
                    .build(),
            ),
        );
    }
    Ok(doc)
}

fn decorate(op: &mut Operation, row: &RouteErrors, need: Option<Need>) {
    let mut codes: Vec<(u16, ErrorCode)> = Vec::new();
    let mut add = |status: u16, code: ErrorCode| {
        if !codes.contains(&(status, code)) {
            codes.push((status, code));
        }
    };
    for code in row.codes.iter().flat_map(|c| c.iter()).chain(TRANSPORT_CODES) {
        add(code.http_status(), *code);
    }
    for (status, code) in row.overrides {
        add(*status, *code);
    }
    let mut role_text = None;
    match need {
        None | Some(Need::Open) => {}
        Some(Need::Read) => {
            add(401, ErrorCode::Unauthenticated);
            op.security = Some(vec![SecurityRequirement::new(SECURITY_SCHEME, Vec::<String>::new())]);
            role_text = Some("Needs any valid credential (reader, worker or operator).".to_owned());
        }
        Some(Need::Role(r)) => {
            add(401, ErrorCode::Unauthenticated);
            add(403, ErrorCode::Forbidden);
            op.security = Some(vec![SecurityRequirement::new(SECURITY_SCHEME, [r.as_str()])]);
            role_text = Some(format!("Needs the `{r}` role."));
        }
        Some(Need::Nobody) => {
            add(401, ErrorCode::Unauthenticated);
            add(403, ErrorCode::Forbidden);
            op.security = Some(vec![SecurityRequirement::new(SECURITY_SCHEME, ["nobody"])]);
            role_text = Some("No role may call this route (it has no row in the role table).".to_owned());
        }
    }
    if let Some(text) = role_text {
        op.description = Some(match op.description.take() {
            Some(d) if !d.is_empty() => format!("{d}\n\n{text}"),
            _ => text,
        });
    }
    let mut by_status: BTreeMap<u16, Vec<ErrorCode>> = BTreeMap::new();
    for (status, code) in codes {
        let list = by_status.entry(status).or_default();
        if !list.contains(&code) {
            list.push(code);
        }
    }
    for (status, mut list) in by_status {
        list.sort();
        op.responses.responses.insert(status.to_string(), RefOr::T(error_response(&list).build()));
    }
    not_null_when_optional(op);
    let params = op.parameters.get_or_insert_with(Vec::new);
    if !params.iter().any(|p| p.name == "traceparent") {
        params.push(traceparent());
    }
}

/// An optional request body is documented as "absent or the object", never `null`: the
/// handlers refuse a `null` body (`400 VALIDATION_FAILED`: it is not a JSON object), while
/// utoipa spells `Option<T>` as `oneOf: [null, T]`.
fn not_null_when_optional(op: &mut Operation) {
    let Some(body) = op.request_body.as_mut() else { return };
    if body.required == Some(Required::True) {
        return;
    }
    for content in body.content.values_mut() {
        let Some(RefOr::T(Schema::OneOf(one_of))) = &content.schema else { continue };
        let is_null = |s: &RefOr<Schema>| matches!(s, RefOr::T(Schema::Object(o)) if o.schema_type == SchemaType::Type(Type::Null));
        let rest: Vec<RefOr<Schema>> = one_of.items.iter().filter(|s| !is_null(s)).cloned().collect();
        if rest.len() == 1 && one_of.items.len() == 2 {
            content.schema = rest.into_iter().next();
        }
    }
}

fn error_response(codes: &[ErrorCode]) -> ResponseBuilder {
    let description = codes.iter().map(|c| format!("`{}`: {}", c.as_str(), c.spec().meaning)).collect::<Vec<_>>();
    let narrowed = ObjectBuilder::new().property(
        "code",
        ObjectBuilder::new().schema_type(Type::String).enum_values(Some(codes.iter().map(|c| c.as_str()))).build(),
    );
    let schema =
        Schema::AllOf(AllOfBuilder::new().item(Ref::from_schema_name("ErrorEnvelope")).item(narrowed.build()).build());
    let examples = codes.iter().map(|c| (c.as_str(), ExampleBuilder::new().value(Some(example_envelope(*c)))));
    ResponseBuilder::new()
        .description(description.join("\n\n"))
        .content(JSON_MEDIA_TYPE, ContentBuilder::new().schema(Some(schema)).examples_from_iter(examples).build())
}

/// The example envelope documented for `code`.
pub fn example_envelope(code: ErrorCode) -> Value {
    let spec = code.spec();
    let mut env = ErrorEnvelope::new(code, spec.meaning, EXAMPLE_TRACE_ID);
    if spec.carries_retry_after {
        env.retry_after_millis = Some(crate::error::RETRY_AFTER_MS_DEFAULT);
    }
    if code == ErrorCode::ValidationFailed {
        env.details = Some(json!({ "fields": [FieldError::new("ownerId", "is required (or send X-Owner-Id)")] }));
    }
    serde_json::to_value(env).unwrap_or(Value::Null)
}

fn traceparent() -> Parameter {
    ParameterBuilder::new()
        .name("traceparent")
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(
            "W3C trace context. Its trace id becomes the answer's `traceId`; without one, or with any value that is \
             not a well-formed `traceparent`, the service draws a fresh trace id (it never refuses the request).",
        ))
        .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
        .build()
}

/// The `200` answer of `GET /v1/openapi.json`: `doc` as JSON, or `500 INTERNAL` when it
/// could not be completed (a programming error the `openapi_docs` test catches first).
pub fn serve(doc: Result<OpenApi, DocError>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match doc {
        Ok(doc) => crate::json(axum::http::StatusCode::OK, &doc),
        Err(e) => crate::ApiError::internal(format!("openapi document: {e}")).into_response(),
    }
}
