#!/usr/bin/env bash
# scripts/demo.sh [dlock demo flags] — the README's main job on the embedded default (SQLite).
#
# Builds dlock (installing protoc from Debian packages when missing: etcd-client's build
# script needs it) and runs `dlock demo`: the whole cluster in one process, 1 000 payouts
# under a chaotic rail and executors stalled past their leases, judged by the reconciler.
# It exits 0 only if every invariant holds. Flags pass through, e.g.
#   ./scripts/demo.sh --payouts 5000 --rail-failure-rate 0.1 --pause-rate 0.05
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
command -v cargo >/dev/null || { echo "demo: cargo not found (install Rust with rustup)" >&2; exit 1; }
"$ROOT/scripts/ensure-packages.sh" protoc:protobuf-compiler
echo "==> building dlock (release)"
cargo build --release --locked -p dlock
exec "$ROOT/target/release/dlock" demo "$@"
