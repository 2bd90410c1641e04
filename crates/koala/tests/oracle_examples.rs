//! Every example config's reconfiguration schedule is one the coordinator accepts: each request
//! applied in order to the config's initial deployment by the model of the coordinator's
//! bookkeeping (`common/model.rs`, the model the oracle's run checks use), so an example whose
//! `koala run` would print "rejected" for a scheduled request fails here without running it
//! (e.g. `nexmark-q1.toml` with two source tasks: its stateless "convert" was connected to them
//! one-to-one and could not be rescaled alone). The 12-second `koala run` of every example is
//! in docs/workloads.md §5.

mod common;

#[test]
fn every_example_schedule_is_accepted_by_the_coordinator() {
    let dir = common::repo_root().join("examples");
    let mut checked = Vec::new();
    let mut failures = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    entries.sort();
    for path in entries {
        let text = std::fs::read_to_string(&path).expect("read example");
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        match common::model::apply_schedule(&text) {
            Ok((_, applied)) => checked.push(format!("{name}: {}", applied.len())),
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(failures.is_empty(), "example schedules the coordinator would reject:\n{}", failures.join("\n"));
    // Every example but the Kafka one schedules at least one reconfiguration; the test must have
    // seen them.
    assert!(checked.len() >= 20, "only {} examples found in {}: {checked:?}", checked.len(), dir.display());
    println!("accepted: {}", checked.join(", "));
}
