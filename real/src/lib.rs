//! The real-world run (docs/real-runs.md): the release binaries on a real 3-member etcd and
//! PostgreSQL (`deploy/local/up.sh`), a workload through them, and a schedule of faults drawn
//! from a seed in the simulation's one fault vocabulary, then the run judged by the
//! simulation's own oracle code, compiled for the normal build.
//!
//! - [`nemesis`]: the plan, a pure function of the seed (printed first);
//! - [`cluster`]: the cluster, started and read back;
//! - [`mechanism`]: one real mechanism per fault verb;
//! - [`workload`]: accounts and payouts through the payment-resource's API;
//! - [`forger`]: the simulation's forger, aimed at the real cluster after the settle phase;
//! - [`history`]: every process's trace file merged into one history on the host's
//!   monotonic clock;
//! - [`judge`]: ground truth (paydb, the rail's record, sampled fences, the history, the
//!   reconciler) through the oracle's checkers;
//! - [`lockset`]: Jepsen's lock-set workload on a fenced set and on a control without the
//!   fence, under a pause nemesis;
//! - [`plants`]: the planted bugs a real run switches on (the unsafe-test profile's switches
//!   or the test-only build), and why the others cannot be;
//! - [`queue`]: the control beside dlock: a plain work queue under the same workload and
//!   faults, its double payments counted from its own rail-stub's record;
//! - [`soak`]: every process's memory, descriptors and threads, the databases' size and
//!   connections, and throughput, sampled through the run and judged as trends;
//! - [`report`]: the text or JSON report, the incident trace and timeline, the exit code;
//! - [`run`]: one run end to end, its report and its exit code (the simulation's classes).
//!
//! `cargo xtask real run --seed S --duration 10m [--nemesis LIST] [--json]` builds the
//! release binaries and runs `dlock-real` (`src/bin/dlock-real.rs`). It needs root (network
//! namespaces, nftables) and the Debian packages scripts/test.sh installs.
#![cfg(not(madsim))]
#![allow(
    clippy::disallowed_methods,
    reason = "the harness drives real processes and times its run on the host's clock; the seam binds service code"
)]

pub mod cluster;
pub mod forger;
pub mod history;
pub mod judge;
pub mod lockset;
pub mod mechanism;
pub mod nemesis;
pub mod plants;
pub mod queue;
pub mod report;
pub mod run;
pub mod soak;
pub mod workload;
