//! Parameters shared by all registered queries, read from the job config.

use koala_dataflow::{KeyedEventsConfig, SourceOptions};
use serde::{Deserialize, Serialize};

/// Where a query's sink writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// JSON lines, one file per sink task.
    #[default]
    Jsonl,
    /// JSON lines on standard output.
    Stdout,
    /// Count and drop.
    Discard,
}

/// Parameters of a query. Every field has a default; unknown fields are rejected.
///
/// ```
/// let params: koala_workloads::QueryParams =
///     serde_json::from_str(r#"{"window_ms": 500, "sink": "discard", "generator": {"key_space": 10}}"#)?;
/// assert_eq!(params.window_ms, 500);
/// assert_eq!(params.generator.key_space, 10);
/// assert!(serde_json::from_str::<koala_workloads::QueryParams>(r#"{"windw_ms": 1}"#).is_err());
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueryParams {
    /// The keyed-event generator of the source(s); a second source (joins) uses `seed + 1`.
    pub generator: KeyedEventsConfig,
    /// Rate schedule, watermark cadence and bounded disorder of the source(s).
    pub source: SourceOptions,
    /// Window size (window and window-join queries).
    pub window_ms: u64,
    /// Window slide (sliding-window query).
    pub slide_ms: u64,
    /// Values kept per key (last-n query).
    pub last_n: usize,
    /// Allowed lateness of windows.
    pub allowed_lateness_ms: u64,
    /// Bytes of padding in each open window's state (tumbling-window, sliding-window,
    /// filtered-window), to make state as large as a real window's; the output does not change.
    pub window_padding_bytes: usize,
    /// Bytes of padding in each key's state of the "aggregate" operator (keyed-aggregate,
    /// two-stage-aggregate), created on a key's first record and kept on every update, so a key
    /// the job touched stays as large as a warm one (`koala warmup --value-bytes`); the output
    /// does not change. 0 (the default): count and sum only.
    pub state_padding_bytes: usize,
    /// Where the sink writes.
    pub sink: SinkKind,
}

impl Default for QueryParams {
    fn default() -> Self {
        Self {
            generator: KeyedEventsConfig::default(),
            source: SourceOptions::default(),
            window_ms: 1000,
            slide_ms: 500,
            last_n: 10,
            allowed_lateness_ms: 0,
            window_padding_bytes: 0,
            state_padding_bytes: 0,
            sink: SinkKind::default(),
        }
    }
}

impl QueryParams {
    /// Checks the parameters `query` uses, naming the first inconsistent one.
    pub(crate) fn validate(&self, query: &str) -> Result<(), String> {
        self.generator.validate().map_err(|e| e.to_string())?;
        self.source.validate()?;
        if self.generator.max_disorder_ms > self.source.max_disorder_ms {
            return Err(format!(
                "generator.max_disorder_ms ({}) exceeds source.max_disorder_ms ({}): records \
                 would arrive behind the watermark",
                self.generator.max_disorder_ms, self.source.max_disorder_ms
            ));
        }
        let windowed = query.contains("window");
        if windowed && self.window_ms == 0 {
            return Err("window_ms must be positive".to_string());
        }
        if query == "sliding-window" && self.slide_ms == 0 {
            return Err("slide_ms must be positive".to_string());
        }
        if query == "last-n" && self.last_n == 0 {
            return Err("last_n must be positive".to_string());
        }
        Ok(())
    }
}
