//! Input from users and HTTP clients that is broken or hostile, fed to the coordinator's parsers:
//! the job config (TOML text → [`JobConfig`], checked against its query's graph, errors placed
//! at their line) and the bodies and query strings of the HTTP API ([`crate::http::api`],
//! [`crate::http::auth`]). Random text and valid inputs with characters flipped, cut or
//! inserted must come back as errors, never panic, and a short body must not expand into a
//! large allocation. A bounded property test of the normal suite; `fuzz/` runs the same
//! parsers for millions of inputs (docs/testing.md §9).

use proptest::prelude::*;

use crate::config::{ConfigSource, JobConfig};
use crate::control::{MAX_LISTED_BUCKETS, parse_move};
use crate::http::api::{MAX_SECONDS, parse_request, seconds_param};
use crate::http::auth::ApiAuth;

/// Valid configs to mutate: one per kind of section, and the example of a rescaled aggregate.
const CONFIGS: &[&str] = &[
    "query = \"keyed-aggregate\"\nworkers = 2\nnum_buckets = 16\n\n[parallelism]\naggregate = 2\n\n\
     [[reconfigurations]]\nat_s = 1.0\noperator = \"aggregate\"\nparallelism = 4\n\n\
     [[reconfigurations]]\nat_s = 2.0\noperator = \"aggregate\"\nmoves = [{ buckets = [0, 1, 2], to = 1 }]\n",
    "query = \"tumbling-window\"\nprotocol = \"drrs\"\npartition_policy = \"uniform\"\n\n[drrs]\n\
     schedule = \"overlapping\"\n\n[state]\nbackend = \"remote\"\ncache_mb = 1\n",
    "query = \"keyed-aggregate\"\ncheckpoint_interval_ms = 500\n[runtime]\nbatch_records = 8\n\
     worker_memory_mb = 512\n[coordinator]\nhttp_port = 0\n",
    "query = \"keyed-aggregate\"\n[params]\nsink = \"discard\"\n[params.generator]\nkey_space = 300\n\
     records = 1000\n[params.source]\nrate = [{ at_ms = 0, records_per_sec = 5000.0 }]\n",
];

/// Valid request bodies: (route, body).
const BODIES: &[(&str, &str)] = &[
    ("rescale", r#"{"operator": "aggregate", "parallelism": 4}"#),
    ("rebalance", r#"{"operator": "aggregate", "moves": ["3,4,10-12:1", "0-3:0"]}"#),
    ("migrate", r#"{"operator": "aggregate", "task": 0, "worker": 1}"#),
];

/// `text` through what `koala run` does with a config before anything starts: parsed, checked
/// against the graph of its query (a workloads query, else the keyed aggregate's), every
/// error placed at its line. Panics are the failures.
fn check_config(text: &str) {
    let source = ConfigSource::new("job.toml", text);
    let config = match JobConfig::parse(text, "job.toml") {
        Ok(config) => config,
        Err(e) => return drop(e.to_string()),
    };
    let params: Option<koala_workloads::QueryParams> = toml::from_str(&config.params_text()).ok();
    let graph = params
        .and_then(|p| koala_workloads::build_query(&config.query, &p).ok())
        .or_else(|| koala_workloads::build_query("keyed-aggregate", &Default::default()).ok())
        .unwrap_or_else(|| panic!("the keyed aggregate does not build"));
    if let Err(e) = config.validate(&graph) {
        drop(source.place_error(e).to_string());
    }
    for (i, r) in config.reconfigurations.iter().enumerate() {
        if let Err(e) = r.request(&format!("reconfigurations[{i}]")) {
            drop(source.place_error(e).to_string());
        }
    }
}

/// `body` to every POST route, and as a query string and header to the other parsers. Errors
/// must be 4xx.
fn check_body(body: &[u8]) -> Result<(), String> {
    for kind in ["rescale", "rebalance", "migrate", "unknown"] {
        match parse_request(kind, body) {
            Ok(koala_protocol::ReconfigRequest::Rebalance { moves, .. }) => {
                let listed: usize = moves.iter().map(|(b, _)| b.len()).sum();
                if listed > MAX_LISTED_BUCKETS {
                    return Err(format!("{listed} buckets listed"));
                }
            }
            Ok(_) => {}
            Err(e) if (400..500).contains(&e.status) => {}
            Err(e) => return Err(format!("{kind}: {e:?}")),
        }
    }
    let text = String::from_utf8_lossy(body);
    if let Ok(seconds) = seconds_param(&text)
        && !(1..=MAX_SECONDS).contains(&seconds)
    {
        return Err(format!("seconds={seconds} accepted"));
    }
    let token = koala_types::handshake::Token::parse("0123456789abcdef-job", "test").ok();
    let auth = ApiAuth::new(false, token).map_err(|e| e.to_string())?;
    let (header, query) = text.split_once('\n').unwrap_or((&text, &text));
    drop(auth.decide(Some(header), "/", query));
    drop(auth.decide(None, "/", query));
    Ok(())
}

/// Flips, cuts and inserts in `text` (at char boundaries, so it stays text).
fn mutate(
    text: &str,
    flips: &[(prop::sample::Index, char)],
    cut: prop::sample::Index,
    inserted: &str,
) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for (at, c) in flips {
        let i = at.index(chars.len());
        chars[i] = *c;
    }
    let at = cut.index(chars.len() + 1);
    let mut out: String = chars[..at].iter().collect();
    out.push_str(inserted);
    out.extend(&chars[at..]);
    out
}

/// Characters that matter to TOML and JSON, and some that do not.
fn syntax_char() -> impl Strategy<Value = char> {
    prop_oneof![
        prop::sample::select(vec![
            '[', ']', '{', '}', '"', '\'', '=', ',', '.', ':', '-', '+', '#', '\n', ' ', '\\', '0', '9', 'e',
            'n'
        ]),
        any::<char>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_text_never_panics_the_config_parser(text in "(?s).{0,512}") {
        check_config(&text);
    }

    #[test]
    fn mutated_configs_never_panic_the_config_parser(
        which in any::<prop::sample::Index>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), syntax_char()), 0..6),
        cut in any::<prop::sample::Index>(),
        inserted in proptest::collection::vec(syntax_char(), 0..12),
    ) {
        let text = CONFIGS[which.index(CONFIGS.len())];
        check_config(&mutate(text, &flips, cut, &inserted.into_iter().collect::<String>()));
    }

    #[test]
    fn random_bytes_never_panic_the_http_parsers(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_body(&body).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn mutated_bodies_never_panic_the_http_parsers(
        which in any::<prop::sample::Index>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), syntax_char()), 0..6),
        cut in any::<prop::sample::Index>(),
        inserted in proptest::collection::vec(syntax_char(), 0..12),
    ) {
        let (_, body) = BODIES[which.index(BODIES.len())];
        let body = mutate(body, &flips, cut, &inserted.into_iter().collect::<String>());
        check_body(body.as_bytes()).map_err(TestCaseError::fail)?;
    }
}

/// The valid inputs above parse: the mutations start from inputs that reach the checks.
#[test]
fn the_valid_inputs_parse() {
    for text in CONFIGS {
        JobConfig::parse(text, "job.toml").unwrap_or_else(|e| panic!("{e}"));
    }
    for (kind, body) in BODIES {
        parse_request(kind, body.as_bytes()).unwrap_or_else(|e| panic!("{kind}: {e:?}"));
    }
}

/// A rebalance body under the 64 KiB limit, of 5 000 whole-range moves, once expanded to
/// 5 000 × 65 536 buckets (625 MiB of `u16`s) before the request was checked against the
/// deployment; each move and the moves together are now bounded by the number of bucket ids.
#[test]
fn a_short_rebalance_body_cannot_list_more_buckets_than_there_are() {
    let moves = vec!["\"0-65535:1\""; 5000].join(",");
    let body = format!(r#"{{"operator": "aggregate", "moves": [{moves}]}}"#);
    assert!(body.len() <= crate::http::MAX_BODY, "{}", body.len());
    let err = parse_request("rebalance", body.as_bytes()).expect_err("too many buckets");
    assert_eq!(err.status, 400);
    assert!(err.message.contains("more than 65536 buckets listed"), "{}", err.message);
    // One move naming every bucket is still fine; a second bucket beyond that is not.
    assert_eq!(parse_move("0-65535:1", "--move").map(|(b, _)| b.len()), Ok(MAX_LISTED_BUCKETS));
    let err = parse_move("0-65535,7:1", "--move").expect_err("one more");
    assert!(err.starts_with("--move: more than 65536 buckets listed"), "{err}");
    let err = parse_move("0-65535,0-1:1", "--move").expect_err("a range more");
    assert!(err.contains("more than 65536"), "{err}");
}
