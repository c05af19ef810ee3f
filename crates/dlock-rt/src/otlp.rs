//! The optional OTLP trace exporter (C3-extensions E-17; production only: the simulation
//! compiles it out and refuses `telemetry.otlp.enabled` at start-up).
//!
//! tracing spans reach OpenTelemetry through `tracing-opentelemetry` (a layer installed by
//! [`layer`] when logging starts, empty until [`install_process_exporter`] fills it). The
//! SDK hands each ended span to [`QueueProcessor`], which only pushes it onto a bounded
//! queue; a task of this runtime drains the queue every [`OTLP_EXPORT_INTERVAL_MS`] (or as
//! soon as a batch is full) and posts OTLP/HTTP JSON to `<endpoint>/v1/traces` through
//! [`crate::http::HttpClient`] (no other socket, no credential).
//!
//! Ids: the exported trace, span and parent ids are the ones the wire carries (the
//! `traceId` / `spanId` / `parentSpanId` fields of the spans [`crate::trace`] makes), so
//! a collector joins the spans of every service into one tree. Spans without them (none
//! of dlock's own) are not exported.
//!
//! Invariants: a request never waits on the collector: [`QueueProcessor::on_end`] takes a
//! short lock and never blocks; the queue holds at most [`OTLP_QUEUE_SPANS_MAX`] spans (the
//! rest are dropped and counted); one post waits at most [`OTLP_CONNECT_TIMEOUT_MS`] +
//! [`OTLP_READ_TIMEOUT_MS`]; a failed batch is dropped, never retried, so a down collector
//! costs one failed post per interval and nothing else.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{IdGenerator, SdkTracer, SdkTracerProvider, SpanData, SpanProcessor};
use serde_json::{json, Value};
use tracing_subscriber::{reload, Registry};

use crate::http::{BaseUrl, HttpClient};

/// Most spans waiting for export; past it new spans are dropped.
pub const OTLP_QUEUE_SPANS_MAX: usize = 4_096;
/// Most spans in one post.
pub const OTLP_BATCH_SPANS_MAX: usize = 512;
/// Longest a span waits in the queue before a post is tried.
pub const OTLP_EXPORT_INTERVAL_MS: u64 = 1_000;
/// Connect budget of one post.
pub const OTLP_CONNECT_TIMEOUT_MS: u64 = 500;
/// Answer budget of one post.
pub const OTLP_READ_TIMEOUT_MS: u64 = 2_000;
/// The path the spans are posted to, under the endpoint (OTLP/HTTP).
pub const OTLP_TRACES_PATH: &str = "/v1/traces";

/// The tracing layer that feeds OpenTelemetry.
pub type OtelLayer = tracing_opentelemetry::OpenTelemetryLayer<Registry, SdkTracer>;
/// [`OtelLayer`], switchable after logging started.
pub type ReloadLayer = reload::Layer<Option<OtelLayer>, Registry>;

static HANDLE: OnceLock<reload::Handle<Option<OtelLayer>, Registry>> = OnceLock::new();
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The (empty) exporter layer, to put first on the registry when logging starts.
pub fn layer() -> ReloadLayer {
    let (layer, handle) = reload::Layer::new(None);
    let _ = HANDLE.set(handle);
    layer
}

/// Starts exporting this process's spans to `settings.endpoint`, as `service_name`
/// (unless `settings.service_name` names another). Call inside the runtime, once, after
/// [`layer`]; `enabled = false` does nothing.
pub fn install_process_exporter(
    settings: &dlock_config::telemetry::OtlpSettings,
    service_name: &str,
) -> Result<(), String> {
    if !settings.enabled {
        return Ok(());
    }
    let key = dlock_config::telemetry::OTLP_ENDPOINT_KEY;
    let base = BaseUrl::parse(&settings.endpoint).map_err(|e| format!("{key}: {e}"))?;
    let mut client = HttpClient::new(OTLP_CONNECT_TIMEOUT_MS, OTLP_READ_TIMEOUT_MS).without_bearer();
    if !base.tls {
        client = client.with_tls(None);
    } else if crate::tls::process_tls().is_none() {
        return Err(format!("{key}: https:// needs tls.enabled (its CAs)"));
    }
    let name = settings.service_name.clone().unwrap_or_else(|| service_name.to_owned());
    let handle = HANDLE.get().ok_or("the OTLP layer was not installed when logging started")?;
    let processor = QueueProcessor::default();
    let queue = processor.shared.clone();
    let provider = SdkTracerProvider::builder()
        .with_id_generator(RtIds)
        .with_sampler(opentelemetry_sdk::trace::Sampler::AlwaysOn)
        .with_span_processor(processor)
        .build();
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer("dlock"));
    if PROVIDER.set(provider).is_err() {
        return Err("the OTLP exporter is already installed".to_owned());
    }
    handle.reload(Some(otel)).map_err(|e| format!("OTLP layer: {e}"))?;
    crate::spawn(export_loop(queue, client, base, name));
    Ok(())
}

/// Ids for spans the SDK makes itself (not the exported ones): from the runtime.
#[derive(Debug)]
struct RtIds;

impl IdGenerator for RtIds {
    fn new_trace_id(&self) -> opentelemetry::TraceId {
        let (hi, lo) = (crate::rand::random_u64(), crate::rand::random_u64());
        opentelemetry::TraceId::from(((u128::from(hi) << 64) | u128::from(lo)).max(1))
    }

    fn new_span_id(&self) -> opentelemetry::SpanId {
        opentelemetry::SpanId::from(crate::rand::random_u64().max(1))
    }
}

/// The queue between the SDK and the export task.
#[derive(Debug, Default)]
struct Shared {
    spans: Mutex<VecDeque<SpanData>>,
    wake: tokio::sync::Notify,
    dropped: AtomicU64,
}

/// See the module documentation.
#[derive(Debug, Default)]
struct QueueProcessor {
    shared: Arc<Shared>,
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        let Ok(mut q) = self.shared.spans.lock() else { return };
        if q.len() >= OTLP_QUEUE_SPANS_MAX {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        q.push_back(span);
        assert!(q.len() <= OTLP_QUEUE_SPANS_MAX, "E-17: the OTLP queue is bounded");
        if q.len() >= OTLP_BATCH_SPANS_MAX {
            self.shared.wake.notify_one();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.shared.wake.notify_one();
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

async fn export_loop(shared: Arc<Shared>, client: HttpClient, base: BaseUrl, service_name: String) {
    let mut failing = false;
    loop {
        tokio::select! {
            () = crate::sleep(Duration::from_millis(OTLP_EXPORT_INTERVAL_MS)) => {}
            () = shared.wake.notified() => {}
        }
        loop {
            let batch: Vec<SpanData> = match shared.spans.lock() {
                Ok(mut q) => {
                    let n = q.len().min(OTLP_BATCH_SPANS_MAX);
                    q.drain(..n).collect()
                }
                Err(_) => return,
            };
            if batch.is_empty() {
                break;
            }
            let body = Some(bytes::Bytes::from(export_request(&service_name, &batch).to_string()));
            let headers = [("content-type", "application/json")];
            let cause = match client.send(&base, http::Method::POST, OTLP_TRACES_PATH, &headers, body).await {
                Ok(r) if (200..300).contains(&r.status) => None,
                Ok(r) => Some(format!("HTTP {}", r.status)),
                Err(e) => Some(e.to_string()),
            };
            match cause {
                // Logged once per outage, not once per batch.
                Some(cause) if !failing => {
                    failing = true;
                    tracing::warn!(endpoint = %base.url(), cause, "otlp_export_failed");
                }
                None if failing => {
                    failing = false;
                    tracing::info!(endpoint = %base.url(), "otlp_export_resumed");
                }
                _ => {}
            }
            let dropped = shared.dropped.swap(0, Ordering::Relaxed);
            if dropped > 0 {
                tracing::warn!(dropped, "otlp_spans_dropped");
            }
            if failing {
                break;
            }
        }
    }
}

fn unix_nanos(t: SystemTime) -> String {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()).to_string()
}

fn attr_str(span: &SpanData, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.as_str().into_owned())
}

fn attr_value(v: &opentelemetry::Value) -> Value {
    match v {
        opentelemetry::Value::Bool(b) => json!({ "boolValue": b }),
        opentelemetry::Value::I64(i) => json!({ "intValue": i.to_string() }),
        opentelemetry::Value::F64(f) => json!({ "doubleValue": f }),
        other => json!({ "stringValue": other.as_str() }),
    }
}

/// One span in OTLP JSON, with the wire's ids; `None` for a span that carries none.
fn span_json(span: &SpanData) -> Option<Value> {
    let trace_id = attr_str(span, "traceId").filter(|t| t.len() == 32)?;
    let span_id = attr_str(span, "spanId").filter(|s| s.len() == 16)?;
    let parent = attr_str(span, "parentSpanId").unwrap_or_default();
    let kind = match span.span_kind {
        opentelemetry::trace::SpanKind::Server => 2,
        opentelemetry::trace::SpanKind::Client => 3,
        opentelemetry::trace::SpanKind::Producer => 4,
        opentelemetry::trace::SpanKind::Consumer => 5,
        opentelemetry::trace::SpanKind::Internal => 1,
    };
    let attributes: Vec<Value> = span
        .attributes
        .iter()
        .filter(|kv| !matches!(kv.key.as_str(), "traceId" | "spanId" | "parentSpanId"))
        .map(|kv| json!({ "key": kv.key.as_str(), "value": attr_value(&kv.value) }))
        .collect();
    let status = match &span.status {
        opentelemetry::trace::Status::Error { description } => json!({ "code": 2, "message": description }),
        opentelemetry::trace::Status::Ok => json!({ "code": 1 }),
        opentelemetry::trace::Status::Unset => json!({}),
    };
    Some(json!({
        "traceId": trace_id,
        "spanId": span_id,
        "parentSpanId": parent,
        "name": span.name,
        "kind": kind,
        "startTimeUnixNano": unix_nanos(span.start_time),
        "endTimeUnixNano": unix_nanos(span.end_time),
        "attributes": attributes,
        "status": status,
    }))
}

/// An OTLP/HTTP JSON `ExportTraceServiceRequest` for `spans` of `service_name`.
fn export_request(service_name: &str, spans: &[SpanData]) -> Value {
    let spans: Vec<Value> = spans.iter().filter_map(span_json).collect();
    json!({
        "resourceSpans": [{
            "resource": { "attributes": [{ "key": "service.name", "value": { "stringValue": service_name } }] },
            "scopeSpans": [{ "scope": { "name": "dlock" }, "spans": spans }],
        }]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(attrs: Vec<opentelemetry::KeyValue>) -> SpanData {
        use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(7_u128),
                SpanId::from(9_u64),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Server,
            name: "GET /x".into(),
            start_time: UNIX_EPOCH + Duration::from_secs(1),
            end_time: UNIX_EPOCH + Duration::from_secs(2),
            attributes: attrs,
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    #[test]
    fn exported_spans_carry_the_wire_ids_and_unmarked_spans_are_left_out() {
        use opentelemetry::KeyValue;
        let ours = data(vec![
            KeyValue::new("traceId", "4bf92f3577b34da6a3ce929d0e0e4736"),
            KeyValue::new("spanId", "00f067aa0ba902b7"),
            KeyValue::new("parentSpanId", "1111111111111111"),
            KeyValue::new("path", "/x"),
        ]);
        let req = export_request("svc", &[ours, data(vec![])]);
        let rs = &req["resourceSpans"][0];
        assert_eq!(rs["resource"]["attributes"][0]["value"]["stringValue"], "svc");
        let spans = rs["scopeSpans"][0]["spans"].as_array().expect("spans");
        assert_eq!(spans.len(), 1);
        let s = &spans[0];
        assert_eq!(s["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(s["spanId"], "00f067aa0ba902b7");
        assert_eq!(s["parentSpanId"], "1111111111111111");
        assert_eq!((s["kind"].as_i64(), s["startTimeUnixNano"].as_str()), (Some(2), Some("1000000000")));
        assert_eq!(s["attributes"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn the_queue_is_bounded_and_counts_what_it_drops() {
        let p = QueueProcessor::default();
        for _ in 0..OTLP_QUEUE_SPANS_MAX + 3 {
            p.on_end(data(vec![]));
        }
        assert_eq!(p.shared.spans.lock().expect("lock").len(), OTLP_QUEUE_SPANS_MAX);
        assert_eq!(p.shared.dropped.load(Ordering::Relaxed), 3);
    }
}
