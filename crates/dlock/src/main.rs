//! `dlock`: every dlock service and tool as one binary with subcommands.

#[cfg(not(madsim))]
mod cli;
#[cfg(not(madsim))]
mod cluster;
#[cfg(not(madsim))]
mod config;
#[cfg(not(madsim))]
mod demo;
#[cfg(not(madsim))]
mod trace_file;

#[cfg(not(madsim))]
fn main() -> std::process::ExitCode {
    cli::main()
}

/// The binary drives real sockets and databases; the simulation lives in `dlock-sim`.
#[cfg(madsim)]
fn main() {
    eprintln!("dlock is not built for simulation; run the dlock-sim tests instead");
    std::process::exit(2);
}
