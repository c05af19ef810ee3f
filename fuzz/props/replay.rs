//! The corpus replay every `fuzz_corpus` test shares (included with `#[path]` by the
//! owning crates' tests, never by a fuzz target): each committed seed of
//! `fuzz/corpus/<target>/`, in file-name order, through the target's property.

use std::path::Path;

/// Runs `property` on every file of `fuzz/corpus/<target>/` (the corpus must not be empty)
/// and returns how many seeds it ran.
pub fn replay(target: &str, property: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no seed", dir.display());
    for f in &files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        property(&data);
    }
    files.len()
}
