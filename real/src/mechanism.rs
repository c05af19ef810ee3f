//! The real mechanisms of the fault vocabulary: one arm per [`Fault`] verb, on real
//! processes (docs/real-runs.md "The nemesis"):
//! - `pause` / `resume`: SIGSTOP / SIGCONT of the process;
//! - `crash` / `start`: the process's supervisor is stopped, the process gets SIGKILL; at
//!   `start` the supervisor continues and restarts it (up.sh `--restart-sec 1`);
//! - `partition`, `clog` and their undos: nftables rules in the namespaced executor's own
//!   network namespace, by the peer's address and port: output rules cut the executor's
//!   packets to a peer, input rules the peer's packets to it (a one-way cut from a peer
//!   loses replies: the request was served, its answer never arrives); a lossy link drops
//!   that fraction at random (`numgen random`). The whole table is rewritten at each change;
//! - `skew-clock`: the node's libfaketime timestamp file holds its total offset
//!   (`+S.mmm` seconds), re-read within a second;
//! - `store-fault` `unavailable`: paydb is PostgreSQL paused, lockdb two of the three etcd
//!   members paused (no quorum), for `for-ms`; `leader-loss`: the etcd leader of that
//!   instant crashed for `for-ms`;
//! - `revoke`: the operator's revoke (L8), through `lock-server-1`, of the key the fault
//!   names, or else of the first account lock key (`payout:acct-K`) some executor holds at
//!   that instant (L7 read with the reader credential), as the simulation's world picks one;
//!   credentials are read from header files, never put on a command line;
//! - `heal` (unnamed): every partition, clog and pause undone.
//!
//! Invariants: no mechanism holds the nemesis for long: every call it makes is bounded by
//! [`MECHANISM_CALL_MS_MAX`], and a revoke's search by [`REVOKE_SEARCH_MS_MAX`]; a crashed
//! process is never paused or resumed (only started); at the end of a
//! run [`Nemesis::heal_all`] leaves no fault in place (every pause continued, every crashed
//! process started, the nftables table removed); wall-clock offsets stay (the cluster must
//! settle with its clocks apart).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use dlock_sim::fault::{Fault, StoreFaultKind};

use crate::cluster::Cluster;

/// The nftables table a real run owns inside the namespace.
pub const NFT_TABLE: &str = "dlock_real";

/// Bound on one HTTP call a mechanism makes (an etcd member's status, a lock's L7 read, a
/// revoke): the nemesis plays the plan on one thread, and a mechanism that waits holds
/// every fault after it, the undos of the faults in place included.
pub const MECHANISM_CALL_MS_MAX: u64 = 500;

/// Bound on a revoke's search for a held key (L7 reads, one per account, until one is held):
/// with lockdb down every read waits out its bound, and the search ends here.
pub const REVOKE_SEARCH_MS_MAX: u64 = 2_000;

/// A fault the mechanism closes itself after its `for-ms` (a lossy link, a store fault).
#[derive(Debug, Clone, PartialEq)]
enum Close {
    Unclog { from: String, to: String },
    Resume(Vec<String>),
    Start(String),
}

/// The faults in place, and how to undo them.
pub struct Nemesis<'a> {
    cluster: &'a Cluster,
    /// Paused processes, each with how many faults hold it paused (overlapping pauses and
    /// store faults: the process runs again when the last one ends).
    paused: BTreeMap<String, u32>,
    crashed: BTreeSet<String>,
    partitions: BTreeMap<String, (Vec<String>, Vec<String>, bool)>,
    /// `(from, to)` → loss (`None`: every packet).
    clogs: BTreeMap<(String, String), Option<f64>>,
    skews_ms: BTreeMap<String, i64>,
    closes: Vec<(Instant, Close)>,
    /// The workload's accounts (a revoke looks for a held key among theirs).
    accounts: u32,
}

fn signal(sig: &str, pid: i32) -> Result<(), String> {
    let ok = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status().map_err(|e| e.to_string())?;
    if ok.success() {
        Ok(())
    } else {
        Err(format!("kill -{sig} {pid} failed"))
    }
}

impl<'a> Nemesis<'a> {
    pub fn new(cluster: &'a Cluster, accounts: u32) -> Nemesis<'a> {
        Nemesis {
            cluster,
            paused: BTreeMap::new(),
            crashed: BTreeSet::new(),
            partitions: BTreeMap::new(),
            clogs: BTreeMap::new(),
            skews_ms: BTreeMap::new(),
            closes: Vec::new(),
            accounts,
        }
    }

    fn pid(&self, node: &str) -> Result<i32, String> {
        self.cluster.pid(node).ok_or_else(|| format!("no pid for {node}"))
    }

    fn pause(&mut self, node: &str) -> Result<String, String> {
        if self.crashed.contains(node) {
            return Ok(format!("{node} is down: nothing to pause"));
        }
        let holds = self.paused.entry(node.to_owned()).or_insert(0);
        *holds += 1;
        if *holds > 1 {
            return Ok(format!("{node} already paused ({holds} faults hold it)"));
        }
        let pid = self.pid(node)?;
        signal("STOP", pid)?;
        Ok(format!("SIGSTOP {node} (pid {pid})"))
    }

    fn resume(&mut self, node: &str) -> Result<String, String> {
        match self.paused.get_mut(node) {
            None => return Ok(format!("{node} was not paused")),
            Some(holds) if *holds > 1 => {
                *holds -= 1;
                return Ok(format!("{node} stays paused ({holds} faults hold it)"));
            }
            Some(_) => {
                self.paused.remove(node);
            }
        }
        let pid = self.pid(node)?;
        signal("CONT", pid)?;
        Ok(format!("SIGCONT {node} (pid {pid})"))
    }

    fn crash(&mut self, node: &str) -> Result<String, String> {
        if self.crashed.contains(node) {
            return Ok(format!("{node} is already down"));
        }
        let sup = self.cluster.supervisor(node).ok_or_else(|| format!("no supervisor for {node}"))?;
        let pid = self.pid(node)?;
        signal("STOP", sup)?;
        signal("KILL", pid)?;
        self.paused.remove(node);
        self.crashed.insert(node.to_owned());
        Ok(format!("SIGKILL {node} (pid {pid}); its supervisor held"))
    }

    fn start(&mut self, node: &str) -> Result<String, String> {
        if !self.crashed.remove(node) {
            return Ok(format!("{node} was not down"));
        }
        let sup = self.cluster.supervisor(node).ok_or_else(|| format!("no supervisor for {node}"))?;
        signal("CONT", sup)?;
        Ok(format!("{node}'s supervisor restarts it"))
    }

    fn skew(&mut self, node: &str, ms: i64) -> Result<String, String> {
        let total = self.skews_ms.entry(node.to_owned()).or_insert(0);
        *total += ms;
        let text = faketime_offset(*total);
        let path = self.cluster.faketime_dir().join(node);
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, format!("{text}\n")).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| e.to_string())?;
        Ok(format!("{node} wall clock {text} s"))
    }

    fn etcd_leader(&self) -> Option<String> {
        for i in 1..=3 {
            let node = format!("etcd-{i}");
            let Some(url) = self.cluster.url_of(&node) else { continue };
            let out = Command::new("curl")
                .args(["-fsS", "--max-time", &max_time(), "-X", "POST", "-d", "{}"])
                .arg(format!("{url}/v3/maintenance/status"))
                .output()
                .ok()?;
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            let me = v.pointer("/header/member_id").and_then(|x| x.as_str()).unwrap_or_default();
            let leader = v.get("leader").and_then(|x| x.as_str()).unwrap_or_default();
            if !me.is_empty() && me == leader {
                return Some(node);
            }
        }
        None
    }

    /// Applies one primitive fault (one arm per verb); a description of what was done.
    pub fn apply(&mut self, f: &Fault) -> Result<String, String> {
        let now = Instant::now();
        match f {
            Fault::Pause { node, .. } => self.pause(node),
            Fault::Resume { node } => self.resume(node),
            Fault::Crash { node, .. } => self.crash(node),
            Fault::Start { node } => self.start(node),
            Fault::Partition { name, a, b, one_way, .. } => {
                let name = name.clone().unwrap_or_else(|| "unnamed".to_owned());
                self.partitions.insert(name.clone(), (a.clone(), b.clone(), *one_way));
                self.write_rules()?;
                Ok(format!("partition {name} in place"))
            }
            Fault::Heal { name: Some(name) } => {
                self.partitions.remove(name);
                self.write_rules()?;
                Ok(format!("partition {name} healed"))
            }
            Fault::Heal { name: None } => self.heal_network_and_pauses(),
            Fault::Clog { from, to, loss, for_ms, .. } => {
                self.clogs.insert((from.clone(), to.clone()), *loss);
                if let (Some(_), Some(ms)) = (loss, for_ms) {
                    self.closes
                        .push((now + Duration::from_millis(*ms), Close::Unclog { from: from.clone(), to: to.clone() }));
                }
                self.write_rules()?;
                Ok(format!("link {from} -> {to} {}", loss.map_or("clogged".to_owned(), |l| format!("loses {l:.2}"))))
            }
            Fault::Unclog { from, to } => {
                self.clogs.remove(&(from.clone(), to.clone()));
                self.write_rules()?;
                Ok(format!("link {from} -> {to} clear"))
            }
            Fault::SkewClock { node, ms } => self.skew(node, *ms),
            Fault::StoreFault { store, fault: StoreFaultKind::Unavailable, for_ms, .. } => {
                let nodes: Vec<String> = if store == "paydb" {
                    vec!["postgres".to_owned()]
                } else {
                    vec!["etcd-1".to_owned(), "etcd-2".to_owned()]
                };
                let mut done = Vec::new();
                for n in &nodes {
                    done.push(self.pause(n)?);
                }
                self.closes.push((now + Duration::from_millis(for_ms.unwrap_or(1_000)), Close::Resume(nodes)));
                Ok(format!("{store} unavailable: {}", done.join("; ")))
            }
            Fault::StoreFault { fault: StoreFaultKind::LeaderLoss, for_ms, .. } => {
                let Some(leader) = self.etcd_leader() else {
                    return Ok("no etcd leader to lose".to_owned());
                };
                let done = self.crash(&leader)?;
                self.closes.push((now + Duration::from_millis(for_ms.unwrap_or(1_000)), Close::Start(leader.clone())));
                Ok(format!("etcd leader {leader} lost: {done}"))
            }
            Fault::Revoke { key } => self.revoke(key.as_deref()),
            other => Err(format!("a real run has no mechanism for {}", other.verb())),
        }
    }

    /// A header file (mode 0600) with `var`'s token as the bearer: curl reads it (`-H @FILE`),
    /// so no credential is on a command line.
    fn header_file(&self, var: &str, name: &str) -> Result<std::path::PathBuf, String> {
        let token = std::fs::read_to_string(self.cluster.var(var)).map_err(|e| e.to_string())?;
        let path = self.cluster.dir.join("run").join(name);
        let text = format!("Authorization: Bearer {}\nX-Owner-Id: dlock-real-nemesis\n", token.trim());
        crate::cluster::write_private(&path, &text).map_err(|e| e.to_string())?;
        Ok(path)
    }

    /// `curl` with the headers of `file`; the answer's status and body.
    fn curl(file: &std::path::Path, args: &[&str], url: &str) -> Result<(String, String), String> {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", &max_time(), "-w", "\n%{http_code}"])
            .arg("-H")
            .arg(format!("@{}", file.display()))
            .args(args)
            .arg(url)
            .output()
            .map_err(|e| format!("curl: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", text.as_str()));
        Ok((code.trim().to_owned(), body.to_owned()))
    }

    /// An operator's revoke (L8) through lock-server-1 (module doc).
    fn revoke(&self, key: Option<&str>) -> Result<String, String> {
        let url = self.cluster.url_of("lock-server-1").ok_or("no lock-server-1")?;
        let target = match key {
            Some(k) => Some((k.to_owned(), None)),
            None => {
                let reader = self.header_file("READER_TOKEN_FILE", "reader.headers")?;
                let deadline = Instant::now() + Duration::from_millis(REVOKE_SEARCH_MS_MAX);
                (0..self.accounts).take_while(|_| Instant::now() < deadline).find_map(|k| {
                    let key = format!("payout:acct-{k}");
                    let (code, body) = Self::curl(&reader, &[], &format!("{url}/v1/locks/{key}")).ok()?;
                    let v: serde_json::Value = serde_json::from_str(&body).ok().filter(|_| code == "200")?;
                    let token = v.get("fencingToken").and_then(|t| t.as_i64()).filter(|_| v["held"] == true)?;
                    Some((key, Some(token)))
                })
            }
        };
        let Some((key, token)) = target else {
            return Ok("no account lock held: nothing revoked".to_owned());
        };
        let operator = self.header_file("OPERATOR_TOKEN_FILE", "operator.headers")?;
        let body = match token {
            Some(t) => {
                format!(r#"{{"operator":"dlock-real","reason":"the real run's nemesis revokes","expectedToken":{t}}}"#)
            }
            None => r#"{"operator":"dlock-real","reason":"the real run's nemesis revokes"}"#.to_owned(),
        };
        let (code, _) = Self::curl(
            &operator,
            &["-X", "POST", "-H", "Content-Type: application/json", "-d", &body],
            &format!("{url}/v1/locks/{key}/revoke"),
        )?;
        match code.as_str() {
            "200" => Ok(format!("{key} revoked{}", token.map_or(String::new(), |t| format!(" (token {t})")))),
            "404" | "409" => Ok(format!("{key}: no longer held as read, nothing revoked ({code})")),
            other => Err(format!("revoke {key} answered {other}")),
        }
    }

    /// Closes the self-closing faults that are due; what was done.
    pub fn close_due(&mut self) -> Vec<String> {
        let now = Instant::now();
        let (due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.closes).into_iter().partition(|(t, _)| *t <= now);
        self.closes = keep;
        due.into_iter().map(|(_, c)| self.close(c)).collect()
    }

    fn close(&mut self, c: Close) -> String {
        let r = match c {
            Close::Unclog { from, to } => self.apply(&Fault::Unclog { from, to }),
            Close::Resume(nodes) => {
                nodes.iter().map(|n| self.resume(n)).collect::<Result<Vec<_>, _>>().map(|v| v.join("; "))
            }
            Close::Start(node) => self.start(&node),
        };
        r.unwrap_or_else(|e| format!("error: {e}"))
    }

    fn heal_network_and_pauses(&mut self) -> Result<String, String> {
        self.partitions.clear();
        self.clogs.clear();
        self.write_rules()?;
        let paused: Vec<String> = self.paused.keys().cloned().collect();
        for n in &paused {
            self.paused.insert(n.clone(), 1);
            self.resume(n)?;
        }
        Ok(format!("network healed; {} resumed", paused.len()))
    }

    /// Undoes every fault in place but the clock offsets (module doc).
    pub fn heal_all(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for (_, c) in std::mem::take(&mut self.closes) {
            out.push(self.close(c));
        }
        out.push(self.heal_network_and_pauses().unwrap_or_else(|e| format!("error: {e}")));
        let crashed: Vec<String> = self.crashed.iter().cloned().collect();
        for n in crashed {
            out.push(self.start(&n).unwrap_or_else(|e| format!("error: {e}")));
        }
        out
    }

    /// `ip:port` of a peer, from its URL.
    fn addr(&self, node: &str) -> Option<(String, u16)> {
        let url = self.cluster.url_of(node)?;
        let hostport = url.trim_start_matches("http://").trim_start_matches("https://");
        let (ip, port) = hostport.rsplit_once(':')?;
        Some((ip.to_owned(), port.parse().ok()?))
    }

    /// The nftables script of every partition and clog in place.
    fn rules(&self) -> String {
        let ns = crate::nemesis::NETNS_NODE;
        let mut out_rules = Vec::new();
        let mut in_rules = Vec::new();
        let mut cut = |from: &str, to: &str, loss: Option<f64>| {
            let pick = match loss {
                Some(l) => format!("numgen random mod 1000 < {} ", (l * 1000.0).round() as u32),
                None => String::new(),
            };
            if from == ns {
                if let Some((ip, port)) = self.addr(to) {
                    out_rules.push(format!("ip daddr {ip} tcp dport {port} {pick}drop"));
                }
            } else if to == ns {
                if let Some((ip, port)) = self.addr(from) {
                    in_rules.push(format!("ip saddr {ip} tcp sport {port} {pick}drop"));
                }
            }
        };
        for (a, b, one_way) in self.partitions.values() {
            for x in a {
                for y in b {
                    cut(x, y, None);
                    if !one_way {
                        cut(y, x, None);
                    }
                }
            }
        }
        for ((from, to), loss) in &self.clogs {
            cut(from, to, *loss);
        }
        let mut s = format!("table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n");
        s.push_str(&format!("table inet {NFT_TABLE} {{\n"));
        s.push_str("  chain out {\n    type filter hook output priority 0; policy accept;\n");
        for r in &out_rules {
            s.push_str(&format!("    {r}\n"));
        }
        s.push_str("  }\n  chain in {\n    type filter hook input priority 0; policy accept;\n");
        for r in &in_rules {
            s.push_str(&format!("    {r}\n"));
        }
        s.push_str("  }\n}\n");
        s
    }

    fn write_rules(&self) -> Result<(), String> {
        let ns = self.cluster.var("NETNS");
        if ns.is_empty() {
            return Err("the cluster has no network namespace (up.sh --netns)".to_owned());
        }
        let script = self.rules();
        let path = self.cluster.dir.join("nemesis.nft");
        std::fs::write(&path, &script).map_err(|e| e.to_string())?;
        let out = Command::new("ip")
            .args(["netns", "exec", &ns, "nft", "-f"])
            .arg(&path)
            .output()
            .map_err(|e| format!("nft: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("nft -f failed: {}", String::from_utf8_lossy(&out.stderr).trim()))
        }
    }
}

/// [`MECHANISM_CALL_MS_MAX`] as curl's `--max-time` (seconds).
fn max_time() -> String {
    format!("{:.3}", MECHANISM_CALL_MS_MAX as f64 / 1000.0)
}

/// A total wall-clock offset as libfaketime's relative form, in seconds with ms (`+1.500`,
/// `-3600.000`).
pub fn faketime_offset(total_ms: i64) -> String {
    let sign = if total_ms < 0 { '-' } else { '+' };
    let a = total_ms.unsigned_abs();
    format!("{sign}{}.{:03}", a / 1000, a % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wall_clock_offset_is_written_in_libfaketimes_relative_seconds() {
        assert_eq!(faketime_offset(1_500), "+1.500");
        assert_eq!(faketime_offset(-3_600_000), "-3600.000");
        assert_eq!(faketime_offset(0), "+0.000");
        assert_eq!(faketime_offset(-7), "-0.007");
    }
}
