//! Prometheus text exposition for counters with closed tag-value sets.
//!
//! Counters are plain atomics indexed by an enum, so a tag value outside the contract's
//! set cannot be expressed, and a payout id can never become a tag (NFR-09).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// A counter family with one closed label.
#[derive(Debug)]
pub struct LabeledCounter<const N: usize> {
    name: &'static str,
    help: &'static str,
    label: &'static str,
    values: [&'static str; N],
    counts: [AtomicU64; N],
}

impl<const N: usize> LabeledCounter<N> {
    pub fn new(name: &'static str, help: &'static str, label: &'static str, values: [&'static str; N]) -> Self {
        LabeledCounter { name, help, label, values, counts: std::array::from_fn(|_| AtomicU64::new(0)) }
    }

    /// Adds one to the series whose label value is `values[index]`.
    pub fn inc(&self, index: usize) {
        if let Some(c) = self.counts.get(index) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn get(&self, index: usize) -> u64 {
        self.counts.get(index).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    pub fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} counter", self.name);
        for (v, c) in self.values.iter().zip(&self.counts) {
            let _ = writeln!(out, "{}{{{}=\"{}\"}} {}", self.name, self.label, v, c.load(Ordering::Relaxed));
        }
    }
}

/// A counter without labels.
#[derive(Debug)]
pub struct Counter {
    name: &'static str,
    help: &'static str,
    count: AtomicU64,
}

impl Counter {
    pub fn new(name: &'static str, help: &'static str) -> Self {
        Counter { name, help, count: AtomicU64::new(0) }
    }

    pub fn inc(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} counter", self.name);
        let _ = writeln!(out, "{} {}", self.name, self.count.load(Ordering::Relaxed));
    }
}

/// A gauge without labels.
#[derive(Debug)]
pub struct Gauge {
    name: &'static str,
    help: &'static str,
    value: std::sync::atomic::AtomicI64,
}

impl Gauge {
    pub fn new(name: &'static str, help: &'static str) -> Self {
        Gauge { name, help, value: std::sync::atomic::AtomicI64::new(0) }
    }

    pub fn add(&self, delta: i64) {
        self.value.fetch_add(delta, Ordering::Relaxed);
    }

    pub fn get(&self) -> i64 {
        self.value.load(Ordering::Relaxed)
    }

    pub fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} gauge", self.name);
        let _ = writeln!(out, "{} {}", self.name, self.value.load(Ordering::Relaxed));
    }
}

/// `Content-Type` of the Prometheus text format.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Wraps rendered text as a `/metrics` response.
pub fn response(text: String) -> axum::response::Response {
    let mut resp = axum::response::Response::new(axum::body::Body::from(text));
    resp.headers_mut()
        .insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static(PROMETHEUS_CONTENT_TYPE));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labeled_counter_renders_every_pinned_value_even_at_zero() {
        let c = LabeledCounter::new("x_total", "help", "outcome", ["a", "b"]);
        c.inc(1);
        c.inc(1);
        c.inc(9);
        let mut out = String::new();
        c.render(&mut out);
        assert!(out.contains("x_total{outcome=\"a\"} 0\n"));
        assert!(out.contains("x_total{outcome=\"b\"} 2\n"));
    }
}
