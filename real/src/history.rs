//! One history from many processes: every dlock process appends its protocol events to its
//! own trace file (`--trace-file`, one line per event, on the host's monotonic clock), and
//! the run adds its own lines (the nemesis's faults, the workload's phases) in the same
//! schema. [`read_dir`] reads them all and [`merge`] orders them into one history by that
//! clock, which no fault touches (libfaketime runs with `FAKETIME_DONT_FAKE_MONOTONIC=1`;
//! SIGSTOP and SIGKILL stop a process, not the host's clock).
//!
//! Invariants: the merged history is sorted by `(mono_ms, process, seq)`; its `seq` is
//! renumbered 0, 1, 2, … and its `t_ms` counts from the first line; a line that does not
//! parse (the last line of a process killed mid-write) is counted, never guessed at; each
//! line's `node` is the process that wrote it.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use dlock_rt::events::{self, Fields, LineHead};
use serde_json::Value;

/// One event of one process.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// The process that wrote it (its trace file's name).
    pub process: String,
    pub seq: u64,
    pub mono_ms: u64,
    pub wall_ms: i64,
    pub kind: String,
    pub fields: Fields,
}

/// Field names as `&'static str`, as [`Fields`] keys them: each distinct name is leaked once
/// (a run has a few dozen).
fn intern(name: &str) -> &'static str {
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut g = match NAMES.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    if let Some(n) = g.get(name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    g.insert(leaked);
    leaked
}

const HEAD: [&str; 6] = events::REQUIRED_FIELDS;

/// Parses one trace line of `process`; `None` when it is not one.
pub fn parse_line(process: &str, text: &str) -> Option<Line> {
    let v: serde_json::Map<String, Value> = serde_json::from_str(text).ok()?;
    let mut fields = Fields::new();
    for (k, val) in &v {
        if !HEAD.contains(&k.as_str()) {
            fields.insert(intern(k), val.clone());
        }
    }
    Some(Line {
        process: process.to_owned(),
        seq: v.get("seq")?.as_u64()?,
        mono_ms: v.get("mono_ms")?.as_u64()?,
        wall_ms: v.get("wall_ms")?.as_i64()?,
        kind: v.get("kind")?.as_str()?.to_owned(),
        fields,
    })
}

/// Every `*.jsonl` of `dir`, each file's lines as its process's (the file's stem), and how
/// many lines did not parse.
pub fn read_dir(dir: &Path) -> (Vec<Line>, u64) {
    let mut out = Vec::new();
    let mut bad = 0;
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_else(|_| Vec::new());
    files.sort();
    for path in files.iter().filter(|p| p.extension().is_some_and(|e| e == "jsonl")) {
        let process = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for l in text.lines().filter(|l| !l.trim().is_empty()) {
            match parse_line(&process, l) {
                Some(line) => out.push(line),
                None => bad += 1,
            }
        }
    }
    (out, bad)
}

/// The lines in history order (module doc).
pub fn merge(mut lines: Vec<Line>) -> Vec<Line> {
    lines.sort_by(|a, b| (a.mono_ms, &a.process, a.seq).cmp(&(b.mono_ms, &b.process, b.seq)));
    lines
}

/// The merged history as incident-trace lines (module doc), for the timeline.
pub fn render(history: &[Line]) -> String {
    let origin = history.first().map_or(0, |l| l.mono_ms);
    let mut out = String::new();
    for (i, l) in history.iter().enumerate() {
        let head = LineHead {
            seq: i as u64,
            t_ms: l.mono_ms.saturating_sub(origin),
            node: &l.process,
            mono_ms: l.mono_ms,
            wall_ms: l.wall_ms,
            kind: &l.kind,
        };
        out.push_str(&events::render_line(head, &l.fields));
        out.push('\n');
    }
    out
}

/// The run's own trace file (`nemesis.jsonl`, `run.jsonl`): lines of one `process`, written
/// as they happen, on the same clock.
pub struct Own {
    process: String,
    file: Mutex<(std::fs::File, u64)>,
}

impl Own {
    pub fn create(dir: &Path, process: &str) -> Result<Own, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let path = dir.join(format!("{process}.jsonl"));
        let f = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Own { process: process.to_owned(), file: Mutex::new((f, 0)) })
    }

    /// Appends one line of `kind` with `fields`, stamped with the host's monotonic clock.
    pub fn write(&self, kind: &str, fields: &[(&'static str, Value)]) {
        let mono_ms = now_mono_ms();
        let wall_ms = chrono::Utc::now().timestamp_millis();
        // A field named like a fixed one would be a second key of that name on the line.
        assert!(fields.iter().all(|(k, _)| !HEAD.contains(k)), "a run line's field shadows a fixed field");
        let fields: Fields = fields.iter().cloned().collect();
        let mut g = match self.file.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let head = LineHead { seq: g.1, t_ms: 0, node: &self.process, mono_ms, wall_ms, kind };
        let line = format!("{}\n", events::render_line(head, &fields));
        let _ = g.0.write_all(line.as_bytes());
        g.1 += 1;
    }
}

/// The host's monotonic clock in ms, on the trace lines' scale.
pub fn now_mono_ms() -> u64 {
    events::mono_ms(dlock_rt::Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_several_processes_merge_by_the_host_clock_and_a_cut_line_is_counted() {
        let dir = std::env::temp_dir().join(format!("dlock-real-history-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let a = r#"{"seq":0,"t_ms":0,"node":"lock-server","mono_ms":300,"wall_ms":9,"kind":"grant","key":"k","token":2}
{"seq":1,"t_ms":5,"node":"lock-server","mono_ms":100,"wall_ms":9,"kind":"grant","key":"k","token":1}"#;
        let b = "{\"seq\":0,\"t_ms\":0,\"node\":\"executor-1\",\"mono_ms\":200,\"wall_ms\":-5,\"kind\":\"lease_belief\"}\n{\"seq\":1,\"t_ms";
        let _ = std::fs::write(dir.join("lock-server-1.jsonl"), a);
        let _ = std::fs::write(dir.join("executor-1.jsonl"), b);
        let (lines, bad) = read_dir(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(bad, 1);
        let h = merge(lines);
        let order: Vec<(u64, &str)> = h.iter().map(|l| (l.mono_ms, l.process.as_str())).collect();
        assert_eq!(order, vec![(100, "lock-server-1"), (200, "executor-1"), (300, "lock-server-1")]);
        assert_eq!(h[0].fields.get("token"), Some(&Value::from(1)));
        let text = render(&h);
        assert!(text.starts_with(r#"{"seq":0,"t_ms":0,"node":"lock-server-1","mono_ms":100"#), "{text}");
        assert!(text.lines().nth(2).is_some_and(|l| l.contains(r#""seq":2,"t_ms":200"#)), "{text}");
    }
}
