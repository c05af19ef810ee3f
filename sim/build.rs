//! Tells the crate's targets which optimisation level they are built at
//! (`DLOCK_SIM_OPT_LEVEL`): the swarm campaign test sizes its default seed count by it.

fn main() {
    let level = std::env::var("OPT_LEVEL").unwrap_or_else(|_| "0".to_owned());
    println!("cargo:rustc-env=DLOCK_SIM_OPT_LEVEL={level}");
    println!("cargo:rerun-if-env-changed=OPT_LEVEL");
}
