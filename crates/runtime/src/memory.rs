//! A worker's memory budget, split among the stateful tasks it hosts and re-split whenever a
//! task starts or ends here (docs/architecture.md §5, "Memory budget"). The rule is
//! `koala_protocol::memory`; this applies it to the state env's caches and reports it.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use crossbeam_channel::Sender;
use koala_protocol::memory::{
    BudgetSource, MemoryReport, default_worker_budget, parse_meminfo, split_budget,
};
use koala_protocol::{Deployment, StateBackendKind, StateOptions, WorkerMessage};
use koala_state::{FjallConfig, StateEnv};
use koala_types::{TaskId, WorkerId};

/// Assumed when `/proc/meminfo` cannot be read (not Linux): the budget is then a guess, and the
/// printed source says so through the machine size; set `[runtime] worker_memory_mb`.
const UNKNOWN_MACHINE_BYTES: u64 = 8 << 30;

/// The machine's physical memory, bytes.
fn machine_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| parse_meminfo(&t)).unwrap_or_else(|| {
        tracing::warn!(
            "cannot read MemTotal from /proc/meminfo; assuming 8 GiB (set [runtime] worker_memory_mb)"
        );
        UNKNOWN_MACHINE_BYTES
    })
}

/// The host part of a `host:port` address.
fn host(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(host, _)| host)
}

/// One worker's budget and the stateful tasks sharing it.
pub(crate) struct WorkerMemory {
    plan: Mutex<Plan>,
}

struct Plan {
    budget: u64,
    source: BudgetSource,
    worker_store: u64,
    task_store: u64,
    queues: u64,
    cache_from_budget: bool,
    fixed_cache: Option<u64>,
    tasks: BTreeSet<TaskId>,
    env: Arc<dyn StateEnv>,
    events: Sender<WorkerMessage>,
}

impl WorkerMemory {
    /// The budget of worker `me` of deployment `d`: `[runtime] worker_memory_mb` if given, else
    /// the default over the job's workers on this machine (same data-plane host as `me`).
    pub(crate) fn new(
        state: &StateOptions,
        d: &Deployment,
        me: WorkerId,
        env: Arc<dyn StateEnv>,
        events: Sender<WorkerMessage>,
    ) -> Self {
        let (budget, source) = match state.worker_memory_bytes {
            Some(bytes) => (bytes, BudgetSource::Configured),
            None => {
                let mine = d.workers.get(&me).map(|a| host(a));
                let workers_on_machine =
                    d.workers.values().filter(|a| Some(host(a)) == mine).count().max(1) as u32;
                let machine_bytes = machine_bytes();
                (
                    default_worker_budget(machine_bytes, workers_on_machine),
                    BudgetSource::Derived { machine_bytes, workers_on_machine },
                )
            }
        };
        let fjall = FjallConfig::default();
        let (worker_store, task_store) = match state.backend {
            StateBackendKind::Fjall => (fjall.cache_bytes, fjall.memtable_bytes),
            _ => (0, 0),
        };
        let has_cache = matches!(state.backend, StateBackendKind::Fjall | StateBackendKind::Remote);
        Self {
            plan: Mutex::new(Plan {
                budget,
                source,
                worker_store,
                task_store,
                queues: d.options.queue_bytes_per_task(),
                cache_from_budget: state.cache_from_budget,
                fixed_cache: (has_cache && !state.cache_from_budget).then_some(state.cache_bytes),
                tasks: BTreeSet::new(),
                env,
                events,
            }),
        }
    }

    /// Stateful tasks start on this worker (deployment or reconfiguration): re-split.
    pub(crate) fn add(&self, tasks: impl IntoIterator<Item = TaskId>) {
        if let Ok(mut plan) = self.plan.lock() {
            let before = plan.tasks.len();
            plan.tasks.extend(tasks);
            if plan.tasks.len() != before {
                plan.split();
            }
        }
    }

    /// A stateful task ended here (finished, released or failed): re-split among the rest.
    pub(crate) fn remove(&self, task: TaskId) {
        if let Ok(mut plan) = self.plan.lock()
            && plan.tasks.remove(&task)
        {
            plan.split();
        }
    }
}

impl Plan {
    /// Gives every hosted task's cache its share and reports the split.
    fn split(&mut self) {
        let tasks: Vec<TaskId> = self.tasks.iter().copied().collect();
        let shares = split_budget(
            self.budget,
            self.worker_store,
            &tasks,
            self.queues,
            self.task_store,
            self.cache_from_budget,
        );
        for share in &shares {
            if let Some(cache) = share.cache {
                let bytes = usize::try_from(cache).unwrap_or(usize::MAX);
                if let Err(e) = self.env.set_cache_budget(share.task, bytes) {
                    tracing::error!(task = %share.task, error = %e, "resizing the state cache");
                }
            }
        }
        let _ = self.events.send(WorkerMessage::Memory(MemoryReport {
            budget: self.budget,
            source: self.source,
            worker_store: self.worker_store,
            tasks: shares,
            fixed_cache: self.fixed_cache,
        }));
    }
}
