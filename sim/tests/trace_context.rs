//! W3C trace propagation under the simulation (C3-extensions E-17): the context follows the
//! calling task across madsim's network, every service of a world adopts the caller's
//! trace, and propagation takes no draw from the seeded generator, so a seed schedules
//! what it scheduled before. The OTLP exporter is compiled out here and refused.

#![cfg(madsim)]

use dlock_rt::trace::{TraceContext, TraceSeed, FLAG_SAMPLED};
use dlock_sim::world::{self, WorldSpec};

const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Every service node answers a call made inside a trace with that trace's id in its
/// envelope: the client sent `traceparent` and the server adopted it.
#[madsim::test]
async fn every_world_service_adopts_the_callers_trace_under_the_simulation() {
    let mut w = world::start(WorldSpec::skewed()).await;
    let node = w.add_node("workload");
    let root = TraceContext::root(0x0123_4567_89ab_cdef_0011_2233_4455_6677, FLAG_SAMPLED);
    let services = [
        ("lock-server", world::url(world::LOCK_IP, world::LOCK_PORT)),
        ("payment-resource", world::url(world::PAYMENT_IP, world::PAYMENT_PORT)),
        ("rail-proxy", world::url(world::PROXY_IP, world::PROXY_PORT)),
        ("rail-stub", world::url(world::STUB_IP, world::STUB_PORT)),
    ];
    for (name, base) in services {
        let ctx = root.clone();
        let answers = node.spawn(async move {
            let client = dlock_rt::http::HttpClient::new(1_000, 5_000);
            let call = || async {
                let r = client.send(&base, http::Method::GET, "/v1/no-such-route", &[], None).await;
                r.map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).unwrap_or_default())
                    .map_err(|e| e.to_string())
            };
            let inside = ctx.scope(call()).await;
            (inside, call().await)
        });
        let (inside, outside) = answers.await.expect("the workload task");
        let (inside, outside) =
            (inside.unwrap_or_else(|e| panic!("{name}: {e}")), outside.unwrap_or_else(|e| panic!("{name}: {e}")));
        assert_eq!(inside["traceId"], root.trace_id_hex(), "{name}: {inside}");
        assert_ne!(outside["traceId"], root.trace_id_hex(), "{name}: {outside}");
        assert_eq!(outside["traceId"].as_str().map(str::len), Some(32), "{name}: {outside}");
    }
}

/// The next draw after `f` in a runtime seeded with `seed`.
fn next_draw_after(seed: u64, f: fn()) -> u64 {
    madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default()).block_on(async move {
        f();
        dlock_rt::rand::random_u64()
    })
}

/// A server takes the same two draws whether it adopts a trace or starts one; the
/// executor's trace ids and every child span id take none.
#[test]
fn propagating_a_trace_takes_no_draw_a_server_did_not_already_take() {
    for seed in [1, 7, 42] {
        let adopted = next_draw_after(seed, || {
            let _ = TraceContext::for_request(Some(GOOD));
        });
        let fresh = next_draw_after(seed, || {
            let _ = TraceContext::for_request(None);
        });
        let invalid = next_draw_after(seed, || {
            let _ = TraceContext::for_request(Some("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        });
        let two_draws = next_draw_after(seed, || {
            let _ = (dlock_rt::rand::random_u64(), dlock_rt::rand::random_u64());
        });
        assert_eq!((adopted, fresh, invalid), (two_draws, two_draws, two_draws), "seed {seed}");
        let derived = next_draw_after(seed, || {
            let seed = TraceSeed::new(&[dlock_rt::trace::hash_str("executor-1"), 1_000]);
            let root = seed.next_root();
            let _ = (root.child(), root.child().child(), seed.next_root());
        });
        let nothing = next_draw_after(seed, || {});
        assert_eq!(derived, nothing, "seed {seed}: the executor's ids drew from the generator");
    }
}

#[test]
fn the_otlp_exporter_is_refused_under_the_simulation() {
    let on = dlock_config::telemetry::OtlpSettings {
        enabled: true,
        endpoint: "http://10.0.9.1:4318".into(),
        service_name: None,
    };
    let refused = dlock_rt::otlp::install_process_exporter(&on, "rail-proxy").expect_err("refused");
    assert!(refused.contains("telemetry.otlp.enabled"), "{refused}");
    let off = dlock_config::telemetry::OtlpSettings::default();
    assert_eq!(dlock_rt::otlp::install_process_exporter(&off, "rail-proxy"), Ok(()));
}
