//! Bad configs are rejected before anything starts, with a message naming the file, the line and
//! column of the field at fault (`job.toml:LINE:COL: field: …`), the field and the fix — for
//! syntax errors, type errors, and the checks after parsing (the config's own, the query's
//! parameters', the config against the query's operators) alike.

mod common;

use common::koala;

fn rejected(config: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("job.toml");
    std::fs::write(&path, config).expect("write config");
    // In the config's directory: a relative output_dir of a config accepted by mistake lands
    // there, never in the source tree.
    let out = koala().current_dir(dir.path()).arg("run").arg(&path).output().expect("start koala");
    assert!(!out.status.success(), "config was accepted:\n{config}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const BASE: &str = "query = \"keyed-aggregate\"\noutput_dir = \"unused\"\n";

#[test]
fn unknown_top_level_field_is_named() {
    let err = rejected(&format!("{BASE}paralelism_typo = 3\n"));
    assert!(err.contains("paralelism_typo"), "{err}");
}

/// The line of `job.toml` an error names, after `error: `: `job.toml:LINE:COL: field: …`.
fn placed_at(err: &str, line: u32, column: u32, field: &str) -> bool {
    err.contains(&format!("job.toml:{line}:{column}: {field}: "))
}

#[test]
fn a_syntax_error_names_its_line_and_column() {
    let err = rejected(&format!("{BASE}[runtime\nlinger_ms = 5\n"));
    assert!(err.contains("job.toml:3:9: invalid table header"), "{err}");
    assert!(err.contains("3 | [runtime"), "the offending line is shown: {err}");
}

#[test]
fn a_type_error_names_the_field_in_words_not_rust_types() {
    let err = rejected(&format!("{BASE}workers = -2\n"));
    assert!(placed_at(&err, 3, 11, "workers") && err.contains("expected a whole number, 0 or more"), "{err}");
    let err = rejected(&format!("{BASE}[runtime]\nlinger_ms = \"5\"\n"));
    assert!(
        placed_at(&err, 4, 13, "runtime.linger_ms") && err.contains("the text \"5\" is not what goes here"),
        "{err}"
    );
    let err = rejected(&format!("{BASE}num_buckets = 70000\n"));
    assert!(placed_at(&err, 3, 15, "num_buckets") && err.contains("from 0 to 65535"), "{err}");
    for rust in ["u16", "u32", "u64", "usize", "f64", "i64"] {
        assert!(!err.contains(&format!("expected {rust}")), "{err}");
    }
    let err = rejected(&format!("{BASE}[state]\nbackend = \"rocksdb\"\n"));
    assert!(placed_at(&err, 4, 11, "state.backend") && err.contains("use `fjall`, `memory`"), "{err}");
}

#[test]
fn checks_after_parsing_name_the_line_of_the_field() {
    let windows = "query = \"tumbling-window\"\noutput_dir = \"unused\"\n";
    // The config against the query's operators.
    let err = rejected(&format!("{windows}workers = 2\n\n[parallelism]\nwindw = 2\n"));
    assert!(
        placed_at(&err, 6, 1, "parallelism.windw") && err.contains("its operators are source, window, sink"),
        "{err}"
    );
    let err = rejected(&format!(
        "{windows}[[reconfigurations]]\nat_s = 1\noperator = \"windo\"\nparallelism = 3\n"
    ));
    assert!(placed_at(&err, 5, 1, "reconfigurations[0].operator") && err.contains("window"), "{err}");
    // The config's own checks.
    let err = rejected(&format!("{windows}[runtime]\nlinger_ms = 5\nbatch_records = 0\n"));
    assert!(placed_at(&err, 5, 1, "runtime.batch_records") && err.contains("at least 1"), "{err}");
    // A field left at its default, at fault with one written: the written one's line.
    let err = rejected(&format!("{windows}protocol = \"drrs\"\n"));
    assert!(
        placed_at(&err, 3, 1, "partition_policy") && err.contains("add partition_policy = \"uniform\""),
        "{err}"
    );
    // The query's parameters: the parameter its message names.
    let err = rejected(&format!("{windows}[params.generator]\nkey_space = 0\n"));
    assert!(placed_at(&err, 4, 1, "params.generator.key_space"), "{err}");
    let err = rejected(&format!("{windows}[params]\nsink = \"discard\"\nwindow_ms = 0\n"));
    assert!(placed_at(&err, 5, 1, "params.window_ms") && err.contains("must be positive"), "{err}");
    // The query itself.
    let err = rejected("output_dir = \"unused\"\nquery = \"tumbling-windw\"\n");
    assert!(placed_at(&err, 2, 1, "query") && err.contains("tumbling-window"), "{err}");
}

#[test]
fn unknown_query_lists_known_ones() {
    let err = rejected("query = \"no-such-query\"\n");
    assert!(err.contains("no-such-query") && err.contains("keyed-aggregate"), "{err}");
}

#[test]
fn zero_parallelism_is_named() {
    let err = rejected(&format!("{BASE}[parallelism]\naggregate = 0\n"));
    assert!(err.contains("parallelism.aggregate") && err.contains("1 or more"), "{err}");
}

#[test]
fn more_tasks_than_buckets_is_named() {
    let err = rejected(&format!("{BASE}num_buckets = 8\n[parallelism]\naggregate = 9\n"));
    assert!(err.contains("parallelism.aggregate") && err.contains("num_buckets"), "{err}");
}

#[test]
fn parallelism_of_unknown_operator_is_named() {
    let err = rejected(&format!("{BASE}[parallelism]\naggregat = 2\n"));
    assert!(err.contains("parallelism.aggregat") && err.contains("aggregate"), "{err}");
}

#[test]
fn unknown_query_parameter_is_named() {
    let err = rejected(&format!("{BASE}[params.generator]\nkey_spaec = 10\n"));
    assert!(err.contains("key_spaec"), "{err}");
}

#[test]
fn a_typo_inside_params_names_the_file_and_its_real_line() {
    let err = rejected(&format!(
        "{BASE}workers = 2\n\n[parallelism]\naggregate = 2\n\n[params]\nsink = \"discard\"\nwindw_ms = 3\n"
    ));
    assert!(err.contains("job.toml:10:1: params.windw_ms: unknown field `windw_ms`"), "{err}");
}

#[test]
fn a_negative_rate_is_refused_by_name() {
    // Bounded, so that a config accepted by mistake ends (and fails the test) instead of running
    // forever unthrottled.
    let err = rejected(&format!(
        "{BASE}[params.generator]\nrecords = 1000\n[params.source]\nrate = [{{ at_ms = 0, records_per_sec = -50000.0 }}]\n"
    ));
    assert!(
        err.contains("job.toml:6:22: params.source.rate[0].records_per_sec:")
            && err.contains("source.rate[0].records_per_sec = -50000")
            && err.contains("give a rate ≥ 0"),
        "{err}"
    );
}

#[test]
fn timeouts_below_a_second_are_named() {
    let err = rejected(&format!("{BASE}[runtime]\nheartbeat_timeout_s = 0.0\n"));
    assert!(err.contains("runtime.heartbeat_timeout_s"), "{err}");
    let err = rejected(&format!("{BASE}[runtime]\nreconfiguration_timeout_s = -5.0\n"));
    assert!(err.contains("runtime.reconfiguration_timeout_s"), "{err}");
}

#[test]
fn a_zero_queue_bound_is_named() {
    let err = rejected(&format!("{BASE}[runtime]\nmax_queued_records = 0\n"));
    assert!(err.contains("runtime.max_queued_records") && err.contains("at least 1"), "{err}");
}

/// DRRS runs with the uniform partition policy only; its knobs are checked by name.
#[test]
fn drrs_needs_the_uniform_policy_and_known_knobs() {
    let err = rejected(&format!("protocol = \"drrs\"\n{BASE}"));
    assert!(err.contains("partition_policy") && err.contains("uniform"), "{err}");
    let top = "protocol = \"drrs\"\npartition_policy = \"uniform\"\n";
    let err = rejected(&format!("{top}{BASE}[drrs]\nsubscale = 2\n"));
    assert!(err.contains("subscale"), "{err}");
    let err = rejected(&format!("{top}{BASE}[drrs]\nsubscales = 100000\n"));
    assert!(err.contains("drrs.subscales"), "{err}");
    // The original DRRS's overlapping schedule runs one subscale per pair: a subscale count is
    // refused by name; an unknown schedule lists both.
    let err = rejected(&format!("{top}{BASE}[drrs]\nschedule = \"overlapping\"\nsubscales = 2\n"));
    assert!(err.contains("drrs.subscales") && err.contains("one subscale per"), "{err}");
    let err = rejected(&format!("{top}{BASE}[drrs]\nschedule = \"sequential\"\n"));
    assert!(err.contains("schedule") && err.contains("ported") && err.contains("overlapping"), "{err}");
}

#[test]
fn bad_state_sections_are_named() {
    let err = rejected(&format!("{BASE}[state]\nbackend = \"rocksdb\"\n"));
    assert!(err.contains("backend") && err.contains("fjall") && err.contains("memory"), "{err}");
    let err = rejected(&format!("{BASE}[state]\nbackend = \"memory\"\ncache_mb = 64\n"));
    assert!(err.contains("state.cache_mb") && err.contains("backend = \"fjall\""), "{err}");
    let err = rejected(&format!("{BASE}[state]\ncache_gb = 1\n"));
    assert!(err.contains("cache_gb"), "{err}");
    // The benchmark ceiling keeps no state: only for a job whose output is discarded.
    let err = rejected(&format!("{BASE}[state]\nbackend = \"none\"\n"));
    assert!(err.contains("state.backend") && err.contains("koala bench"), "{err}");
}

#[test]
fn capacity_settings_that_are_not_positive_rates_are_named_with_the_fix() {
    let err = rejected(&format!("{BASE}[runtime]\ntask_records_per_sec = 0\n"));
    assert!(err.contains("runtime.task_records_per_sec") && err.contains("remove the line"), "{err}");
    let err = rejected(&format!("{BASE}[runtime]\ntask_records_per_sec = 0.5\n"));
    assert!(err.contains("runtime.task_records_per_sec") && err.contains("1 or more"), "{err}");
    let err = rejected(&format!("{BASE}[runtime]\nlink_mb_per_sec = -100.0\n"));
    assert!(
        err.contains("runtime.link_mb_per_sec") && err.contains("e.g. runtime.link_mb_per_sec = 100"),
        "{err}"
    );
}

#[test]
fn warm_state_without_a_snapshot_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = rejected(&format!("warm_state = {:?}\n{BASE}", dir.path().display().to_string()));
    assert!(err.contains("warm_state") && err.contains("koala warmup"), "{err}");
}

/// The Remote baseline: `protocol = "remote"` and `[state] backend = "remote"` go together
/// (docs/protocols.md §7.1); each mismatch names both fields and the fix.
#[test]
fn remote_protocol_and_backend_must_go_together() {
    let err = rejected(&format!("protocol = \"remote\"\n{BASE}"));
    assert!(
        err.contains("protocol") && err.contains("state.backend") && err.contains("backend = \"remote\""),
        "{err}"
    );
    for protocol in ["koala", "stop-and-restart"] {
        let err = rejected(&format!("protocol = \"{protocol}\"\n{BASE}[state]\nbackend = \"remote\"\n"));
        assert!(
            err.contains("state.backend") && err.contains(protocol) && err.contains("protocol = \"remote\""),
            "{err}"
        );
    }
    // Koala is the default protocol: the remote backend alone is rejected too.
    let err = rejected(&format!("{BASE}[state]\nbackend = \"remote\"\n"));
    assert!(err.contains("state.backend") && err.contains("\"koala\""), "{err}");
    let remote = "protocol = \"remote\"\nquery = \"keyed-aggregate\"\noutput_dir = \"unused\"\n[state]\nbackend = \"remote\"\n";
    let err = rejected(&format!("{remote}servers = 0\n"));
    assert!(err.contains("state.servers") && err.contains("1 or more"), "{err}");
    let err = rejected(&format!("{remote}servers = 2\nserver_addresses = [\"127.0.0.1:7000\"]\n"));
    assert!(err.contains("state.server_addresses") && err.contains("not both"), "{err}");
    let err = rejected(&format!("{remote}server_addresses = [\"localhost\"]\n"));
    assert!(err.contains("state.server_addresses") && err.contains("host:port"), "{err}");
    let err = rejected(&format!("{BASE}[state]\nservers = 2\n"));
    assert!(err.contains("state.servers") && err.contains("backend = \"remote\""), "{err}");
    let err = rejected(&format!("{BASE}protocol = \"remot\"\n"));
    assert!(err.contains("remot"), "{err}");
}

#[test]
fn nexmark_over_kafka_names_the_start_values() {
    let start = rejected(
        "query = \"nexmark-q7\"\noutput_dir = \"unused\"\n[params]\ninput = \"kafka\"\n[params.kafka]\nstart = \"newest\"\n",
    );
    assert!(start.contains("params.kafka.start = \"newest\"") && start.contains("\"latest\""), "{start}");
}
