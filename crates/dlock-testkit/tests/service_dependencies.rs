//! No service crate depends on another service crate through a normal dependency (issue 9:
//! services share `dlock-paydb`, `dlock-contract` and the other libraries below them, never
//! each other). Test-only (`[dev-dependencies]`) edges are fine. Read from `cargo metadata`,
//! so a new edge fails here, naming it.

use std::process::Command;

/// The service crates: each is one process of the system.
const SERVICE_CRATES: [&str; 6] = [
    "dlock-lock-server",
    "dlock-payment-resource",
    "dlock-rail-proxy",
    "dlock-rail-stub",
    "dlock-executor",
    "dlock-reconciler",
];

/// Every normal (or build) dependency edge from one service crate to another in a
/// `cargo metadata --format-version 1` document, as `from -> to`, sorted; or why the
/// document cannot be read.
fn service_edges(metadata: &serde_json::Value) -> Result<Vec<String>, String> {
    let packages = metadata["packages"].as_array().ok_or("metadata has no packages")?;
    let mut edges = Vec::new();
    for p in packages {
        let from = p["name"].as_str().ok_or("a package has no name")?;
        if !SERVICE_CRATES.contains(&from) {
            continue;
        }
        for d in p["dependencies"].as_array().ok_or_else(|| format!("{from} has no dependency list"))? {
            let to = d["name"].as_str().ok_or_else(|| format!("a dependency of {from} has no name"))?;
            // `kind` is null for a normal dependency, "dev" or "build" otherwise.
            let test_only = d["kind"].as_str() == Some("dev");
            if SERVICE_CRATES.contains(&to) && !test_only {
                edges.push(format!("{from} -> {to}"));
            }
        }
    }
    edges.sort();
    edges.dedup();
    Ok(edges)
}

#[test]
fn no_service_crate_depends_on_another_service_crate() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(&root)
        .output()
        .expect("run cargo metadata");
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata is JSON");
    let names: Vec<&str> =
        metadata["packages"].as_array().expect("packages").iter().filter_map(|p| p["name"].as_str()).collect();
    for service in SERVICE_CRATES {
        assert!(names.contains(&service), "{service} is not a workspace member: the list above is stale");
    }
    assert!(names.contains(&"dlock-paydb"), "dlock-paydb is not a workspace member");
    let edges = service_edges(&metadata).expect("readable metadata");
    assert!(edges.is_empty(), "service crates depend on service crates (use a library crate instead): {edges:?}");
}

#[test]
fn the_edge_check_names_a_normal_edge_and_ignores_a_test_only_one() {
    let metadata = serde_json::json!({
        "packages": [
            {
                "name": "dlock-payment-resource",
                "dependencies": [
                    { "name": "dlock-paydb", "kind": null },
                    { "name": "dlock-rail-proxy", "kind": null, "target": "cfg(not(madsim))" },
                    { "name": "dlock-rail-stub", "kind": "dev" }
                ]
            },
            {
                "name": "dlock-reconciler",
                "dependencies": [
                    { "name": "dlock-payment-resource", "kind": "dev" },
                    { "name": "dlock-rail-proxy", "kind": "build" }
                ]
            },
            { "name": "dlock", "dependencies": [ { "name": "dlock-reconciler", "kind": null } ] }
        ]
    });
    assert_eq!(
        service_edges(&metadata),
        Ok(vec![
            "dlock-payment-resource -> dlock-rail-proxy".to_owned(),
            "dlock-reconciler -> dlock-rail-proxy".to_owned()
        ])
    );
    assert!(service_edges(&serde_json::json!({})).is_err(), "a document without packages is not a clean one");
}
