//! Where tasks run and which buckets they own when a job starts (docs/architecture.md §6).

use std::collections::BTreeMap;

use koala_dataflow::JobGraph;
use koala_protocol::{Deployment, RuntimeOptions};
use koala_types::{TaskId, WorkerId};

use crate::config::JobConfig;
use crate::partition::assign;

/// Places tasks round-robin over workers and assigns buckets of stateful operators.
pub(crate) fn initial_deployment(
    config: &JobConfig,
    graph: &JobGraph,
    parallelism: &[u32],
    workers: &BTreeMap<WorkerId, String>,
    run: &str,
) -> Deployment {
    let worker_ids: Vec<WorkerId> = workers.keys().copied().collect();
    let mut placement = BTreeMap::new();
    let mut tasks = BTreeMap::new();
    let mut routing = BTreeMap::new();
    for (op, p) in graph.operators.iter().zip(parallelism) {
        tasks.insert(op.id, (0..*p).collect::<Vec<u32>>());
        for i in 0..*p {
            placement.insert(TaskId::new(op.id, i), worker_ids[i as usize % worker_ids.len()]);
        }
        if op.is_stateful() {
            let live: Vec<u32> = (0..*p).collect();
            routing.insert(op.id, assign(config.partition_policy, config.num_buckets, &live));
        }
    }
    Deployment {
        run: run.to_string(),
        query: config.query.clone(),
        query_params: config.params_text(),
        workers: workers.clone(),
        placement,
        tasks,
        epoch: 0,
        routing,
        num_buckets: config.num_buckets,
        protocol: config.protocol,
        extra_keys: config.extra_keys,
        drain_keys_per_sec: config.drain_keys_per_sec,
        finished: Default::default(),
        options: RuntimeOptions {
            batch_records: config.runtime.batch_records,
            linger_ms: config.runtime.linger_ms,
            channel_capacity: config.runtime.channel_capacity,
            sink_dir: config.output_dir.to_string_lossy().into_owned(),
            capacity: config.runtime.capacity(),
            max_queued_records: config.runtime.max_queued_records,
            checkpoint: koala_protocol::CheckpointOptions {
                dir: config.checkpoint_dir().map(|d| d.to_string_lossy().into_owned()),
                restore: None,
            },
        },
    }
}

/// The worker with the fewest tasks (ties: the lowest id): where a reconfiguration puts a new task.
pub(crate) fn least_loaded(d: &Deployment, workers: &[WorkerId]) -> WorkerId {
    let mut load: BTreeMap<WorkerId, usize> = workers.iter().map(|w| (*w, 0)).collect();
    for w in d.placement.values() {
        *load.entry(*w).or_default() += 1;
    }
    load.into_iter().min_by_key(|(w, n)| (*n, *w)).map(|(w, _)| w).unwrap_or(WorkerId(0))
}
