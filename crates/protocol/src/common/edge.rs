//! An edge of the job graph as planning and routing switches see it: which operator feeds which,
//! and whether it can connect task i to task i only.

use koala_types::OperatorId;

/// An edge of the job graph between two operators, as planning sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edge {
    /// The upstream operator.
    pub from: OperatorId,
    /// The consuming operator.
    pub to: OperatorId,
    /// Whether it is a forward edge between two stateless operators: with equal task indices on
    /// both ends it connects task i to task i only ([`crate::plan::is_one_to_one`]).
    pub forward_stateless: bool,
}

impl Edge {
    /// The edge from `from` to `to`.
    pub fn new(from: OperatorId, to: OperatorId, forward_stateless: bool) -> Self {
        Self { from, to, forward_stateless }
    }
}
