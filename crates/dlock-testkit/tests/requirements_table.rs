//! Keeps `docs/contracts/requirements.md` true: every test it names must exist.

use std::path::Path;

#[test]
fn requirements_table_names_only_existing_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let table = std::fs::read_to_string(root.join("docs/contracts/requirements.md")).expect("requirements.md");
    let mut files = Vec::new();
    for dir in ["crates", "sim", "real"] {
        files.extend(dlock_testkit::rust_files(&root.join(dir)));
    }
    let sources: String = files.iter().filter_map(|f| std::fs::read_to_string(f).ok()).collect::<Vec<_>>().join("\n");
    let mut named = 0;
    let mut missing = Vec::new();
    for line in table.lines().filter(|l| l.starts_with("| FR-") || l.starts_with("| NFR-") || l.starts_with("| DL-")) {
        let tests_cell = line.trim_end_matches('|').rsplit('|').next().unwrap_or("");
        for name in tests_cell.split('`').skip(1).step_by(2) {
            if name.ends_with('!') {
                continue;
            }
            named += 1;
            let defined = sources.contains(&format!("fn {name}("))
                || sources.contains(&format!("    {name},"))
                || sources.contains(&format!("!({name},"));
            if !defined {
                missing.push(name.to_owned());
            }
        }
    }
    assert!(named > 40, "only {named} test names found: is the table format intact?");
    assert!(missing.is_empty(), "requirements.md names tests that do not exist: {missing:?}");
}
