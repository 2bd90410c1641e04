//! The memory budget of a worker and its split among the stateful tasks it hosts
//! (docs/architecture.md §5, "Memory budget"). Pure arithmetic: the worker reads its machine's
//! memory and applies the rule, the coordinator prints what the workers report.

use serde::{Deserialize, Serialize};

use koala_types::TaskId;

/// The fraction of a machine's physical memory its workers' budgets share by default, as a
/// numerator over 10: Flink's `taskmanager.memory.managed.fraction` (0.4). Flink applies it to
/// a TaskManager's configured Flink memory; a worker has no such setting, so it is applied to
/// physical memory, and the other 60 % are left to the process's unbudgeted memory (code,
/// thread stacks, timers, sink buffers), the OS page cache the LSM reads through, and other
/// processes.
pub const MANAGED_FRACTION_TENTHS: u64 = 4;

/// Bytes a record is assumed to take in a queue when queues are charged to the budget: the
/// `Record` itself (two `Vec`s, event time, due time: 64 bytes) and its key and value on the
/// heap (the smallest allocations are 16 bytes each; ~32 more for typical keys and values).
pub const QUEUED_RECORD_BYTES: u64 = 128;

/// Where a worker's budget comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BudgetSource {
    /// `[runtime] worker_memory_mb`.
    Configured,
    /// [`MANAGED_FRACTION_TENTHS`] of the machine's memory over the workers on it.
    Derived {
        /// `MemTotal` of the machine, bytes.
        machine_bytes: u64,
        /// Workers of the job on this machine (same data-plane host).
        workers_on_machine: u32,
    },
}

/// The default budget of one worker: [`MANAGED_FRACTION_TENTHS`]/10 of the machine's memory,
/// split evenly among the job's workers on that machine.
pub fn default_worker_budget(machine_bytes: u64, workers_on_machine: u32) -> u64 {
    machine_bytes / 10 * MANAGED_FRACTION_TENTHS / u64::from(workers_on_machine.max(1))
}

/// `MemTotal` in bytes from the text of `/proc/meminfo`.
pub fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line.split_whitespace().skip(1);
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => value.checked_mul(1024),
        Some(_) => None,
    }
}

/// What one stateful task gets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskShare {
    /// The task.
    pub task: TaskId,
    /// Its share of the worker's budget (after the store's fixed part).
    pub share: u64,
    /// Charged to its input queues ([`crate::RuntimeOptions::queue_bytes_per_task`]).
    pub queues: u64,
    /// Charged to its store besides the cache (fjall: its keyspace's memtable).
    pub store: u64,
    /// Its state cache: the rest of the share (a Koala task's KLT is charged to it as it grows,
    /// up to half). `None` when `[state] cache_mb` fixes the cache or the backend has none.
    pub cache: Option<u64>,
}

/// A worker's budget and its split, reported to the coordinator at deployment and whenever a
/// reconfiguration adds or removes tasks on the worker (`koala run` prints it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryReport {
    /// The worker's budget, bytes.
    pub budget: u64,
    /// Where it comes from.
    pub source: BudgetSource,
    /// Taken off the top for the whole worker's store (fjall's shared block cache).
    pub worker_store: u64,
    /// Each hosted stateful task's share, by task.
    pub tasks: Vec<TaskShare>,
    /// `Some(bytes)` when `[state] cache_mb` fixes every task's cache instead.
    pub fixed_cache: Option<u64>,
}

/// The smallest cache a share leaves (a budget too small for the tasks still gets a working
/// cache; the print shows the shares, so an overcommitted budget is visible).
pub const MIN_CACHE_BYTES: u64 = 1 << 20;

/// Splits `budget` among `tasks`: the worker's store part (`worker_store`) off the top, the
/// rest in equal shares; each share pays its queues and its store part (`task_store`), and the
/// cache (if `cache_from_budget`) gets what is left, at least [`MIN_CACHE_BYTES`].
pub fn split_budget(
    budget: u64,
    worker_store: u64,
    tasks: &[TaskId],
    queues: u64,
    task_store: u64,
    cache_from_budget: bool,
) -> Vec<TaskShare> {
    let n = tasks.len().max(1) as u64;
    let share = budget.saturating_sub(worker_store) / n;
    tasks
        .iter()
        .map(|&task| TaskShare {
            task,
            share,
            queues,
            store: task_store,
            cache: cache_from_budget.then(|| share.saturating_sub(queues + task_store).max(MIN_CACHE_BYTES)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RuntimeOptions;
    use koala_types::OperatorId;

    #[test]
    fn the_default_budget_is_the_managed_fraction_over_the_workers_on_the_machine() {
        assert_eq!(parse_meminfo("MemTotal:       24683584 kB\nMemFree: 1 kB\n"), Some(24683584 * 1024));
        assert_eq!(parse_meminfo("MemFree: 1 kB\n"), None);
        let machine = 20 << 30;
        assert_eq!(default_worker_budget(machine, 1), machine / 10 * 4);
        assert_eq!(default_worker_budget(machine, 2), machine / 10 * 2);
    }

    #[test]
    fn a_budget_splits_evenly_and_each_share_pays_its_queues_before_the_cache() {
        let options = RuntimeOptions {
            batch_records: 256,
            linger_ms: 5,
            channel_capacity: 64,
            sink_dir: String::new(),
            capacity: Default::default(),
            max_queued_records: 32_768,
            checkpoint: Default::default(),
        };
        let queues = options.queue_bytes_per_task();
        assert_eq!(queues, (2 * 64 * 256 + 32_768) * QUEUED_RECORD_BYTES);
        let tasks: Vec<TaskId> = (0..3).map(|i| TaskId::new(OperatorId(1), i)).collect();
        let shares = split_budget(1 << 30, 256 << 20, &tasks, queues, 16 << 20, true);
        assert_eq!(shares.len(), 3);
        let share = (768u64 << 20) / 3;
        assert!(shares.iter().all(|s| s.share == share && s.cache == Some(share - queues - (16 << 20))));
        // One task fewer after a scale-in: the others' shares grow.
        let after = split_budget(1 << 30, 256 << 20, &tasks[..2], queues, 16 << 20, true);
        assert_eq!(after[0].share, (768u64 << 20) / 2);
        // Too small a budget still leaves a working cache; a fixed cache takes none.
        assert_eq!(split_budget(1 << 20, 0, &tasks, queues, 0, true)[0].cache, Some(MIN_CACHE_BYTES));
        assert_eq!(split_budget(1 << 30, 0, &tasks, queues, 0, false)[0].cache, None);
    }
}
