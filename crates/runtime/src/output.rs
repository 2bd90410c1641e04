//! A task's outputs: per downstream edge, route each record (round-robin, or by bucket through
//! the routing table), batch per channel, flush when a batch is full or has lingered.
//!
//! Every edge runs the protocol's routing core, [`UpstreamRouter`] (the one the simulator
//! drives): its table decides which task a bucket goes to, and at a reconfiguration it decides
//! the switch — a marker on which channel, which channels end, which new ones get the current
//! watermark. This module only carries its actions out: it opens the channels a switch adds,
//! sends, and closes the channels it dropped.

use std::time::{Duration, Instant};

use koala_dataflow::graph::KeyFn;
use koala_protocol::koala::{RouterAction, RouterEvent, UpstreamRouter};
use koala_types::{ChannelMessage, OperatorId, Record, TaskId, bucket_of};

use crate::RuntimeError;
use crate::channel::ChannelSender;

/// How a record picks its task among an edge's outputs.
pub enum Spread {
    /// Round-robin (forward and rebalance edges; a one-to-one edge has a single output).
    RoundRobin,
    /// By bucket of the recomputed key, through the router's table.
    Key(KeyFn),
}

/// One downstream edge: its router and one channel per output of the router, in its order.
pub struct OutputEdge {
    consumer: OperatorId,
    input: usize,
    spread: Spread,
    router: UpstreamRouter,
    targets: Vec<ChannelSender>,
    /// Keyed: bucket → position in `targets`, the router's table by position.
    positions: Vec<u32>,
    buffers: Vec<Vec<Record>>,
    since: Vec<Option<Instant>>,
    next: usize,
}

impl OutputEdge {
    /// An edge to input `input` of `consumer` routed by `router`, over `targets`: one channel
    /// per output of the router.
    pub fn new(
        consumer: OperatorId,
        input: usize,
        spread: Spread,
        router: UpstreamRouter,
        targets: Vec<ChannelSender>,
    ) -> Result<Self, RuntimeError> {
        let mut edge = Self {
            consumer,
            input,
            spread,
            router,
            targets,
            positions: Vec::new(),
            buffers: Vec::new(),
            since: Vec::new(),
            next: 0,
        };
        edge.follow_router()?;
        Ok(edge)
    }

    /// The task each bucket's records go to, as this edge sends them (empty if unkeyed).
    #[cfg(test)]
    pub fn routing(&self) -> Vec<TaskId> {
        self.positions.iter().map(|&p| self.targets[p as usize].to()).collect()
    }

    /// The tasks this edge has a channel to.
    pub fn channels(&self) -> Vec<TaskId> {
        self.targets.iter().map(ChannelSender::to).collect()
    }

    /// Puts the channels in the router's output order, closes those it no longer names, and
    /// derives the bucket → position table from the router's table. Every buffer is empty.
    fn follow_router(&mut self) -> Result<(), RuntimeError> {
        let mut by_task: std::collections::BTreeMap<TaskId, ChannelSender> =
            std::mem::take(&mut self.targets).into_iter().map(|t| (t.to(), t)).collect();
        for &to in self.router.outputs() {
            let sender = by_task.remove(&to).ok_or(RuntimeError::NoInbox(to))?;
            self.targets.push(sender);
        }
        // What is left was dropped by the switch and got its end of stream: closed here.
        drop(by_task);
        let order: Vec<TaskId> = self.channels();
        self.positions = self
            .router
            .table()
            .iter()
            .map(|t| order.iter().position(|o| o == t).map(|p| p as u32).ok_or(RuntimeError::NoInbox(*t)))
            .collect::<Result<_, _>>()?;
        let n = self.targets.len();
        self.buffers = vec![Vec::new(); n];
        self.since = vec![None; n];
        self.next = 0;
        Ok(())
    }
}

/// All outputs of a task.
pub struct Outputs {
    edges: Vec<OutputEdge>,
    batch_records: usize,
    linger: Duration,
    /// Time spent blocked on full channels since last taken.
    pub backpressure: Duration,
}

impl Outputs {
    /// Outputs over `edges`.
    pub fn new(edges: Vec<OutputEdge>, batch_records: usize, linger: Duration) -> Self {
        Self { edges, batch_records: batch_records.max(1), linger, backpressure: Duration::ZERO }
    }

    /// The output edges.
    #[cfg(test)]
    pub fn edges(&self) -> &[OutputEdge] {
        &self.edges
    }

    /// Routes records to every edge; full batches go out at once.
    pub fn emit(&mut self, mut records: Vec<Record>) -> Result<(), RuntimeError> {
        self.emit_from(&mut records)
    }

    /// Routes and takes every record of `records`, leaving it empty with its capacity, so a
    /// caller that fills the same vector again allocates nothing per batch.
    pub fn emit_from(&mut self, records: &mut Vec<Record>) -> Result<(), RuntimeError> {
        if records.is_empty() || self.edges.is_empty() {
            records.clear();
            return Ok(());
        }
        let now = Instant::now();
        let last = self.edges.len() - 1;
        for e in 0..self.edges.len() {
            if e == last {
                for record in records.drain(..) {
                    self.route(e, record, now)?;
                }
            } else {
                for record in records.iter() {
                    self.route(e, record.clone(), now)?;
                }
            }
        }
        Ok(())
    }

    /// Appends `record` to the batch of its target on edge `e`; sends the batch once full.
    fn route(&mut self, e: usize, mut record: Record, now: Instant) -> Result<(), RuntimeError> {
        let edge = &mut self.edges[e];
        let target = match &edge.spread {
            Spread::RoundRobin => {
                edge.next = (edge.next + 1) % edge.targets.len();
                edge.next
            }
            Spread::Key(key_fn) => {
                record.key = key_fn(&record.value).map_err(koala_dataflow::DataflowError::from)?;
                let buckets = edge.positions.len() as u16;
                let target = edge.positions[usize::from(bucket_of(&record.key, buckets))] as usize;
                debug_assert_eq!(edge.router.route(&record.key), Some(edge.targets[target].to()));
                target
            }
        };
        let buf = &mut edge.buffers[target];
        if buf.is_empty() {
            edge.since[target] = Some(now);
            // One allocation per batch instead of a doubling series.
            buf.reserve(self.batch_records);
        }
        buf.push(record);
        if buf.len() >= self.batch_records {
            self.flush_one(e, target)?;
        }
        Ok(())
    }

    fn flush_one(&mut self, edge: usize, target: usize) -> Result<(), RuntimeError> {
        let e = &mut self.edges[edge];
        if e.buffers[target].is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut e.buffers[target]);
        e.since[target] = None;
        self.backpressure += e.targets[target].send(ChannelMessage::Batch(batch))?;
        Ok(())
    }

    /// Flushes every batch that has waited `linger` or longer.
    pub fn flush_due(&mut self, now: Instant) -> Result<(), RuntimeError> {
        for e in 0..self.edges.len() {
            for t in 0..self.edges[e].targets.len() {
                if self.edges[e].since[t].is_some_and(|s| now.duration_since(s) >= self.linger) {
                    self.flush_one(e, t)?;
                }
            }
        }
        Ok(())
    }

    /// When the oldest buffered batch must go out.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.edges.iter().flat_map(|e| e.since.iter().flatten()).min().map(|s| *s + self.linger)
    }

    /// Flushes every buffered batch.
    pub fn flush_all(&mut self) -> Result<(), RuntimeError> {
        for e in 0..self.edges.len() {
            for t in 0..self.edges[e].targets.len() {
                self.flush_one(e, t)?;
            }
        }
        Ok(())
    }

    /// Flushes, then gives every edge's router `message` (a watermark, a stop-and-restart marker,
    /// the end of stream) and sends what it decides. Records buffered before it are therefore
    /// ahead of it, as FIFO requires.
    pub fn broadcast(&mut self, message: &ChannelMessage) -> Result<(), RuntimeError> {
        self.flush_all()?;
        let event = match message {
            ChannelMessage::Watermark(w) => RouterEvent::Watermark(*w),
            ChannelMessage::Marker(epoch) => RouterEvent::Mark { epoch: *epoch },
            ChannelMessage::EndOfStream => RouterEvent::EndOfStream,
            other => {
                return Err(RuntimeError::Control(format!(
                    "a broadcast of {other:?}, which no router carries"
                )));
            }
        };
        for edge in &mut self.edges {
            let actions = edge.router.on(event.clone());
            self.backpressure += edge.carry_out(actions)?;
        }
        Ok(())
    }

    /// Flushes, then sends the barrier of checkpoint `id` on every output channel (no router
    /// decides: a checkpoint never runs during a reconfiguration, so every channel is current).
    pub fn broadcast_barrier(&mut self, id: koala_types::CheckpointId) -> Result<(), RuntimeError> {
        self.flush_all()?;
        for edge in &mut self.edges {
            for target in &mut edge.targets {
                self.backpressure += target.send(ChannelMessage::Barrier(id))?;
            }
        }
        Ok(())
    }

    /// Switches the edges to `consumer` (a reconfiguration): each edge's router takes
    /// `event(input, keyed)` and decides; this sends its markers, ends and watermarks, opening a
    /// channel to a task it names for the first time with `open(input, task)`, and closes the
    /// channels it dropped. Kept channels are the same connections, so per-channel FIFO holds
    /// across the switch.
    pub fn switch_edges(
        &mut self,
        consumer: OperatorId,
        event: impl Fn(usize, bool) -> Result<RouterEvent, RuntimeError>,
        mut open: impl FnMut(usize, TaskId) -> Result<ChannelSender, RuntimeError>,
    ) -> Result<(), RuntimeError> {
        self.flush_all()?;
        for edge in self.edges.iter_mut().filter(|e| e.consumer == consumer) {
            let actions = edge.router.on(event(edge.input, edge.router.is_keyed())?);
            // Every output the core names now has a channel (sent to or not), before the sends.
            let new: Vec<TaskId> =
                edge.router.outputs().iter().copied().filter(|t| !edge.channels().contains(t)).collect();
            for to in new {
                edge.targets.push(open(edge.input, to)?);
            }
            self.backpressure += edge.carry_out(actions)?;
            edge.follow_router()?;
        }
        Ok(())
    }
}

impl OutputEdge {
    /// Sends what the router decided on channels the edge has; returns the time blocked.
    fn carry_out(&mut self, actions: Vec<RouterAction>) -> Result<Duration, RuntimeError> {
        let mut blocked = Duration::ZERO;
        for action in actions {
            match action {
                RouterAction::Send { to, message } => {
                    let target = self.targets.iter_mut().find(|t| t.to() == to);
                    blocked += target.ok_or(RuntimeError::NoInbox(to))?.send(message)?;
                }
                RouterAction::Error(source) => {
                    return Err(RuntimeError::Routing { consumer: self.consumer, source });
                }
            }
        }
        Ok(blocked)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet, HashMap};
    use std::sync::{Arc, RwLock};

    use koala_types::{ChannelMessage, InputChannel, OperatorId, Record, TaskId};

    use super::*;
    use crate::queue::DataReceiver;
    use crate::worker::create_inbox;

    const BUCKETS: usize = 16;
    const POOL: u32 = 6;

    /// xorshift64*: the schedule's draws.
    struct Draws(u64);
    impl Draws {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
        }
        fn subset(&mut self, pool: &[TaskId]) -> Vec<TaskId> {
            let mut s: Vec<TaskId> = pool.iter().copied().filter(|_| self.below(2) == 0).collect();
            if s.is_empty() {
                s.push(pool[self.below(pool.len())]);
            }
            s
        }
        fn table(&mut self, live: &[TaskId]) -> Vec<TaskId> {
            (0..BUCKETS).map(|_| live[self.below(live.len())]).collect()
        }
    }

    /// What every task received on the edge's channels since the last look, in order.
    fn received(queues: &HashMap<TaskId, DataReceiver>) -> BTreeMap<TaskId, Vec<ChannelMessage>> {
        let mut got: BTreeMap<TaskId, Vec<ChannelMessage>> = BTreeMap::new();
        for (&to, q) in queues {
            while let Ok(item) = q.queue().try_recv() {
                q.took();
                got.entry(to).or_default().push(item.message);
            }
        }
        got
    }

    /// What the core decided, per task, in order.
    fn decided(actions: Vec<RouterAction>) -> BTreeMap<TaskId, Vec<ChannelMessage>> {
        let mut out: BTreeMap<TaskId, Vec<ChannelMessage>> = BTreeMap::new();
        for a in actions {
            match a {
                RouterAction::Send { to, message } => out.entry(to).or_default().push(message),
                RouterAction::Error(e) => panic!("the reference core refused: {e}"),
            }
        }
        out
    }

    /// The runtime's edge and the protocol's router, fed one random schedule of records,
    /// watermarks, Koala/DRRS switches (with kept tasks) and stop-and-restart drains and resumes:
    /// after every step the edge's routing table and channels equal the core's, and every task
    /// received exactly the messages the core decided, in its order.
    #[test]
    fn an_edge_routes_and_switches_as_the_core_decides() {
        let consumer = OperatorId(1);
        let me = TaskId::new(OperatorId(0), 0);
        let pool: Vec<TaskId> = (0..POOL).map(|i| TaskId::new(consumer, i)).collect();
        for seed in 1..=20u64 {
            let mut draw = Draws(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let inboxes = Arc::new(RwLock::new(HashMap::new()));
            let mut queues = HashMap::new();
            for &t in &pool {
                let (q, _commands) = create_inbox(t, 1 << 16, &inboxes).expect("inbox");
                queues.insert(t, q.data);
            }
            let open = |input: usize, to: TaskId| {
                let inbox = inboxes.read().expect("inboxes")[&to].for_input(input);
                Ok(ChannelSender::Local { to, inbox, channel: InputChannel { input, from: me } })
            };
            let live = draw.subset(&pool);
            let mut core = UpstreamRouter::new(draw.table(&live)).expect("table");
            let targets = core.outputs().iter().map(|&t| open(0, t).expect("open")).collect();
            let key_fn: KeyFn = Arc::new(|v: &[u8]| Ok(v.to_vec()));
            let edge =
                OutputEdge::new(consumer, 0, Spread::Key(key_fn), core.clone(), targets).expect("edge");
            let mut outputs = Outputs::new(vec![edge], 1 << 20, Duration::from_secs(60));
            let (mut epoch, mut time, mut switches, mut dropped) = (0, 0, 0, 0);
            for step in 0..80 {
                let expected = match draw.below(5) {
                    0 | 1 => {
                        let records: Vec<Record> = (0..1 + draw.below(20))
                            .map(|i| {
                                let key = format!("k{}", draw.below(1000)).into_bytes();
                                Record { key: key.clone(), value: key, time: i as u64, due_ms: 0 }
                            })
                            .collect();
                        outputs.emit(records.clone()).expect("emit");
                        outputs.flush_all().expect("flush");
                        decided(core.on(RouterEvent::Records(records)))
                    }
                    2 => {
                        time += 1 + draw.below(5) as u64;
                        outputs.broadcast(&ChannelMessage::Watermark(time)).expect("watermark");
                        decided(core.on(RouterEvent::Watermark(time)))
                    }
                    3 => {
                        epoch += 1;
                        let live = draw.subset(&pool);
                        let assignment = draw.table(&live);
                        let keep: Vec<TaskId> =
                            draw.subset(&pool).into_iter().filter(|_| draw.below(3) == 0).collect();
                        let event = RouterEvent::Switch { epoch, assignment, keep };
                        outputs
                            .switch_edges(
                                consumer,
                                |_, keyed| {
                                    assert!(keyed, "a keyed edge's router is keyed");
                                    Ok(event.clone())
                                },
                                open,
                            )
                            .expect("switch");
                        decided(core.on(event))
                    }
                    _ => {
                        epoch += 1;
                        outputs.broadcast(&ChannelMessage::Marker(epoch)).expect("drain");
                        let mut out = core.on(RouterEvent::Mark { epoch });
                        let live = draw.subset(&pool);
                        let assignment = draw.table(&live);
                        let event = RouterEvent::Reroute { epoch, assignment };
                        outputs.switch_edges(consumer, |_, _| Ok(event.clone()), open).expect("resume");
                        out.extend(core.on(event));
                        decided(out)
                    }
                };
                let got = received(&queues);
                switches +=
                    u64::from(matches!(got.values().flatten().next(), Some(ChannelMessage::Marker(_))));
                dropped += got.values().filter(|m| m.last() == Some(&ChannelMessage::EndOfStream)).count();
                assert_eq!(got, expected, "seed {seed} step {step}: what the tasks received");
                let edge = &outputs.edges()[0];
                assert_eq!(edge.routing(), core.table(), "seed {seed} step {step}: routing table");
                let channels: BTreeSet<TaskId> = edge.channels().into_iter().collect();
                assert_eq!(&channels, core.outputs(), "seed {seed} step {step}: channels");
            }
            assert!(
                switches > 5 && dropped > 0,
                "seed {seed}: {switches} switches, {dropped} dropped channels"
            );
        }
    }
}
