//! Koala, the lazy reconfiguration protocol (paper §3, Appendix A; docs/protocols.md §3), as
//! sans-IO state machines: [`KoalaTask`] for each target task, [`UpstreamRouter`] for each upstream
//! task and [`KoalaCoordinator`] for the coordinator. Each consumes events and returns actions; the runtime
//! (or the deterministic simulator, `crate::sim`) moves the messages.
//!
//! One epoch, as implemented (paper §3.1 steps, with this project's fixes marked *):
//! 1. The coordinator computes the moves, deploys new tasks and sends [`TaskEvent::Start`] to every
//!    task owning buckets before or after.
//! 2. A receiver adds a peer channel per sender to its event-time inputs and sends `Open` with the
//!    watermark it has emitted*. A sender, between two batches and once its event time has caught up
//!    with that watermark*, hands over the KLT of the moved buckets (where their state may be, with
//!    itself as the newest location — this is what makes every later fetch one hop, §3.3) with the
//!    buckets' timers but not their keys' state (lazy windows: a handed-over timer holds the
//!    receiver's event time until its key was accessed, `timers.rs`), then forwards their records.
//!    Idle senders do this without input*. The receiver asks each old location for the membership filter of the
//!    bucket's keys it holds, which that location builds in the background*.
//! 3. A receiver acks `PeerReady` after all hand-overs (every other task at `Start`).
//! 4. The coordinator switches the routing tables of all upstreams; each injects a marker and its
//!    watermark into every output channel.
//! 5. Senders close their peer channels after markers from all upstreams; a receiver parks direct
//!    records of a moved bucket until that bucket's peer channel closed* (per-key FIFO), holds its
//!    event time until all markers arrived and recomputes it when a peer closes (Algorithm 1), and
//!    acks `Done` after all markers and closes.
//! 6. Afterwards state moves lazily: a key missing from the owner's store is fetched, on first
//!    access, from the locations whose filter may hold it (a key outside every filter is new*), and
//!    the location deletes it as it answers* (one live copy). Fetches to cancelled tasks piggyback
//!    up to N extra keys, the owner keeps pulling as answers arrive (§3.4), and the coordinator
//!    releases a cancelled task once no KLT names it.

mod awaited;
mod bound;
mod coordinator;
mod cut;
mod filter;
mod key_hash;
mod klt;
pub(crate) mod messages;
mod serve;

pub(crate) mod task;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_bounded;

pub use crate::common::life::{CoreActivity, InputsEnded, TaskLife};
pub use coordinator::{CoordinatorAction, CoordinatorEvent, KeyedOperator, KoalaCoordinator, NewAssignment};
pub use cut::{CheckpointCut, CutPart, Entry as CutEntry, RestoreStep, restore_steps};
pub use filter::{FilterBuild, KeyFilter};
pub use key_hash::{bucket_and_key_hash, key_hash, key_hash_of};
pub use klt::{BatchLookup, KeyLookupTable, PendingFilter};
pub use messages::{
    BucketLocations, ExtraKeys, FetchRequest, FetchResponse, FilterRequest, FilterResponse, HandOver, Layer,
    PeerMessage, Reconfiguration, Role,
};
pub use serve::{Answered, KeyPage, LocationStore, PullCursors, serve_fetch};
pub use task::limits::DEFAULT_MAX_QUEUED_RECORDS;
pub use task::pipeline::BatchTaken;
pub use task::{KoalaTask, LocalKeys, NoLocalKeys, TaskAction, TaskConfig, TaskEvent};

pub use crate::common::error::ProtocolError;
pub use crate::common::input::InputSource;
pub use crate::common::upstream::{RouterAction, RouterEvent, UpstreamRouter};
pub use crate::control::TaskAck;
