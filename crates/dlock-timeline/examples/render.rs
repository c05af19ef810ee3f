//! `cargo run -p dlock-timeline --example render -- TRACE.jsonl OUT.html`: renders an
//! incident trace file as the timeline (what `dlock-sim replay --timeline` writes).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        eprintln!("usage: render TRACE.jsonl OUT.html");
        std::process::exit(2);
    };
    let result = std::fs::read_to_string(input)
        .map_err(|e| format!("{input}: {e}"))
        .and_then(|t| dlock_timeline::render_html(&t))
        .and_then(|html| std::fs::write(output, html).map_err(|e| format!("{output}: {e}")));
    if let Err(e) = result {
        eprintln!("render: {e}");
        std::process::exit(1);
    }
}
