//! Rebuild when a paydb migration is added or edited: `sqlx::migrate!` embeds the files at
//! compile time, and cargo does not otherwise notice a new file in that directory.

fn main() {
    println!("cargo:rerun-if-changed=../../migrations/paydb");
}
