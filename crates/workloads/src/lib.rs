//! Registered queries of koala-rs (docs/architecture.md §12): every process of a job builds the same
//! [`JobGraph`] by calling [`build_query`] with the query's name and [`QueryParams`]. The output
//! types of the queries are public so tests can deserialize sink output into them.
//!
//! ```
//! use koala_workloads::{QueryParams, build_query, query_names};
//!
//! assert!(query_names().contains(&"keyed-aggregate"));
//! let graph = build_query("keyed-aggregate", &QueryParams::default())?;
//! assert!(graph.by_name("aggregate").is_some_and(|op| op.is_stateful()));
//! assert!(build_query("no-such-query", &QueryParams::default()).is_err());
//! # Ok::<(), koala_workloads::QueryError>(())
//! ```

pub mod nexmark;
mod outputs;
mod params;
mod queries;
pub mod realworld;
pub mod warm;

use koala_dataflow::{DataflowError, JobGraph};

pub use outputs::{GroupCount, JoinPair, KeyedJoinPair, KeyedTotal, LastN, WindowTotal};
pub use params::{QueryParams, SinkKind};

/// Why a query could not be built.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// No query has this name.
    #[error("unknown query {name:?}; valid queries: {}", valid.join(", "))]
    UnknownQuery {
        /// The name asked for.
        name: String,
        /// Every registered name.
        valid: Vec<String>,
    },
    /// The parameters are inconsistent.
    #[error("invalid parameters for query {query:?}: {reason}")]
    InvalidParams {
        /// The query.
        query: String,
        /// What is wrong.
        reason: String,
    },
    /// The dataflow builder rejected the job.
    #[error(transparent)]
    Dataflow(#[from] DataflowError),
}

/// Every registered query name.
pub fn query_names() -> Vec<&'static str> {
    queries::names().collect()
}

/// Every registered query: its name and a line on what it computes, operators named.
pub fn query_descriptions() -> Vec<(&'static str, &'static str)> {
    queries::described().collect()
}

/// Builds the job graph of the query `name` with `params`.
pub fn build_query(name: &str, params: &QueryParams) -> Result<JobGraph, QueryError> {
    let Some(build) = queries::lookup(name) else {
        return Err(QueryError::UnknownQuery {
            name: name.to_string(),
            valid: query_names().iter().map(|n| n.to_string()).collect(),
        });
    };
    params.validate(name).map_err(|reason| QueryError::InvalidParams { query: name.to_string(), reason })?;
    Ok(build(params)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_query_lists_valid_names() {
        let err =
            build_query("nope", &QueryParams::default()).err().map(|e| e.to_string()).unwrap_or_default();
        for name in query_names() {
            assert!(err.contains(name), "{err}");
        }
    }

    #[test]
    fn every_query_builds_with_defaults() {
        for name in query_names() {
            let graph = build_query(name, &QueryParams::default());
            assert!(graph.is_ok(), "{name}: {:?}", graph.err());
        }
    }
}
