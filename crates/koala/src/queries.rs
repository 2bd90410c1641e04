//! The query registry of the `koala` binary: every query a config can name, with what it
//! computes, its operators (the names `[parallelism]`, `rescale`, `rebalance` and `migrate`
//! take), its parameters and their defaults, and how to build it. `koala queries`, `koala run
//! --help`, the resolver every process builds its graph with, and the check of a config's
//! `[params]` all come from here, so none can list a query another does not know.

use std::fmt::Write as _;
use std::sync::Arc;

use koala_coordinator::config::{ConfigError, ConfigSource};
use koala_dataflow::graph::QueryResolver;
use koala_dataflow::{JobGraph, OperatorKind};
use serde::de::DeserializeOwned;

/// Where a query's parameters come from (which type they deserialize into).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    /// `koala_workloads`: [`koala_workloads::QueryParams`].
    Workloads,
    /// `koala_connectors::queries`: [`koala_connectors::queries::BidAggregateParams`].
    Kafka,
    /// `koala_workloads::nexmark`: [`koala_workloads::nexmark::NexmarkParams`].
    Nexmark,
    /// `koala_workloads::realworld`: [`koala_workloads::realworld::RealWorldParams`].
    RealWorld,
}

/// One registered query.
#[derive(Clone, Copy, Debug)]
pub struct Query {
    /// The name a config gives as `query = "..."`.
    pub name: &'static str,
    /// What it computes, operators named.
    pub about: &'static str,
    family: Family,
}

/// Every query, in registry order.
pub fn all() -> Vec<Query> {
    let workloads = koala_workloads::query_descriptions().into_iter().map(|(name, about)| Query {
        name,
        about,
        family: Family::Workloads,
    });
    let kafka = koala_connectors::queries::QUERIES.iter().map(|&(name, about)| Query {
        name,
        about,
        family: Family::Kafka,
    });
    let nexmark = koala_workloads::nexmark::QUERIES.iter().map(|&(name, about, _)| Query {
        name,
        about,
        family: Family::Nexmark,
    });
    let realworld = koala_workloads::realworld::QUERIES.iter().map(|&(name, about, _)| Query {
        name,
        about,
        family: Family::RealWorld,
    });
    workloads.chain(kafka).chain(nexmark).chain(realworld).collect()
}

/// The query `name`, or an error listing every query.
pub fn find(name: &str) -> Result<Query, String> {
    all().into_iter().find(|q| q.name == name).ok_or_else(|| {
        let names: Vec<&str> = all().iter().map(|q| q.name).collect();
        format!(
            "unknown query {name:?}; the queries are {} (`koala queries` describes them)",
            names.join(", ")
        )
    })
}

impl Query {
    /// Whether its `[params]` have a `[params.kafka]` section (the bid aggregate and the Nexmark
    /// queries: it names the brokers, topics and format, used when `input` or `output` is Kafka).
    pub fn has_kafka_params(&self) -> bool {
        matches!(self.family, Family::Kafka | Family::Nexmark)
    }

    /// Its example config, relative to the repository root: `examples/<name>.toml`, except the
    /// keyed aggregate (the demo's config) and the Kafka bid aggregate.
    pub fn example(&self) -> String {
        match self.name {
            "keyed-aggregate" => "examples/demo.toml".to_string(),
            "bid-aggregate" => "examples/kafka-bids.toml".to_string(),
            name => format!("examples/{name}.toml"),
        }
    }

    /// Builds the graph from the `[params]` table as TOML text (what workers receive).
    pub fn build(&self, params: &str) -> Result<JobGraph, String> {
        match self.family {
            Family::Workloads => {
                let params: koala_workloads::QueryParams =
                    toml::from_str(params).map_err(|e| format!("params: {e}"))?;
                koala_workloads::build_query(self.name, &params).map_err(|e| e.to_string())
            }
            Family::Kafka => koala_connectors::queries::build_query(self.name, params).unwrap_or_else(|| {
                Err(format!("query {:?} is not a Kafka query (a registry bug)", self.name))
            }),
            Family::Nexmark => {
                let params: koala_workloads::nexmark::NexmarkParams =
                    toml::from_str(params).map_err(|e| format!("params: {e}"))?;
                nexmark(self.name, &params)
            }
            Family::RealWorld => {
                let params: koala_workloads::realworld::RealWorldParams =
                    toml::from_str(params).map_err(|e| format!("params: {e}"))?;
                realworld(self.name, &params)
            }
        }
    }

    /// The `[params]` table `params` (TOML text) parsed for `koala warmup`, as
    /// [`koala_workloads::warm`] takes them.
    pub fn warm_params(&self, params: &str) -> Result<WarmParams, String> {
        let err = |e: toml::de::Error| format!("params: {e}");
        Ok(match self.family {
            Family::Workloads => WarmParams::Workloads(toml::from_str(params).map_err(err)?),
            Family::Nexmark => WarmParams::Nexmark(toml::from_str(params).map_err(err)?),
            Family::RealWorld => WarmParams::RealWorld(toml::from_str(params).map_err(err)?),
            Family::Kafka => WarmParams::None,
        })
    }

    /// Checks `[params]` inside the whole config `document` (the text of `source`), so that a
    /// typo or a wrong type is reported at its line in the file, not in a re-serialised copy of
    /// the table; then builds the query with them, which checks their values (an error there is
    /// placed at the parameter its message names).
    pub fn check_params(&self, source: &ConfigSource<'_>, document: &str) -> Result<(), ConfigError> {
        let built = match self.family {
            Family::Workloads => {
                let params = params_in::<koala_workloads::QueryParams>(source, document)?;
                koala_workloads::build_query(self.name, &params).map(drop).map_err(|e| e.to_string())
            }
            Family::Kafka => {
                let params = params_in::<koala_connectors::queries::BidAggregateParams>(source, document)?;
                koala_connectors::queries::bid_aggregate(&params).map(drop).map_err(|e| e.to_string())
            }
            Family::Nexmark => {
                let params = params_in::<koala_workloads::nexmark::NexmarkParams>(source, document)?;
                nexmark(self.name, &params).map(drop)
            }
            Family::RealWorld => {
                let params = params_in::<koala_workloads::realworld::RealWorldParams>(source, document)?;
                realworld(self.name, &params).map(drop)
            }
        };
        built.map_err(|message| source.place_error(ConfigError::Invalid { field: "params".into(), message }))
    }

    /// Whether the query's input never ends by itself under `params` (then only `duration_s`, a
    /// signal or an error ends the job).
    pub fn unbounded(&self, params: &toml::Table) -> bool {
        let text = toml::to_string(params).unwrap_or_default();
        match self.family {
            Family::Workloads => toml::from_str::<koala_workloads::QueryParams>(&text)
                .is_ok_and(|p| p.generator.records.is_none()),
            Family::Kafka => toml::from_str::<koala_connectors::queries::BidAggregateParams>(&text)
                .is_ok_and(|p| match p.input {
                    koala_connectors::queries::Input::Kafka => !p.kafka.until_end,
                    koala_connectors::queries::Input::Generator => p.nexmark.events.is_none(),
                }),
            Family::Nexmark => {
                toml::from_str::<koala_workloads::nexmark::NexmarkParams>(&text).is_ok_and(|p| {
                    match p.input {
                        koala_workloads::nexmark::NexmarkInput::Kafka => !p.kafka.until_end,
                        koala_workloads::nexmark::NexmarkInput::Generator => p.nexmark.events.is_none(),
                    }
                })
            }
            Family::RealWorld => toml::from_str::<koala_workloads::realworld::RealWorldParams>(&text)
                .is_ok_and(|p| {
                    p.input == koala_workloads::realworld::Input::Generator && p.generator.events.is_none()
                }),
        }
    }

    /// What a job reading Kafka should know when it starts: where it starts reading and what its
    /// lag counts from (`None` for other inputs).
    pub fn input_note(&self, params: &toml::Table) -> Option<String> {
        use koala_connectors::StartAt;
        let text = toml::to_string(params).unwrap_or_default();
        let (topics, start, group, until_end) = match self.family {
            Family::Kafka => {
                let p = toml::from_str::<koala_connectors::queries::BidAggregateParams>(&text).ok()?;
                if p.input != koala_connectors::queries::Input::Kafka {
                    return None;
                }
                (format!("{}-bid", p.kafka.topic_prefix), p.kafka.start, p.kafka.group, p.kafka.until_end)
            }
            Family::Nexmark => {
                let p = toml::from_str::<koala_workloads::nexmark::NexmarkParams>(&text).ok()?;
                if p.input != koala_workloads::nexmark::NexmarkInput::Kafka {
                    return None;
                }
                let start = koala_connectors::queries::parse_start(&p.kafka.start).ok()?;
                let kinds = koala_workloads::nexmark::kafka_stream_of(self.name)?.kinds();
                let topics: Vec<String> =
                    kinds.iter().map(|k| format!("{}-{}", p.kafka.topic_prefix, k.name())).collect();
                (topics.join(" and "), start, p.kafka.group, p.kafka.until_end)
            }
            Family::Workloads | Family::RealWorld => return None,
        };
        let start = match start {
            StartAt::Earliest => "from the earliest offset of every partition (start = \"earliest\": a re-run reads the whole topic again)".to_string(),
            StartAt::Latest => "from the end of every partition as the job starts (start = \"latest\": only records produced from now on)".to_string(),
            StartAt::Committed => format!(
                "from consumer group {group:?}'s committed offsets (start = \"committed\"; the earliest offset where it committed none), committing as it reads"
            ),
        };
        Some(format!(
            "kafka: reading {topics} {start}{}; \
             lag counts from when a record became available (its timestamp, or the job's start for records written before)",
            if until_end { ", up to its end as the job starts" } else { ", then waits for new records" }
        ))
    }

    /// The parameters and their defaults, as the `[params]` tables a config would write.
    pub fn default_params(&self) -> String {
        let params = match self.family {
            Family::Workloads => toml::Value::try_from(koala_workloads::QueryParams::default()),
            Family::Kafka => toml::Value::try_from(koala_connectors::queries::BidAggregateParams::default()),
            Family::Nexmark => toml::Value::try_from(koala_workloads::nexmark::NexmarkParams::default()),
            Family::RealWorld => {
                toml::Value::try_from(koala_workloads::realworld::RealWorldParams::default())
            }
        };
        let text = params.and_then(|p| toml::to_string(&toml::Table::from_iter([("params".to_string(), p)])));
        text.unwrap_or_else(|e| format!("# the defaults could not be written: {e}\n"))
    }

    /// The `[params]` table of its defaults as TOML text (what [`Self::build`] takes).
    fn default_params_table(&self) -> String {
        let document: toml::Table = toml::from_str(&self.default_params()).unwrap_or_default();
        document.get("params").and_then(|p| toml::to_string(p).ok()).unwrap_or_default()
    }

    /// Its operators with their kinds, from the graph its default parameters build.
    pub fn operators(&self) -> Result<Vec<(String, &'static str)>, String> {
        let graph = self.build(&self.default_params_table())?;
        Ok(graph
            .operators
            .iter()
            .map(|op| {
                let kind = match op.kind {
                    OperatorKind::Source { .. } => "source",
                    OperatorKind::Transform { stateful: true, .. } => "stateful",
                    OperatorKind::Transform { stateful: false, .. } => "stateless",
                    OperatorKind::Sink { .. } => "sink",
                };
                (op.name.clone(), kind)
            })
            .collect())
    }
}

/// Builds the Nexmark query `name` (registered: the registry lists only these names).
/// With `input = "kafka"` it reads the Kafka topics `[params.kafka]` describes.
fn nexmark(name: &str, params: &koala_workloads::nexmark::NexmarkParams) -> Result<JobGraph, String> {
    use koala_workloads::nexmark::{ExternalSource, NexmarkInput};
    let mut params = params.clone();
    if params.input == NexmarkInput::Kafka {
        params.kafka_source =
            ExternalSource(Some(koala_connectors::queries::nexmark_kafka_source(&params.kafka)?));
    }
    koala_workloads::nexmark::build(name, &params)
        .unwrap_or_else(|| Err(format!("query {name:?} is not a Nexmark query (a registry bug)")))
}

/// A query's parameters, owned, for `koala warmup`.
#[derive(Clone, Debug)]
pub enum WarmParams {
    /// The synthetic queries.
    Workloads(koala_workloads::QueryParams),
    /// Nexmark.
    Nexmark(koala_workloads::nexmark::NexmarkParams),
    /// Twitch, Taxi, Azure, Borg.
    RealWorld(koala_workloads::realworld::RealWorldParams),
    /// A family without warm layouts.
    None,
}

impl WarmParams {
    /// Borrowed as the workloads crate takes them (`None` for a family without layouts).
    pub fn as_warm(&self) -> Option<koala_workloads::warm::WarmParams<'_>> {
        use koala_workloads::warm::WarmParams as W;
        match self {
            Self::Workloads(p) => Some(W::Workloads(p)),
            Self::Nexmark(p) => Some(W::Nexmark(p)),
            Self::RealWorld(p) => Some(W::RealWorld(p)),
            Self::None => None,
        }
    }
}

/// Builds the real-world query `name` (registered: the registry lists only these names).
fn realworld(name: &str, params: &koala_workloads::realworld::RealWorldParams) -> Result<JobGraph, String> {
    koala_workloads::realworld::build(name, params)
        .unwrap_or_else(|| Err(format!("query {name:?} is not a real-world query (a registry bug)")))
}

/// `[params]` of the config `document` (the text of `source`), deserialised where it stands in
/// the file.
fn params_in<P: DeserializeOwned + Default>(
    source: &ConfigSource<'_>,
    document: &str,
) -> Result<P, ConfigError> {
    #[derive(serde::Deserialize)]
    #[serde(bound = "P: DeserializeOwned + Default")]
    struct Document<P> {
        #[serde(default)]
        params: P,
    }
    toml::from_str::<Document<P>>(document).map(|d| d.params).map_err(|e| source.parse_error(&e))
}

/// Builds any registered query from its name and TOML parameters.
pub fn resolver() -> QueryResolver {
    Arc::new(|name: &str, params: &str| find(name)?.build(params))
}

/// The query list under `koala run --help`.
pub fn help() -> String {
    let mut out = String::from("Queries (`koala queries NAME` shows one's operators and parameters):\n");
    for q in all() {
        let _ = writeln!(out, "  {:<20} {}", q.name, q.about);
    }
    out.push_str(
        "A config names one with `query = \"...\"`, sets tasks per operator under [parallelism] and the \
         query's parameters under [params]; every query has an example config, examples/<name>.toml \
         (keyed-aggregate: examples/demo.toml, bid-aggregate: examples/kafka-bids.toml).",
    );
    out
}

/// Top-level `[params]` keys that only some queries of their family read, and those queries;
/// every other key (and every table: `generator`, `source`, `nexmark`, `kafka`, `csv` …) is read
/// by every query of its family.
const ONLY_FOR: &[(&str, &[&str])] = &[
    (
        "window_ms",
        &["tumbling-window", "sliding-window", "window-join", "filtered-window", "nexmark-q5", "nexmark-q7"],
    ),
    ("slide_ms", &["sliding-window", "nexmark-q5"]),
    ("last_n", &["last-n"]),
    ("allowed_lateness_ms", &["tumbling-window", "sliding-window", "filtered-window"]),
    ("window_padding_bytes", &["tumbling-window", "sliding-window", "filtered-window"]),
    (
        "state_padding_bytes",
        &[
            "keyed-aggregate",
            "two-stage-aggregate",
            "nexmark-q3",
            "nexmark-q4",
            "nexmark-q4star",
            "nexmark-q6",
            "nexmark-q6star",
            "twitch",
            "taxi",
            "azure",
            "borg",
        ],
    ),
    ("q1_price_factor", &["nexmark-q1"]),
    ("q2_auctions", &["nexmark-q2"]),
    ("last_prices", &["nexmark-q6", "nexmark-q6star"]),
    ("new_user_period_ms", &["nexmark-q8"]),
    ("recent", &["taxi", "azure", "borg"]),
    ("taxi_partition", &["taxi"]),
    ("loyal_watch_ms", &["twitch"]),
];

impl Query {
    /// The `[params]` tables with the defaults of the parameters this query reads (those of its
    /// family less the keys [`ONLY_FOR`] gives to other queries).
    pub fn used_params(&self) -> String {
        let mut document: toml::Table = toml::from_str(&self.default_params()).unwrap_or_default();
        if let Some(toml::Value::Table(params)) = document.get_mut("params") {
            params.retain(|key, _| {
                ONLY_FOR
                    .iter()
                    .find(|entry| entry.0 == key)
                    .is_none_or(|(_, queries)| queries.contains(&self.name))
            });
        }
        toml::to_string(&document).unwrap_or_else(|e| format!("# the defaults could not be written: {e}\n"))
    }
}

/// `koala queries`: one line per query, what it computes.
pub fn list() -> String {
    let queries = all();
    let width = queries.iter().map(|q| q.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for q in &queries {
        let _ = writeln!(out, "{:<width$}  {}", q.name, q.about);
    }
    out.push_str(
        "\n`koala queries NAME` shows a query's operators, example config and the parameters it reads; \
         `koala queries --all` shows that for every query.\n",
    );
    out
}

/// `koala queries NAME` (or `--all`): a query's operators, its example config and the defaults
/// of the parameters it reads.
pub fn describe(only: Option<&str>) -> Result<String, String> {
    let chosen = match only {
        Some(name) => vec![find(name)?],
        None => all(),
    };
    let mut out = String::new();
    for q in chosen {
        let _ = writeln!(out, "{}\n  {}", q.name, q.about);
        let operators = q.operators()?;
        let ops: Vec<String> = operators.iter().map(|(name, kind)| format!("{name} ({kind})")).collect();
        let _ = writeln!(out, "  operators: {}", ops.join(", "));
        let _ = writeln!(out, "  example: {}", q.example());
        let _ = writeln!(out, "  parameters it reads, with their defaults:");
        for line in q.used_params().lines() {
            let _ = writeln!(out, "    {line}");
        }
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_query_builds_lists_its_operators_and_its_defaults_parse() {
        let queries = all();
        assert!(queries.iter().any(|q| q.name == "filtered-window"), "every workloads query is listed");
        assert!(queries.iter().any(|q| q.name == "bid-aggregate"), "the Kafka queries are listed");
        assert!(queries.iter().any(|q| q.name == "nexmark-q6star"), "the Nexmark queries are listed");
        assert!(queries.iter().any(|q| q.name == "borg"), "the real-world queries are listed");
        for q in queries {
            let ops = q.operators().unwrap_or_else(|e| panic!("{}: {e}", q.name));
            assert!(ops.iter().any(|(_, kind)| *kind == "source"), "{}: {ops:?}", q.name);
            assert!(ops.iter().any(|(_, kind)| *kind == "sink"), "{}: {ops:?}", q.name);
            let document = format!("query = {:?}\n{}", q.name, q.default_params());
            let source = ConfigSource::new("defaults", &document);
            q.check_params(&source, &document).unwrap_or_else(|e| panic!("{}: {e}", q.name));
            assert!(help().contains(q.name));
        }
        let q = find("keyed-aggregate").expect("registered");
        let bounded: toml::Table = toml::from_str("[generator]\nrecords = 10\n").expect("toml");
        assert!(q.unbounded(&toml::Table::new()) && !q.unbounded(&bounded));
        let text = describe(Some("tumbling-window")).expect("describe");
        assert!(text.contains("window (stateful)") && text.contains("window_ms = 1000"), "{text}");
        // Only what the query reads.
        for unused in ["last_n", "slide_ms", "state_padding_bytes"] {
            assert!(!text.contains(unused), "tumbling-window does not read {unused}:\n{text}");
        }
        let q3 = describe(Some("nexmark-q3")).expect("describe");
        for unused in
            ["q1_price_factor", "q2_auctions", "window_ms", "slide_ms", "last_prices", "new_user_period_ms"]
        {
            assert!(!q3.contains(unused), "nexmark-q3 does not read {unused}:\n{q3}");
        }
        assert!(q3.contains("state_padding_bytes") && q3.contains("[params.nexmark]"), "{q3}");
        // Every key ONLY_FOR names is a parameter of each query it lists.
        for (key, queries) in ONLY_FOR {
            for name in *queries {
                let q = find(name).expect("registered");
                let defaults: toml::Table = toml::from_str(&q.default_params()).expect("defaults");
                let optional = *key == "recent";
                assert!(optional || defaults["params"].get(*key).is_some(), "{name} has no parameter {key}");
            }
        }
        // The listing: one line per query and a pointer to the details.
        let listing = list();
        assert_eq!(listing.lines().count(), all().len() + 2, "{listing}");
        assert!(listing.lines().any(|l| l.starts_with("tumbling-window ")), "{listing}");
    }

    #[test]
    fn every_query_has_an_example_config_that_checks() {
        let crate_dir =
            std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
        let root = std::path::Path::new(&crate_dir).join("../..");
        for q in all() {
            let path = root.join(q.example());
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(text.contains(&format!("query = {:?}", q.name)), "{}", path.display());
            let config = koala_coordinator::config::JobConfig::parse(&text, &path.display().to_string())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let origin = path.display().to_string();
            q.check_params(&ConfigSource::new(&origin, &text), &text)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let graph = q.build(&config.params_text()).expect("builds");
            config.validate(&graph).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }

    #[test]
    fn a_typo_inside_params_is_reported_at_its_line_in_the_file() {
        let document = "query = \"tumbling-window\"\nworkers = 2\n\n[parallelism]\nwindow = 2\n\n[params]\nsink = \"jsonl\"\nwindw_ms = 1000\n";
        let q = find("tumbling-window").expect("registered");
        let err =
            q.check_params(&ConfigSource::new("job.toml", document), document).expect_err("typo").to_string();
        assert!(err.starts_with("job.toml:9:1: params.windw_ms: unknown field `windw_ms`"), "{err}");
        let negative = "query = \"keyed-aggregate\"\n[params.source]\nrate = [{ at_ms = 0, records_per_sec = -50000.0 }]\n";
        let err = find("keyed-aggregate")
            .expect("registered")
            .check_params(&ConfigSource::new("job.toml", negative), negative)
            .expect_err("negative rate")
            .to_string();
        assert!(err.starts_with("job.toml:3:22: params.source.rate[0].records_per_sec: "), "{err}");
        let err = find("no-such-query").expect_err("unknown");
        assert!(err.contains("filtered-window") && err.contains("bid-aggregate"), "{err}");
    }
}
