//! The timeline drawn from real incident traces (tests/fixtures, written by
//! `cargo xtask sim replay --trace`; their README names each command): lanes, leases,
//! pauses, fenced-out writes, fences and marks, rail calls, the broken invariant, tooltips,
//! determinism, and a page that fetches nothing.

use serde_json::Value;

const SWARM_122: &str = include_str!("fixtures/swarm-seed-122.jsonl");
const PAUSE: &str = include_str!("fixtures/pause-during-rail-call-seed-1.jsonl");
const PLANTED: &str = include_str!("fixtures/stale-writer-second-proxy-fencing-off-both-seed-1.jsonl");

fn render(trace: &str) -> String {
    dlock_timeline::render_html(trace).expect("a real trace renders")
}

fn lines_of_kind<'a>(trace: &'a str, kind: &str) -> Vec<(&'a str, serde_json::Map<String, Value>)> {
    trace
        .lines()
        .filter_map(|l| match serde_json::from_str::<Value>(l) {
            Ok(Value::Object(m)) if m.get("kind").and_then(Value::as_str) == Some(kind) => Some((l, m)),
            _ => None,
        })
        .collect()
}

/// The `<g …>` element (its opening tag up to its `</g>`) that carries `attr`.
fn element_with<'a>(html: &'a str, attr: &str) -> &'a str {
    let at = html.find(attr).unwrap_or_else(|| panic!("no element with {attr}"));
    let start = html[..at].rfind("<g ").expect("an element");
    let end = html[at..].find("</g>").expect("closed") + at;
    &html[start..end]
}

/// The text of the lane element `data-lane="name"` (up to the next lane).
fn lane<'a>(html: &'a str, name: &str) -> &'a str {
    let tag = format!(r#"<g class="lane" data-lane="{name}""#);
    let start = html.find(&tag).unwrap_or_else(|| panic!("no lane {name}"));
    let rest = &html[start + tag.len()..];
    let end = rest.find(r#"<g class="lane""#).unwrap_or(rest.len());
    &rest[..end]
}

fn escaped(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

#[test]
fn every_executor_gets_a_lane_with_its_leases_as_the_server_saw_them() {
    let html = render(SWARM_122);
    for n in 1..=5 {
        assert!(html.contains(&format!(r#"data-lane="executor-{n}" data-lane-kind="executor""#)), "executor-{n}");
    }
    assert_eq!(html.matches(r#"data-lane-kind="executor""#).count(), 5);
    let grants = lines_of_kind(SWARM_122, "grant");
    assert_eq!(html.matches(r#"class="ev lease""#).count(), grants.len(), "one lease bar per grant");
    // executor-5's token 17 expired under its pause, and the reaper removed it later.
    let lease = element_with(&html, r#"data-key="payout:acct-3" data-token="17""#);
    assert!(lease.contains(r#"data-end="expired""#), "{lease}");
    assert!(lane(&html, "executor-5").contains(r#"data-token="17""#));
}

#[test]
fn a_lease_ends_at_its_release_or_when_it_expired() {
    let html = render(PAUSE);
    let released = lines_of_kind(PAUSE, "release").len();
    let dropped = lines_of_kind(PAUSE, "drop").len();
    assert!(released > 0 && dropped > 0);
    assert_eq!(html.matches(r#"data-end="released""#).count(), released);
    // Every drop in this trace came after the grant's expiry: drawn as expired, then removed.
    assert_eq!(html.matches(r#"data-end="expired""#).count(), dropped);
}

#[test]
fn a_pause_is_a_hatched_band_in_its_executors_lane() {
    let html = render(PAUSE);
    let lane1 = lane(&html, "executor-1");
    let band = element_with(lane1, r#"data-band="paused""#);
    assert!(band.contains("PAUSED 15.000 s"), "{band}");
    assert!(band.contains("url(#hatch)"));
    // executor-2 was down (crash → start) before it took the key.
    assert!(lane(&html, "executor-2").contains(r#"data-band="down""#));
    assert!(!lane(&html, "executor-2").contains(r#"data-band="paused""#));
}

#[test]
fn every_fenced_out_write_is_drawn_in_its_writers_lane_with_both_tokens() {
    let html = render(SWARM_122);
    let fenced = lines_of_kind(SWARM_122, "fenced_write")
        .into_iter()
        .filter(|(_, m)| m.get("answer").and_then(Value::as_str) == Some("fenced_out"))
        .count();
    assert_eq!(fenced, 1, "the fixture has one fenced-out write");
    assert_eq!(html.matches(r#"class="ev write" data-seq"#).count(), lines_of_kind(SWARM_122, "fenced_write").len());
    let w = element_with(lane(&html, "executor-5"), r#"data-answer="fenced_out""#);
    assert!(w.contains(r#"data-presented="17" data-stored="30""#), "{w}");
    assert!(w.contains("FENCED OUT: claim token 17 ≤ 30"), "{w}");
    assert!(html.contains("1 fenced out"), "the header counts it");
}

#[test]
fn the_account_fence_and_the_rail_mark_are_step_lines_with_each_presented_token() {
    let html = render(SWARM_122);
    for a in 0..=5 {
        let l = lane(&html, &format!("account acct-{a}"));
        assert!(l.contains(r#"data-step="fence""#), "acct-{a} fence");
        assert!(l.contains(r#"data-step="mark""#), "acct-{a} mark");
    }
    // The fenced-out claim is a red dot on acct-3, below its fence line.
    let acct3 = lane(&html, "account acct-3");
    assert!(acct3.contains(r#"data-answer="fenced_out""#));
}

#[test]
fn each_rail_call_and_each_intent_is_drawn_with_its_outcome() {
    let html = render(SWARM_122);
    let calls = lines_of_kind(SWARM_122, "rail_call");
    let intents = lines_of_kind(SWARM_122, "intent_outcome");
    assert!(!calls.is_empty() && !intents.is_empty());
    let rail = lane(&html, "rail");
    assert_eq!(rail.matches(r#"data-kind="rail_call""#).count(), calls.len());
    assert_eq!(rail.matches(r#"data-kind="intent_outcome""#).count(), intents.len());
    assert!(rail.contains(r#"data-outcome="Accepted""#));
}

#[test]
fn faults_are_bands_and_ticks_in_the_fault_lane() {
    let html = render(SWARM_122);
    let faults = lane(&html, "faults");
    assert!(faults.contains(r#"data-band="clogged""#), "the clog payment-1 → rail-stub");
    assert!(faults.contains("payment-1 → rail-stub clogged (3.375 s)"));
    assert!(faults.contains(r#"data-band="store-latency""#));
    assert_eq!(faults.matches(r#"data-kind="store_fault""#).count(), lines_of_kind(SWARM_122, "store_fault").len());
    // Every schedule line is a tick (a band's element carries `data-band` after its kind).
    let ticks = faults.matches(r#"data-kind="schedule"><title>"#).count();
    assert_eq!(ticks, lines_of_kind(SWARM_122, "schedule").len());
}

#[test]
fn the_broken_invariant_is_marked_at_the_write_that_broke_it() {
    let html = render(PLANTED);
    let failures = lines_of_kind(PLANTED, "failure");
    assert_eq!(failures.len(), 2);
    let inv = lane(&html, "invariants");
    assert_eq!(inv.matches(r#"data-invariant="fence_accepts_only_rising_tokens""#).count(), 2);
    // "account acct-0 accepted token 1 at its admission": executor-1's admit of token 1.
    let admit = lines_of_kind(PLANTED, "fenced_write")
        .into_iter()
        .find(|(_, m)| {
            m.get("op").and_then(Value::as_str) == Some("admit")
                && m.get("presented_token").and_then(Value::as_u64) == Some(1)
        })
        .expect("the stale admission");
    let t = admit.1.get("t_ms").and_then(Value::as_u64).expect("t_ms");
    let banner = format!("broke at t = {}.{:03} s", t / 1000, t % 1000);
    assert!(html.contains(&banner), "banner {banner}");
    assert!(!html.contains("found by the end-of-run checks"), "both failures are located");
    assert!(html.contains(r#"class="ev write implicated""#), "the write is highlighted");
    // A clean trace says so.
    assert!(render(PAUSE).contains("no invariant broke"));
}

#[test]
fn hovering_any_mark_shows_its_raw_trace_line() {
    let html = render(SWARM_122);
    let (raw, _) = lines_of_kind(SWARM_122, "fenced_write")
        .into_iter()
        .find(|(_, m)| m.get("answer").and_then(Value::as_str) == Some("fenced_out"))
        .expect("a fenced-out line");
    let w = element_with(lane(&html, "executor-5"), r#"data-answer="fenced_out""#);
    assert!(w.contains(&format!("<title>{}</title>", escaped(raw))), "the write's tooltip is its line");
    // Every mark has a tooltip, and the script fills the panel from it.
    let marks = html.matches(r#"class="ev"#).count();
    assert!(marks > 100);
    assert!(html.contains(r#"<pre id="raw">"#) && html.contains("querySelector('title')"));
}

#[test]
fn the_same_trace_renders_byte_identical_html() {
    for t in [SWARM_122, PAUSE, PLANTED] {
        assert_eq!(render(t), render(t));
    }
    assert_ne!(render(PAUSE), render(SWARM_122));
}

#[test]
fn the_page_fetches_nothing_when_viewed() {
    for t in [SWARM_122, PAUSE, PLANTED] {
        let html = render(t);
        let refs = html.matches("http").count();
        let xmlns = html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count();
        assert_eq!(refs, xmlns, "no address but the SVG namespace");
        for banned in ["<link", "src=", "href=", "@import", "fetch(", "XMLHttpRequest"] {
            assert!(!html.contains(banned), "{banned}");
        }
        assert_eq!(html.matches("url(").count(), html.matches("url(#").count(), "only in-page patterns");
    }
}

#[test]
fn lease_beliefs_are_drawn_when_present_and_absent_ones_leave_no_row() {
    assert!(!render(PAUSE).contains("lease (believed)"), "no belief lines, no belief row");
    // executor-1's belief in token 1: granted with a local deadline, noticed lost when it
    // woke from its pause (the belief kind other helpers add; fields as the lock client emits).
    let belief = |t: u64, dl: u64, source: &str| {
        format!(
            r#"{{"seq":0,"t_ms":{t},"node":"executor-1","mono_ms":{t},"wall_ms":{},"kind":"lease_belief","key":"payout:acct-0","local_deadline_mono_ms":{dl},"owner":"executor-1/0","reason":null,"session":"s","source":"{source}","token":1}}"#,
            1_665_467_001_000 + t
        )
    };
    let mut trace: Vec<String> = PAUSE.lines().map(str::to_owned).collect();
    trace.insert(6, belief(160, 2_260, "granted"));
    let wake = trace.iter().position(|l| l.contains(r#""verb":"resume""#)).expect("resume");
    trace.insert(wake + 1, belief(15_219, 2_260, "lost"));
    let html = render(&trace.join("\n"));
    assert!(html.contains("lease (believed)"));
    let b = element_with(lane(&html, "executor-1"), r#"data-kind="lease_belief""#);
    assert!(b.contains(r#"data-token="1" data-end="lost""#), "{b}");
    assert!(b.contains("lost 12.959 s after its deadline"), "{b}");
}

#[test]
fn a_pause_band_carries_the_schedule_and_the_fault_layer_lines_that_made_it() {
    let html = render(PAUSE);
    let band = element_with(lane(&html, "executor-1"), r#"data-band="paused""#);
    for (raw, m) in lines_of_kind(PAUSE, "schedule").into_iter().chain(lines_of_kind(PAUSE, "fault")) {
        let on_1 = m
            .get("nodes")
            .or_else(|| m.get("a"))
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|n| n == "executor-1"));
        if on_1 {
            assert!(band.contains(&escaped(raw)), "the band's tooltip has {raw}");
        }
    }
}

#[test]
fn the_header_lists_each_fenced_out_write_with_its_tokens() {
    let html = render(SWARM_122);
    assert!(html.contains("FENCED OUT at t = 7.387 s: executor-5/0 claim with token 17 ≤ 30 on acct-3"), "listed");
    assert_eq!(html.matches(r#"class="banner fenced""#).count(), 1);
    assert!(!render(PAUSE).contains(r#"class="banner fenced""#), "none without a fenced-out write");
}
