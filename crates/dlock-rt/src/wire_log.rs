//! The simulation's record of the writes clients sent and the answers they got, on the wire.
//!
//! The oracle judges answers against the stores: an answer marked `retrySafe: true` must
//! have left no trace, and an idempotent write's answer must be the bytes its record holds.
//! Both need what the *caller* received, which no store knows. `HttpClient::send`
//! ([`crate::http`]), the one door every typed client (payment, rail, lock) goes through,
//! records each `POST` here: the request (path, headers, body) when it starts, and its fate
//! (a complete answer's status and body bytes, or a failure) when it ends.
//!
//! Invariants:
//! - Outside `cfg(madsim)` nothing is recorded and nothing is kept: [`begin`] returns `None`
//!   and [`snapshot`] is empty. Production pays one branch per request.
//! - Under `cfg(madsim)` the record is per thread (one madsim runtime, one seed, per
//!   thread) and off until [`enable`] (which also forgets what an earlier seed left).
//! - Every recorded step takes the next value of one counter ([`seq`]): the order of sends,
//!   answers and anything else that reads [`seq`] on the same thread (a store's commit seen
//!   by the oracle) is the order in which they happened.
//! - At most [`EXCHANGES_MAX`] exchanges are kept per seed; past it nothing more is
//!   recorded and [`overflowed`] says so (a check over the record must then say it is
//!   partial, never pass silently).
//! - A request whose future is dropped before it ends (its caller gave up, its node was
//!   killed) keeps `fate: None`: its outcome is unknown, never "answered".

/// Most exchanges one seed records.
pub const EXCHANGES_MAX: usize = 200_000;

/// How a recorded request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// A complete answer arrived.
    Answered { status: u16, body: Vec<u8> },
    /// The request failed; `nothing_sent` when provably not a byte left the caller.
    Failed { nothing_sent: bool },
}

/// One recorded write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    /// [`seq`] when the request started.
    pub seq_sent: u64,
    /// [`seq`] when it ended (`None`: it never did).
    pub seq_done: Option<u64>,
    /// `host:port` it was sent to.
    pub authority: String,
    pub method: String,
    pub path: String,
    /// The headers the caller set (names lower-cased).
    pub headers: Vec<(String, String)>,
    pub request: Vec<u8>,
    pub fate: Option<Fate>,
}

impl Exchange {
    /// The value of header `name` (lower-case), if the caller set it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

#[cfg(madsim)]
#[derive(Default)]
struct Log {
    enabled: bool,
    seq: u64,
    exchanges: Vec<Exchange>,
    overflowed: bool,
}

#[cfg(madsim)]
thread_local! {
    static LOG: std::cell::RefCell<Log> = std::cell::RefCell::new(Log::default());
}

/// Starts recording on this thread, forgetting anything recorded before (simulation only).
pub fn enable() {
    #[cfg(madsim)]
    LOG.with(|l| *l.borrow_mut() = Log { enabled: true, ..Log::default() });
}

/// Stops recording and forgets everything (simulation only).
pub fn reset() {
    #[cfg(madsim)]
    LOG.with(|l| *l.borrow_mut() = Log::default());
}

/// Takes the next value of this thread's counter (0 outside the simulation or when off).
pub fn seq() -> u64 {
    #[cfg(madsim)]
    return LOG.with(|l| {
        let mut l = l.borrow_mut();
        l.seq += 1;
        l.seq
    });
    #[cfg(not(madsim))]
    0
}

/// Records the start of a request; the index to [`finish`] it with (`None` when not
/// recording).
pub fn begin(authority: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Option<usize> {
    #[cfg(madsim)]
    return LOG.with(|l| {
        let mut l = l.borrow_mut();
        if !l.enabled {
            return None;
        }
        if l.exchanges.len() >= EXCHANGES_MAX {
            l.overflowed = true;
            return None;
        }
        l.seq += 1;
        let seq_sent = l.seq;
        l.exchanges.push(Exchange {
            seq_sent,
            seq_done: None,
            authority: authority.to_owned(),
            method: method.to_owned(),
            path: path.to_owned(),
            headers: headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), (*v).to_owned())).collect(),
            request: body.to_vec(),
            fate: None,
        });
        Some(l.exchanges.len() - 1)
    });
    #[cfg(not(madsim))]
    {
        let _ = (authority, method, path, headers, body);
        None
    }
}

/// Records how the request of `index` ended.
pub fn finish(index: Option<usize>, fate: Fate) {
    #[cfg(madsim)]
    if let Some(i) = index {
        LOG.with(|l| {
            let mut l = l.borrow_mut();
            l.seq += 1;
            let seq = l.seq;
            if let Some(e) = l.exchanges.get_mut(i) {
                e.seq_done = Some(seq);
                e.fate = Some(fate);
            }
        });
    }
    #[cfg(not(madsim))]
    let _ = (index, fate);
}

/// Everything recorded on this thread since [`enable`] (empty outside the simulation).
pub fn snapshot() -> Vec<Exchange> {
    #[cfg(madsim)]
    return LOG.with(|l| l.borrow().exchanges.clone());
    #[cfg(not(madsim))]
    Vec::new()
}

/// Whether [`EXCHANGES_MAX`] was reached and later requests went unrecorded.
pub fn overflowed() -> bool {
    #[cfg(madsim)]
    return LOG.with(|l| l.borrow().overflowed);
    #[cfg(not(madsim))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(madsim)]
    #[test]
    fn a_request_is_recorded_with_its_fate_in_sequence_once_enabled() {
        reset();
        assert_eq!(begin("a:1", "POST", "/x", &[], b"{}"), None, "off until enabled");
        enable();
        let i = begin("a:1", "POST", "/x", &[("X-Fencing-Token", "7")], b"{}");
        let mid = seq();
        finish(i, Fate::Answered { status: 503, body: b"e".to_vec() });
        let j = begin("a:1", "POST", "/y", &[], b"");
        let log = snapshot();
        assert_eq!(log.len(), 2);
        assert!(log[0].seq_sent < mid && log[0].seq_done.is_some_and(|d| d > mid));
        assert_eq!(log[0].header("x-fencing-token"), Some("7"));
        assert_eq!(log[0].fate, Some(Fate::Answered { status: 503, body: b"e".to_vec() }));
        assert_eq!((j, &log[1].fate), (Some(1), &None), "a request that never ended keeps no fate");
        enable();
        assert!(snapshot().is_empty() && !overflowed());
        reset();
    }

    #[cfg(not(madsim))]
    #[test]
    fn outside_the_simulation_nothing_is_recorded() {
        enable();
        assert_eq!(begin("a:1", "POST", "/x", &[], b"{}"), None);
        assert!(snapshot().is_empty());
        assert_eq!(seq(), 0);
    }
}
