//! Names of the per-second metrics tasks report (docs/architecture.md §9 defines each). One
//! place, so the runtime that samples them and `koala report` that plots them cannot drift apart.

/// Records a task took from its inputs (sources: records generated or read).
pub const RECORDS_IN: &str = "records_in";
/// Records a task emitted downstream (sinks: records written).
pub const RECORDS_OUT: &str = "records_out";
/// Sources and sinks, a gauge: records emitted (sources) or written (sinks) since the job's start,
/// a task restored from a checkpoint counting on from what it had there. The latest sample of
/// each task is what the run took and wrote *once*: `records_in` / `records_out` also count what a
/// recovery replayed.
pub const RECORDS_TOTAL: &str = "records_total";
/// Batches processed.
pub const BATCHES: &str = "batches";
/// Mean per-batch latency, microseconds: from when the task took the batch's first record from its
/// inputs to the end of the batch's last output, including every wait for state (a Koala fetch, a
/// DRRS bucket's arrival, a remote round trip), excluding only the capacity emulation's throttle.
pub const BATCH_LATENCY_MEAN_US: &str = "batch_latency_mean_us";
/// 99th percentile per-batch latency, microseconds.
pub const BATCH_LATENCY_P99_US: &str = "batch_latency_p99_us";
/// Longest batch of the second, microseconds: a single stall (one batch among hundreds) is above
/// the 99th percentile and shows only here and in the mean.
pub const BATCH_LATENCY_MAX_US: &str = "batch_latency_max_us";
/// Mean source lag (now − the time the record was due or entered the topic), milliseconds; every
/// record counts when emitted, and a paced source adds one sample per second for its oldest
/// overdue record not yet emitted (so a paused or blocked source shows its lag growing).
pub const SOURCE_LAG_MEAN_MS: &str = "source_lag_mean_ms";
/// 99th percentile source lag, milliseconds.
pub const SOURCE_LAG_P99_MS: &str = "source_lag_p99_ms";
/// Sinks: median end-to-end latency of the records written this second, milliseconds: arrival at
/// the sink − the time the record was due at its source (`Record::due_ms`; a timer's output: the
/// latest due time its task had processed). Records queued anywhere in the job count.
pub const LATENCY_P50_MS: &str = "latency_p50_ms";
/// Sinks: 99th percentile end-to-end latency, milliseconds.
pub const LATENCY_P99_MS: &str = "latency_p99_ms";
/// Sinks: largest end-to-end latency of the second, milliseconds.
pub const LATENCY_MAX_MS: &str = "latency_max_ms";
/// State entries read from the store.
pub const STATE_READS: &str = "state_reads";
/// State entries written or deleted in the store.
pub const STATE_WRITES: &str = "state_writes";
/// Milliseconds this second the task spent blocked on a full downstream queue or socket.
pub const BACKPRESSURE_MS: &str = "backpressure_ms";
/// Records dropped because they were behind the watermark by more than the allowed lateness.
pub const LATE_DROPPED: &str = "late_dropped";
/// Bytes of state this task sent to another task because a record there needed it now (a Koala
/// fetch of a key a batch holds). State bytes count, per entry, its stored key (bucket, state id,
/// user key) and its value; a timer counts its key and 8 bytes (docs/architecture.md §9).
pub const STATE_BYTES_ON_DEMAND: &str = "state_bytes_on_demand";
/// Bytes of state this task sent to another task while both kept processing, without a record
/// asking for it: Koala's progressive migration and background drain, DRRS's bucket pushes.
pub const STATE_BYTES_BACKGROUND: &str = "state_bytes_background";
/// Bytes of state this task gave up as part of a hand-over, before the new owner could process
/// the moved buckets: stop-and-restart's transfer, Remote's write-back of its buffered entries to
/// the state servers, a Koala hand-over's messages (key-lookup entries and timers: no state since
/// lazy windows).
pub const STATE_BYTES_EAGER: &str = "state_bytes_eager";
/// Koala: keys this location sent to other tasks, fetched on demand or pulled in the background
/// (how fast a cancelled task drains).
pub const STATE_KEYS_SENT: &str = "state_keys_sent";
/// Koala: keys this task asked another for that it did not hold (filter false positives, and
/// lookups while a filter was still being built).
pub const FETCH_NOT_HERE: &str = "fetch_not_here";
/// Throttled tasks (`task_records_per_sec`): milliseconds this second data input was held back by
/// the task's processing budget.
pub const THROTTLED_MS: &str = "throttled_ms";
/// Throttled tasks, in seconds they processed at least half their budget: records per second of
/// batch processing time (what the task could do with the CPU it got); below the budget means
/// the machine cannot deliver the emulated capacity.
pub const CAPACITY_RECORDS_PER_SEC: &str = "capacity_records_per_sec";

/// Records the task took from its inputs and has not handed to its operator yet, at the end of
/// the second: Koala's queued, parked and waiting-for-state records, DRRS's wait buffer; 0 under
/// stop-and-restart and Remote, which process what they take (records still in the task's input
/// queue are not counted). Stateful operators only.
pub const QUEUED_RECORDS: &str = "queued_records";
/// The most records the task held as `queued_records` counts them at any moment of the second
/// (after each event its protocol core handled): a second's peak, which the end-of-second gauge
/// misses when the queue drains before the tick.
pub const QUEUED_RECORDS_MAX: &str = "queued_records_max";
/// Milliseconds this second the task had input waiting and took none because its protocol held
/// it back: stop-and-restart's pause between `Drain` and `Resume` (upstream tasks; a source always
/// has input waiting), DRRS's full wait buffer, Koala's `max_queued_records`. Not the capacity
/// emulation's throttle (`throttled_ms`) nor a full downstream queue or peer lane
/// (`backpressure_ms`).
pub const INPUT_PAUSED_MS: &str = "input_paused_ms";

/// External sources: records not yet read (Kafka: high watermark − next offset, summed).
pub const SOURCE_OFFSET_LAG: &str = "source_offset_lag";
/// External sources: records skipped this second because they could not be decoded (a Kafka
/// record that is not the topic's format); `koala run`'s summary totals them per source.
pub const RECORDS_MALFORMED: &str = "records_malformed";
/// Koala: memory of the task's key lookup table, bytes.
pub const KLT_BYTES: &str = "klt_bytes";
/// Koala: keys the task's key lookup table lists explicitly.
pub const KLT_ENTRIES: &str = "klt_entries";
/// Koala: mean time per batch the core spent looking its keys up (own store first, then the KLT), µs.
pub const KLT_LOOKUP_MEAN_US: &str = "klt_lookup_mean_us";
/// Stateful tasks with a state cache: keys their reads found in the cache (no read below).
pub const CACHE_HITS: &str = "cache_hits";
/// Stateful tasks with a state cache: keys their reads did not find in the cache.
pub const CACHE_MISSES: &str = "cache_misses";

/// Milliseconds the task was busy in the interval its sample covers: processing batches and
/// timer rounds, plus the time the capacity emulation held its input back (`throttled_ms`: the
/// emulated task is still working). An interval may exceed a second when the task was held at the
/// boundary, so the value is not clamped at 1000; the autoscaler sums it over its window.
pub const BUSY_MS: &str = "busy_ms";

/// Stateful tasks: records of one bucket they processed in the interval, as the metric
/// `bucket_records.<bucket>` (one sample per bucket that had records; [`bucket_records`] names it,
/// [`bucket_of_metric`] reads it back). The autoscaler's per-bucket load.
pub const BUCKET_RECORDS_PREFIX: &str = "bucket_records.";

/// The metric of bucket `bucket`'s records: `bucket_records.<bucket>`.
pub fn bucket_records(bucket: u16) -> String {
    format!("{BUCKET_RECORDS_PREFIX}{bucket}")
}

/// The bucket of a `bucket_records.<bucket>` metric name, `None` for any other name.
pub fn bucket_of_metric(name: &str) -> Option<u16> {
    name.strip_prefix(BUCKET_RECORDS_PREFIX)?.parse().ok()
}

/// Every metric name above, for validation and reports.
pub const ALL: &[&str] = &[
    RECORDS_IN,
    RECORDS_OUT,
    BATCHES,
    BATCH_LATENCY_MEAN_US,
    BATCH_LATENCY_P99_US,
    BATCH_LATENCY_MAX_US,
    SOURCE_LAG_MEAN_MS,
    SOURCE_LAG_P99_MS,
    LATENCY_P50_MS,
    LATENCY_P99_MS,
    LATENCY_MAX_MS,
    STATE_READS,
    STATE_WRITES,
    BACKPRESSURE_MS,
    LATE_DROPPED,
    STATE_BYTES_ON_DEMAND,
    STATE_BYTES_BACKGROUND,
    STATE_BYTES_EAGER,
    STATE_KEYS_SENT,
    FETCH_NOT_HERE,
    THROTTLED_MS,
    CAPACITY_RECORDS_PER_SEC,
    QUEUED_RECORDS,
    QUEUED_RECORDS_MAX,
    INPUT_PAUSED_MS,
    SOURCE_OFFSET_LAG,
    RECORDS_MALFORMED,
    KLT_BYTES,
    KLT_ENTRIES,
    KLT_LOOKUP_MEAN_US,
    CACHE_HITS,
    CACHE_MISSES,
    BUSY_MS,
    RECORDS_TOTAL,
];
