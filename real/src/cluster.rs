//! The real cluster: started by `deploy/local/up.sh --netns` (the release binaries, a
//! 3-member etcd, PostgreSQL, every process supervised), with a trace file and a fake wall
//! clock per dlock process, and read back from the `cluster.env` it writes.
//!
//! Invariants: every process id is read fresh from up.sh's pid files (a supervisor rewrites
//! them at each restart); nothing here signals a process that is not of this cluster (pids
//! come only from this run's directory).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Bound on waiting for up.sh to write `cluster.env`.
pub const CLUSTER_UP_S_MAX: u64 = 240;

/// A running cluster.
pub struct Cluster {
    pub dir: PathBuf,
    up: Option<Child>,
    env: BTreeMap<String, String>,
    lists: BTreeMap<String, Vec<String>>,
}

/// What the cluster is started with.
pub struct Start<'a> {
    pub root: &'a Path,
    pub dir: &'a Path,
    pub profile: &'a str,
    /// `DLOCK_*` settings every process gets.
    pub env: Vec<(String, String)>,
    pub keep: bool,
    /// Lines up.sh appends to the credentials file (`--credentials-extra`).
    pub credentials_extra: Option<&'a Path>,
}

impl Cluster {
    /// Starts up.sh and waits for its `cluster.env` (or its failure).
    pub fn start(s: &Start<'_>) -> Result<Cluster, String> {
        let up_log = s.dir.with_extension("up.log");
        let log = std::fs::File::create(&up_log).map_err(|e| format!("{}: {e}", up_log.display()))?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(s.root.join("deploy/local/up.sh"));
        cmd.arg("--netns")
            .arg("--dir")
            .arg(s.dir)
            .arg("--trace-dir")
            .arg(s.dir.join("trace"))
            .arg("--faketime-dir")
            .arg(s.dir.join("faketime"))
            .arg("--restart-sec")
            .arg("1")
            .arg("--reconcile-interval")
            .arg("3600")
            .arg("--profile")
            .arg(s.profile)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        if s.keep {
            cmd.arg("--keep");
        }
        if let Some(f) = s.credentials_extra {
            cmd.arg("--credentials-extra").arg(f);
        }
        for (k, v) in &s.env {
            cmd.env(k, v);
        }
        let mut up = cmd.spawn().map_err(|e| format!("cannot start deploy/local/up.sh: {e}"))?;
        let env_file = s.dir.join("cluster.env");
        let deadline = Instant::now() + Duration::from_secs(CLUSTER_UP_S_MAX);
        while !env_file.exists() {
            if let Ok(Some(status)) = up.try_wait() {
                let tail = std::fs::read_to_string(&up_log).unwrap_or_default();
                return Err(format!("deploy/local/up.sh exited ({status}) before the cluster was up:\n{tail}"));
            }
            if Instant::now() > deadline {
                let _ = up.kill();
                return Err(format!("the cluster was not up after {CLUSTER_UP_S_MAX} s ({})", up_log.display()));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let text = std::fs::read_to_string(&env_file).map_err(|e| e.to_string())?;
        let (env, lists) = parse_env(&text);
        Ok(Cluster { dir: s.dir.to_path_buf(), up: Some(up), env, lists })
    }

    pub fn var(&self, k: &str) -> String {
        self.env.get(k).cloned().unwrap_or_default()
    }

    pub fn list(&self, k: &str) -> Vec<String> {
        self.lists.get(k).cloned().unwrap_or_default()
    }

    fn run_dir(&self) -> PathBuf {
        PathBuf::from(self.var("RUN"))
    }

    /// The process's current pid (its supervisor's pid file).
    pub fn pid(&self, node: &str) -> Option<i32> {
        read_pid(&self.run_dir().join(format!("{node}.pid")))
    }

    /// The pid of the process's supervisor loop.
    pub fn supervisor(&self, node: &str) -> Option<i32> {
        read_pid(&self.run_dir().join(format!("{node}.sup")))
    }

    pub fn trace_dir(&self) -> PathBuf {
        PathBuf::from(self.var("TRACE_DIR"))
    }

    pub fn faketime_dir(&self) -> PathBuf {
        PathBuf::from(self.var("FAKETIME_DIR"))
    }

    /// `host:port` of a dlock service's URL, by process name.
    pub fn url_of(&self, node: &str) -> Option<String> {
        let idx = |name: &str| name.rsplit('-').next().and_then(|n| n.parse::<usize>().ok()).map(|n| n - 1);
        let pick = |list: &str| idx(node).and_then(|i| self.list(list).get(i).cloned());
        match node {
            "payment-resource" => Some(self.var("PAYMENT_URL")),
            "rail-stub" => Some(self.var("STUB_URL")),
            "lock-server-pg" => Some(self.var("LOCK_PG_URL")),
            n if n.starts_with("lock-server-") => pick("LOCK_URLS"),
            n if n.starts_with("rail-proxy-") => pick("PROXY_URLS"),
            n if n.starts_with("executor-") => pick("EXEC_URLS"),
            n if n.starts_with("etcd-") => pick("ETCD_URLS"),
            _ => None,
        }
    }

    /// Stops up.sh (which stops every process) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut up) = self.up.take() {
            if let Ok(None) = up.try_wait() {
                let _ = Command::new("kill").arg("-TERM").arg(up.id().to_string()).status();
            }
            let _ = up.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

fn read_pid(p: &Path) -> Option<i32> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// `KEY=value` and `KEY=(a b c)` lines of up.sh's `cluster.env` (values printed with `%q`
/// are plain paths and URLs here).
pub fn parse_env(text: &str) -> (BTreeMap<String, String>, BTreeMap<String, Vec<String>>) {
    let mut env = BTreeMap::new();
    let mut lists = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else { continue };
        if let Some(inner) = v.strip_prefix('(').and_then(|v| v.strip_suffix(')')) {
            lists.insert(k.to_owned(), inner.split_whitespace().map(str::to_owned).collect());
        } else {
            let v = v.trim_matches('\'').replace("\\ ", " ");
            env.insert(k.to_owned(), if v == "''" { String::new() } else { v });
        }
    }
    (env, lists)
}

/// Creates database `name` on the PostgreSQL server of `paydb_url` (the queue's and the
/// lock-set's own databases: never paydb) and a pool of `connections` on it.
pub async fn create_database(paydb_url: &str, name: &str, connections: u32) -> Result<sqlx::PgPool, String> {
    let err = |e: sqlx::Error| e.to_string();
    let (base, _) = paydb_url.rsplit_once('/').ok_or("bad paydb url")?;
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&format!("{base}/postgres"))
        .await
        .map_err(err)?;
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await.map_err(err)?;
    admin.close().await;
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&format!("{base}/{name}"))
        .await
        .map_err(err)
}

/// Writes `text` to `path` (created, or truncated), readable by its owner alone: the run's
/// secrets beside the cluster (the forger's credentials, the nemesis's curl headers).
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_env_lines_parse_into_values_and_lists() {
        let (env, lists) =
            parse_env("# c\nDIR=/tmp/x\nLOCK_URLS=(http://a:1 http://b:2)\nNETNS_DEV=''\nPAYMENT_URL=http://p:3\n");
        assert_eq!(env.get("DIR").map(String::as_str), Some("/tmp/x"));
        assert_eq!(env.get("NETNS_DEV").map(String::as_str), Some(""));
        assert_eq!(lists.get("LOCK_URLS").map(Vec::len), Some(2));
    }
}
