//! A model of the coordinator's deployment bookkeeping under a reconfiguration schedule, written
//! from `crates/coordinator/src/reconfig.rs` (`plan`) and `server.rs` (initial `plan`,
//! `next_index`): live task indices per operator, placement of every task ever created, and the
//! bucket routing of stateful operators. The random-schedule generator uses it to produce only
//! requests the coordinator accepts; the run checks use it to know which tasks a schedule creates
//! and which buckets each reconfiguration moves.
//!
//! What it mirrors:
//! - initial tasks `0..p` of every operator, task `i` on worker `i % workers`;
//! - rescale up: new indices `next, next+1, …` (indices are never reused), each placed on the
//!   least-loaded worker counting every task ever placed (cancelled tasks keep their placement),
//!   ties to the lowest worker id; rescale down: cancels the highest indices;
//! - migrate: task `i` is replaced by a new index on the given worker, which takes over its
//!   buckets; rejected if the task already runs there;
//! - rebalance: moved buckets get the given live task; rejected if nothing would move;
//! - stateful operators are routed by `partition::assign(policy, …)` after every rescale.

use std::collections::BTreeMap;

use koala_coordinator::JobConfig;
use koala_coordinator::config::{PolicyName, ScheduledReconfiguration};
use koala_coordinator::partition::assign;
use koala_dataflow::{JobGraph, Partitioning};
use koala_types::OperatorId;

/// One reconfiguration request.
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    /// Rescale to this many tasks.
    Rescale(u32),
    /// Buckets to a live task index.
    Rebalance(Vec<(Vec<u16>, u32)>),
    /// Task index to worker.
    Migrate {
        /// Task index.
        task: u32,
        /// Worker id.
        worker: u32,
    },
}

impl Request {
    /// The request a config entry describes.
    pub fn of(r: &ScheduledReconfiguration) -> Self {
        match (r.parallelism, &r.moves, r.task, r.worker) {
            (Some(p), None, None, None) => Self::Rescale(p),
            (None, Some(m), None, None) => {
                Self::Rebalance(m.iter().map(|m| (m.buckets.clone(), m.to)).collect())
            }
            (None, None, Some(task), Some(worker)) => Self::Migrate { task, worker },
            _ => panic!("malformed reconfiguration entry {r:?}"),
        }
    }

    /// The TOML keys of a `[[reconfigurations]]` entry (after `at_s` and `operator`).
    pub fn toml(&self) -> String {
        match self {
            Self::Rescale(p) => format!("parallelism = {p}\n"),
            Self::Rebalance(moves) => {
                let moves: Vec<String> = moves
                    .iter()
                    .map(|(b, to)| {
                        let b: Vec<String> = b.iter().map(u16::to_string).collect();
                        format!("{{ buckets = [{}], to = {to} }}", b.join(", "))
                    })
                    .collect();
                format!("moves = [{}]\n", moves.join(", "))
            }
            Self::Migrate { task, worker } => format!("task = {task}\nworker = {worker}\n"),
        }
    }
}

/// What one accepted request did.
#[derive(Clone, Debug)]
pub struct Applied {
    /// The operator.
    pub operator: String,
    /// `scale_out`, `scale_in`, `rebalance` or `migrate` (the metrics DB's `kind`).
    pub kind: &'static str,
    /// New task indices.
    pub created: Vec<u32>,
    /// Cancelled task indices.
    pub cancelled: Vec<u32>,
    /// Buckets whose owner changed (stateful operators).
    pub moved: Vec<u16>,
    /// Live task indices afterwards.
    pub live: Vec<u32>,
    /// Bucket → owner afterwards (stateful operators; empty otherwise).
    pub routing: Vec<u32>,
}

/// The model.
pub struct Model {
    graph: JobGraph,
    /// Buckets of every stateful operator.
    pub num_buckets: u16,
    policy: PolicyName,
    workers: u32,
    live: BTreeMap<String, Vec<u32>>,
    next: BTreeMap<String, u32>,
    placement: BTreeMap<(String, u32), u32>,
    routing: BTreeMap<String, Vec<u32>>,
}

/// Parses a config and builds its query's graph, as `koala run` does.
pub fn parse_config(text: &str) -> (JobConfig, JobGraph) {
    let config = JobConfig::parse(text, "test config").unwrap_or_else(|e| panic!("bad config: {e}\n{text}"));
    let graph = if config.query.starts_with("nexmark-") {
        let params: koala_workloads::nexmark::NexmarkParams =
            toml::from_str(&config.params_text()).unwrap_or_else(|e| panic!("bad params: {e}\n{text}"));
        koala_workloads::nexmark::build(&config.query, &params)
            .unwrap_or_else(|| panic!("no Nexmark query {:?}", config.query))
            .unwrap_or_else(|e| panic!("query does not build: {e}\n{text}"))
    } else if let Some(built) = {
        let params: koala_workloads::realworld::RealWorldParams =
            toml::from_str(&config.params_text()).unwrap_or_default();
        koala_workloads::realworld::build(&config.query, &params)
    } {
        built.unwrap_or_else(|e| panic!("query does not build: {e}\n{text}"))
    } else if let Some(built) = koala_connectors::queries::build_query(&config.query, &config.params_text()) {
        built.unwrap_or_else(|e| panic!("query does not build: {e}\n{text}"))
    } else {
        let params: koala_workloads::QueryParams =
            toml::from_str(&config.params_text()).unwrap_or_else(|e| panic!("bad params: {e}\n{text}"));
        koala_workloads::build_query(&config.query, &params)
            .unwrap_or_else(|e| panic!("query does not build: {e}\n{text}"))
    };
    (config, graph)
}

impl Model {
    /// The deployment a config starts with.
    pub fn new(config: &JobConfig, graph: JobGraph) -> Self {
        let parallelism = config.validate(&graph).unwrap_or_else(|e| panic!("invalid config: {e}"));
        let mut m = Self {
            num_buckets: config.num_buckets,
            policy: config.partition_policy,
            workers: config.workers,
            live: BTreeMap::new(),
            next: BTreeMap::new(),
            placement: BTreeMap::new(),
            routing: BTreeMap::new(),
            graph,
        };
        for (op, p) in m.graph.operators.iter().zip(&parallelism) {
            let tasks: Vec<u32> = (0..*p).collect();
            for i in &tasks {
                m.placement.insert((op.name.clone(), *i), i % m.workers);
            }
            if op.is_stateful() {
                m.routing.insert(op.name.clone(), assign(m.policy, m.num_buckets, &tasks));
            }
            m.next.insert(op.name.clone(), *p);
            m.live.insert(op.name.clone(), tasks);
        }
        m
    }

    /// Live task indices of `op`, in the coordinator's order.
    pub fn live(&self, op: &str) -> &[u32] {
        self.live.get(op).map(Vec::as_slice).unwrap_or_default()
    }

    /// The worker task `index` of `op` was placed on.
    pub fn worker_of(&self, op: &str, index: u32) -> Option<u32> {
        self.placement.get(&(op.to_string(), index)).copied()
    }

    /// Bucket → owner of a stateful `op`.
    pub fn routing(&self, op: &str) -> &[u32] {
        self.routing.get(op).map(Vec::as_slice).unwrap_or_default()
    }

    /// Whether `op` holds keyed state.
    pub fn is_stateful(&self, op: &str) -> bool {
        self.graph.by_name(op).is_some_and(|o| o.is_stateful())
    }

    /// Whether any operator of the job holds keyed state.
    pub fn has_stateful(&self) -> bool {
        self.graph.operators.iter().any(|o| o.is_stateful())
    }

    /// Worker count.
    pub fn workers(&self) -> u32 {
        self.workers
    }

    fn least_loaded(&self) -> u32 {
        let mut load: BTreeMap<u32, usize> = (0..self.workers).map(|w| (w, 0)).collect();
        for w in self.placement.values() {
            *load.entry(*w).or_default() += 1;
        }
        load.into_iter().min_by_key(|(w, n)| (*n, *w)).map_or(0, |(w, _)| w)
    }

    fn live_of(&self, id: OperatorId) -> Vec<u32> {
        self.graph.operator(id).map(|o| self.live(&o.name).to_vec()).unwrap_or_default()
    }

    /// Applies a request as the coordinator's `plan` would; `Err` if it would reject it (nothing
    /// changes then).
    pub fn apply(&mut self, op: &str, req: &Request) -> Result<Applied, String> {
        let spec = self.graph.by_name(op).ok_or_else(|| format!("no operator {op:?}"))?.clone();
        if spec.is_source() {
            return Err(format!("{op:?} is a source"));
        }
        if matches!(spec.kind, koala_dataflow::OperatorKind::Sink { .. }) {
            return Err(format!("{op:?} is a sink"));
        }
        if !spec.is_stateful() {
            let one_to_one = |consumer: OperatorId, input: usize, from: OperatorId| {
                let c = self.graph.operator(consumer);
                let u = self.graph.operator(from);
                matches!(
                    c.and_then(|c| c.inputs.get(input)).map(|i| &i.partitioning),
                    Some(Partitioning::Forward)
                ) && !c.is_some_and(|c| c.is_stateful())
                    && !u.is_some_and(|u| u.is_stateful())
                    && self.live_of(from) == self.live_of(consumer)
            };
            let touches = spec.inputs.iter().enumerate().any(|(i, input)| one_to_one(spec.id, i, input.from))
                || self.graph.consumers(spec.id).into_iter().any(|(c, i)| one_to_one(c, i, spec.id));
            if touches {
                return Err(format!("{op:?} is connected one-to-one to a neighbour"));
            }
        }
        let nb = self.num_buckets;
        let old_live = self.live(op).to_vec();
        let old_routing = self.routing(op).to_vec();
        let mut new_live = old_live.clone();
        let mut new_routing = old_routing.clone();
        let mut created = Vec::new();
        let mut cancelled = Vec::new();
        let mut next = self.next.get(op).copied().unwrap_or(0);
        // (`next` only advances within a rescale; afterwards `next` = max(created) + 1.)
        let mut placed = Vec::new();
        let kind;
        match req {
            Request::Rescale(p) => {
                let p = *p;
                let now = old_live.len() as u32;
                if p == 0 {
                    return Err("parallelism 0".into());
                }
                if spec.is_stateful() && p > u32::from(nb) {
                    return Err(format!("{p} tasks exceed {nb} buckets"));
                }
                if p == now {
                    return Err(format!("{op:?} already has {p} tasks"));
                }
                if p > now {
                    kind = "scale_out";
                    for _ in now..p {
                        let worker = self.least_loaded_with(&placed);
                        placed.push((next, worker));
                        created.push(next);
                        new_live.push(next);
                        next += 1;
                    }
                } else {
                    kind = "scale_in";
                    new_live.sort_unstable();
                    cancelled = new_live.split_off(p as usize);
                }
                if spec.is_stateful() {
                    new_routing = assign(self.policy, nb, &new_live);
                }
            }
            Request::Rebalance(moves) => {
                kind = "rebalance";
                if !spec.is_stateful() {
                    return Err(format!("{op:?} holds no keyed state"));
                }
                if moves.is_empty() {
                    return Err("no moves".into());
                }
                for (buckets, to) in moves {
                    if !old_live.contains(to) {
                        return Err(format!("task {to} of {op:?} does not exist; live {old_live:?}"));
                    }
                    for b in buckets {
                        let slot =
                            new_routing.get_mut(usize::from(*b)).ok_or(format!("bucket {b} out of range"))?;
                        *slot = *to;
                    }
                }
            }
            Request::Migrate { task, worker } => {
                kind = "migrate";
                if !old_live.contains(task) {
                    return Err(format!("{op:?} has no task {task}; live {old_live:?}"));
                }
                if *worker >= self.workers {
                    return Err(format!("no worker {worker}"));
                }
                if self.worker_of(op, *task) == Some(*worker) {
                    return Err(format!("task {task} of {op:?} already runs on worker {worker}"));
                }
                placed.push((next, *worker));
                created.push(next);
                cancelled.push(*task);
                for t in new_live.iter_mut().filter(|t| **t == *task) {
                    *t = next;
                }
                for t in new_routing.iter_mut().filter(|t| **t == *task) {
                    *t = next;
                }
            }
        }
        let moved: Vec<u16> = old_routing
            .iter()
            .zip(&new_routing)
            .enumerate()
            .filter(|(_, (o, n))| o != n)
            .map(|(b, _)| b as u16)
            .collect();
        if matches!(req, Request::Rebalance(_)) && moved.is_empty() {
            return Err("every bucket already belongs to the task given; nothing would move".into());
        }
        for (i, w) in placed {
            self.placement.insert((op.to_string(), i), w);
        }
        if let Some(max) = created.iter().max() {
            self.next.insert(op.to_string(), max + 1);
        }
        self.live.insert(op.to_string(), new_live.clone());
        if spec.is_stateful() {
            self.routing.insert(op.to_string(), new_routing.clone());
        }
        Ok(Applied {
            operator: op.to_string(),
            kind,
            created,
            cancelled,
            moved,
            live: new_live,
            routing: if spec.is_stateful() { new_routing } else { Vec::new() },
        })
    }

    /// Least-loaded worker counting tasks placed so far plus `pending` placements.
    fn least_loaded_with(&self, pending: &[(u32, u32)]) -> u32 {
        if pending.is_empty() {
            return self.least_loaded();
        }
        let mut load: BTreeMap<u32, usize> = (0..self.workers).map(|w| (w, 0)).collect();
        for w in self.placement.values().chain(pending.iter().map(|(_, w)| w)) {
            *load.entry(*w).or_default() += 1;
        }
        load.into_iter().min_by_key(|(w, n)| (*n, *w)).map_or(0, |(w, _)| w)
    }
}

/// The schedule of a config in the order the coordinator runs it (stable sort by `at_s`).
pub fn schedule(config: &JobConfig) -> Vec<(f64, String, Request)> {
    let mut s: Vec<(f64, String, Request)> =
        config.reconfigurations.iter().map(|r| (r.at_s, r.operator.clone(), Request::of(r))).collect();
    s.sort_by(|a, b| a.0.total_cmp(&b.0));
    s
}

/// Applies a config's whole schedule to its initial deployment; `Err` names the first request
/// the coordinator would reject.
pub fn apply_schedule(text: &str) -> Result<(Model, Vec<Applied>), String> {
    let (config, graph) = parse_config(text);
    let mut model = Model::new(&config, graph);
    let mut applied = Vec::new();
    for (i, (at, op, req)) in schedule(&config).into_iter().enumerate() {
        let a = model.apply(&op, &req).map_err(|e| format!("reconfiguration {i} (at {at} s, {op}): {e}"))?;
        applied.push(a);
    }
    Ok((model, applied))
}
