//! The generated OpenAPI documents (C3-extensions E-16, DL-150..DL-159).
//!
//! `docs/api/<service>.json` is each service's document exactly as its code generates it.
//! When a test here says a document is stale, regenerate them all with
//! `DLOCK_UPDATE_API_DOCS=1 cargo test -p dlock --test openapi_docs` and commit the result.

use std::collections::BTreeSet;
use std::path::PathBuf;

use dlock_contract::auth::{RouteRule, HEALTH_ROUTES, LOCK_SERVER_ROUTES, PAYMENT_ROUTES, RAIL_PROXY_ROUTES};
use dlock_http::openapi::{operations, DocError, DOCUMENT_PATH};
use utoipa::openapi::OpenApi;

/// The command that rewrites `docs/api/`.
const REGENERATE: &str = "DLOCK_UPDATE_API_DOCS=1 cargo test -p dlock --test openapi_docs";

struct Service {
    name: &'static str,
    doc: fn() -> Result<OpenApi, DocError>,
    /// The file whose `.route(...)` calls build the service's router.
    router_source: &'static str,
    roles: Option<&'static [RouteRule]>,
}

fn services() -> Vec<Service> {
    vec![
        Service {
            name: "lock-server",
            doc: dlock_lock_server::openapi::document,
            router_source: include_str!("../../dlock-lock-server/src/app.rs"),
            roles: Some(LOCK_SERVER_ROUTES),
        },
        Service {
            name: "payment-resource",
            doc: dlock_payment_resource::openapi::document,
            router_source: include_str!("../../dlock-payment-resource/src/app.rs"),
            roles: Some(PAYMENT_ROUTES),
        },
        Service {
            name: "rail-proxy",
            doc: dlock_rail_proxy::openapi::document,
            router_source: include_str!("../../dlock-rail-proxy/src/app.rs"),
            roles: Some(RAIL_PROXY_ROUTES),
        },
        Service {
            name: "rail-stub",
            doc: dlock_rail_stub::openapi::document,
            router_source: include_str!("../../dlock-rail-stub/src/lib.rs"),
            roles: None,
        },
        Service {
            name: "executor",
            doc: dlock_executor::openapi::document,
            router_source: include_str!("../../dlock-executor/src/lib.rs"),
            roles: Some(&[]),
        },
    ]
}

fn docs_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/api")
}

/// The committed form of a document: pretty JSON and a final newline.
fn render(doc: &OpenApi) -> String {
    let mut text = serde_json::to_string_pretty(doc).expect("a document serializes");
    text.push('\n');
    text
}

fn document(s: &Service) -> OpenApi {
    (s.doc)().unwrap_or_else(|e| panic!("{}: {e}", s.name))
}

/// `{anything}` → `{}`: the router and the document may name a path parameter differently.
fn shape(path: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in path.chars() {
        match c {
            '{' => {
                depth += 1;
                out.push('{');
            }
            '}' => {
                depth -= 1;
                out.push('}');
            }
            _ if depth > 0 => {}
            _ => out.push(c),
        }
    }
    out
}

/// Every `(METHOD, path shape)` a router source registers: each `.route("PATH", get(..).post(..))`,
/// the document route included (`DOCUMENT_PATH`).
fn routed(source: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for chunk in source.split(".route(").skip(1) {
        let (path, rest) = if let Some(rest) = chunk.strip_prefix("dlock_http::openapi::DOCUMENT_PATH,") {
            (DOCUMENT_PATH.to_owned(), rest)
        } else {
            let Some(rest) = chunk.strip_prefix('"') else { continue };
            let Some(end) = rest.find('"') else { continue };
            (rest[..end].to_owned(), &rest[end..])
        };
        // The method calls up to the end of this `.route(...)` call.
        let mut depth = 1usize;
        let mut call = String::new();
        for c in rest.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                break;
            }
            call.push(c);
        }
        for (name, method) in
            [("get(", "GET"), ("post(", "POST"), ("delete(", "DELETE"), ("put(", "PUT"), ("patch(", "PATCH")]
        {
            let found = call
                .match_indices(name)
                .any(|(i, _)| i == 0 || !call[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_'));
            if found {
                out.insert((method.to_owned(), shape(&path)));
            }
        }
    }
    out
}

#[test]
fn committed_api_documents_are_the_generated_ones() {
    let update = std::env::var("DLOCK_UPDATE_API_DOCS").is_ok_and(|v| v == "1");
    let mut stale = Vec::new();
    for s in services() {
        let text = render(&document(&s));
        let file = docs_dir().join(format!("{}.json", s.name));
        if update {
            std::fs::write(&file, &text).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
            continue;
        }
        let committed = std::fs::read_to_string(&file).unwrap_or_default();
        if committed != text {
            stale.push(s.name);
        }
    }
    assert!(stale.is_empty(), "docs/api/ is stale for {stale:?}; regenerate with `{REGENERATE}` and commit it");
}

#[test]
fn every_routed_endpoint_is_documented_and_every_documented_one_is_routed() {
    for s in services() {
        let routed = routed(s.router_source);
        assert!(routed.len() >= 4, "{}: found only {routed:?} in its router source", s.name);
        let documented: BTreeSet<(String, String)> =
            operations(&document(&s)).into_iter().map(|(m, p)| (m, shape(&p))).collect();
        let missing: Vec<_> = routed.difference(&documented).collect();
        let extra: Vec<_> = documented.difference(&routed).collect();
        assert!(missing.is_empty(), "{}: routed but not documented: {missing:?}", s.name);
        assert!(extra.is_empty(), "{}: documented but not routed: {extra:?}", s.name);
    }
}

#[test]
fn documented_security_follows_the_role_tables() {
    for s in services() {
        let doc = document(&s);
        let json = serde_json::to_value(&doc).expect("serialize");
        let Some(table) = s.roles else {
            assert!(json["components"]["securitySchemes"].is_null(), "{}: the stub never authenticates", s.name);
            continue;
        };
        for rule in HEALTH_ROUTES.iter().chain(table) {
            let op = &json["paths"][rule.pattern][rule.method.to_ascii_lowercase()];
            assert!(
                op.is_object(),
                "{}: {} {} is in the role table but not documented",
                s.name,
                rule.method,
                rule.pattern
            );
        }
        for (method, path) in operations(&doc) {
            let op = &json["paths"][&path][method.to_ascii_lowercase()];
            let need = dlock_contract::auth::need_for(table, &method, &path);
            let security = &op["security"];
            let codes: Vec<&str> =
                op["responses"].as_object().map(|r| r.keys().map(String::as_str).collect()).unwrap_or_default();
            match need {
                dlock_contract::auth::Need::Open => {
                    assert!(security.is_null(), "{}: {method} {path} is open", s.name);
                    assert!(!codes.contains(&"401"), "{}: {method} {path} is open", s.name);
                }
                dlock_contract::auth::Need::Read => {
                    assert_eq!(security, &serde_json::json!([{ "bearer": [] }]), "{}: {method} {path}", s.name);
                    assert!(codes.contains(&"401"), "{}: {method} {path}", s.name);
                }
                dlock_contract::auth::Need::Role(r) => {
                    assert_eq!(
                        security,
                        &serde_json::json!([{ "bearer": [r.as_str()] }]),
                        "{}: {method} {path}",
                        s.name
                    );
                    assert!(codes.contains(&"401") && codes.contains(&"403"), "{}: {method} {path}", s.name);
                }
                dlock_contract::auth::Need::Nobody => {
                    panic!("{}: {method} {path} is documented but no role may call it", s.name)
                }
            }
        }
    }
}

#[test]
fn every_error_answer_is_the_envelope_with_an_example_per_code() {
    for s in services() {
        let json = serde_json::to_value(document(&s)).expect("serialize");
        let envelope = &json["components"]["schemas"]["ErrorEnvelope"];
        assert!(envelope["required"].as_array().is_some_and(|r| r.len() >= 4), "{}: {envelope}", s.name);
        for (path, item) in json["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("path item") {
                for (status, resp) in op["responses"].as_object().expect("responses") {
                    let status: u16 = status.parse().expect("numeric status");
                    let content = &resp["content"]["application/json"];
                    if status < 400 {
                        continue;
                    }
                    let schema = &content["schema"]["allOf"];
                    assert_eq!(
                        schema[0]["$ref"], "#/components/schemas/ErrorEnvelope",
                        "{}: {method} {path} {status}",
                        s.name
                    );
                    let codes = schema[1]["properties"]["code"]["enum"].as_array().expect("narrowed code");
                    for code in codes {
                        let code = code.as_str().expect("code");
                        let example = &content["examples"][code]["value"];
                        assert_eq!(example["code"], code, "{}: {method} {path} {status}", s.name);
                        let spec =
                            dlock_contract::ErrorCode::ALL.iter().find(|c| c.as_str() == code).expect("catalogue code");
                        assert_eq!(example["retrySafe"], spec.retry_safe(), "{code}");
                    }
                    // Every route can answer the transport codes.
                    if status == 500 {
                        assert!(codes.iter().any(|c| c == "INTERNAL"));
                    }
                }
                assert!(
                    op["responses"]["400"].is_object() && op["responses"]["500"].is_object(),
                    "{}: {method} {path}",
                    s.name
                );
            }
        }
    }
}

#[test]
fn the_router_scan_sees_every_method_of_a_route() {
    let src = r#".route("/a/{id}", get(x).delete(y)) .route(dlock_http::openapi::DOCUMENT_PATH, get(z)) .route("/b", post(budget))"#;
    let got: Vec<_> = routed(src).into_iter().collect();
    let want = [("DELETE", "/a/{}"), ("GET", "/a/{}"), ("GET", DOCUMENT_PATH), ("POST", "/b")];
    assert_eq!(got, want.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect::<Vec<_>>());
}

fn repo_file(path: &str) -> String {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()))
}

/// The problems of the API conformance stage: `test.sh` must run `check-api.sh` with the
/// release binary and the pinned schemathesis, the pins must be exact, and `check-api.sh`
/// must fuzz every service with its own document under the four checks.
fn api_stage_problems(test_sh: &str, check_api: &str, requirements: &str) -> Vec<String> {
    let mut out = Vec::new();
    if !test_sh.contains(r#"run_stage "API conformance" api_conformance"#) {
        out.push("scripts/test.sh has no \"API conformance\" stage".to_owned());
    }
    if !test_sh.contains(r#"scripts/check-api.sh "$ROOT/target/release/dlock""#)
        || !test_sh.contains("-r deploy/api-check-requirements.txt")
    {
        out.push("the stage does not run check-api.sh on the release binary with the pinned schemathesis".to_owned());
    }
    let pins: Vec<&str> = requirements.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).collect();
    if !pins.iter().any(|l| l.starts_with("schemathesis==")) {
        out.push("schemathesis is not pinned".to_owned());
    }
    for l in pins.iter().filter(|l| !l.contains("==")) {
        out.push(format!("unpinned requirement {l:?}"));
    }
    for check in
        ["not_a_server_error", "status_code_conformance", "content_type_conformance", "response_schema_conformance"]
    {
        if !check_api.contains(check) {
            out.push(format!("check-api.sh does not run {check}"));
        }
    }
    if !check_api.contains("scripts/check-api-flow.py") {
        out.push("check-api.sh does not walk the success paths (scripts/check-api-flow.py)".to_owned());
    }
    for s in services() {
        if !check_api.contains(&format!("fuzz {} ", s.name)) || !check_api.contains(r#"served "$1" "$2""#) {
            out.push(format!("check-api.sh does not fuzz {} with its served document", s.name));
        }
    }
    out
}

#[test]
fn ci_runs_schemathesis_against_every_service_with_its_own_document() {
    let (t, c, r) = (
        repo_file("scripts/test.sh"),
        repo_file("scripts/check-api.sh"),
        repo_file("deploy/api-check-requirements.txt"),
    );
    assert_eq!(api_stage_problems(&t, &c, &r), Vec::<String>::new());
}

#[test]
fn a_missing_api_stage_an_unpinned_tool_or_an_unfuzzed_service_is_reported() {
    let (t, c, r) = (
        repo_file("scripts/test.sh"),
        repo_file("scripts/check-api.sh"),
        repo_file("deploy/api-check-requirements.txt"),
    );
    let no_stage = t.replace(r#"run_stage "API conformance" api_conformance"#, "");
    assert!(api_stage_problems(&no_stage, &c, &r).iter().any(|p| p.contains("no \"API conformance\"")));
    let unpinned = r.replace("schemathesis==", "schemathesis>=");
    assert!(api_stage_problems(&t, &c, &unpinned).iter().any(|p| p.contains("pinned") || p.contains("unpinned")));
    let no_proxy = c.replace("fuzz rail-proxy ", "true ");
    assert!(api_stage_problems(&t, &no_proxy, &r).iter().any(|p| p.contains("rail-proxy")));
    let no_walk = c.replace("scripts/check-api-flow.py", "true");
    assert!(api_stage_problems(&t, &no_walk, &r).iter().any(|p| p.contains("success paths")));
    let no_schema_check = c.replace("response_schema_conformance", "");
    assert!(api_stage_problems(&t, &no_schema_check, &r).iter().any(|p| p.contains("response_schema_conformance")));
}

#[test]
fn an_operation_without_error_rows_or_rows_without_an_operation_are_refused() {
    use dlock_http::openapi::{complete, errors, RouteErrors, ServiceDoc};
    use utoipa::openapi::path::{HttpMethod, Operation, PathItem, PathsBuilder};
    let raw = || {
        utoipa::openapi::OpenApiBuilder::new()
            .paths(PathsBuilder::new().path("/v1/locks/{key}", PathItem::new(HttpMethod::Get, Operation::new())))
            .build()
    };
    const NONE: &[RouteErrors] = &[];
    let err = complete(raw(), &ServiceDoc { roles: Some(LOCK_SERVER_ROUTES), errors: NONE }).err().expect("refused");
    assert_eq!(err, DocError::NoErrorRow("GET /v1/locks/{key}".to_owned()));
    const EXTRA: &[RouteErrors] = &[errors("GET", "/v1/locks/{key}", &[]), errors("GET", "/v1/nowhere", &[])];
    let err = complete(raw(), &ServiceDoc { roles: Some(LOCK_SERVER_ROUTES), errors: EXTRA }).err().expect("refused");
    assert_eq!(err, DocError::NoOperation("GET /v1/nowhere".to_owned()));
    const EXACT: &[RouteErrors] = &[errors("GET", "/v1/locks/{key}", &[])];
    let doc = complete(raw(), &ServiceDoc { roles: Some(LOCK_SERVER_ROUTES), errors: EXACT }).expect("complete");
    let json = serde_json::to_value(doc).expect("json");
    assert_eq!(json["paths"]["/v1/locks/{key}"]["get"]["security"], serde_json::json!([{ "bearer": [] }]));
}
