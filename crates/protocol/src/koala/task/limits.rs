//! How many records a Koala task takes at once and may hold: the batch size and the default bound
//! of `[runtime] max_queued_records`. A leaf, so the runtime options name it without importing the
//! task core.

/// The most records one batch takes from the inbox. A backlog (records queued behind a batch
/// waiting for state) is processed as several batches, in order, so one batch's wait and work stay
/// bounded and the task answers control messages, markers and fetches in between; without it
/// a task short of capacity took its whole backlog as one batch, each longer than the last (the
/// 10 M-key scale-in: one batch per second of 50 k–500 k records, up to 7 s each).
pub(crate) const MAX_BATCH_RECORDS: usize = 8192;

/// The default of `[runtime] max_queued_records`: the records a Koala task may hold (queued, parked,
/// waiting for state) before it stops taking data input ([`KoalaTask::takes_data`](crate::koala::KoalaTask::takes_data)). Four full
/// batches: one waiting for state and a backlog that keeps the next ones full.
pub const DEFAULT_MAX_QUEUED_RECORDS: usize = 4 * MAX_BATCH_RECORDS;
