//! A task's outputs: per downstream edge, route each record (forward, round-robin, or by bucket
//! through the routing table), batch per channel, flush when a batch is full or has lingered.

use std::sync::Arc;
use std::time::{Duration, Instant};

use koala_dataflow::graph::KeyFn;
use std::collections::HashMap;

use koala_types::{ChannelMessage, OperatorId, Record, TaskId, Timestamp, bucket_of};

use crate::RuntimeError;
use crate::channel::ChannelSender;

/// How one edge picks the downstream task of a record.
pub enum Route {
    /// Always the task with this index.
    Forward(usize),
    /// Round-robin.
    Rebalance,
    /// By bucket of the recomputed key, through the routing table (bucket → task index).
    Key {
        /// Computes the key from the value.
        key_fn: KeyFn,
        /// The routing table.
        table: Arc<Vec<u32>>,
        /// Buckets of the downstream operator.
        num_buckets: u16,
    },
}

/// One downstream edge: its route and one channel per downstream task.
pub struct OutputEdge {
    consumer: OperatorId,
    input: usize,
    route: Route,
    targets: Vec<ChannelSender>,
    buffers: Vec<Vec<Record>>,
    since: Vec<Option<Instant>>,
    next: usize,
}

impl OutputEdge {
    /// An edge to input `input` of `consumer` over `targets`; routes name positions in `targets`.
    pub fn new(consumer: OperatorId, input: usize, route: Route, targets: Vec<ChannelSender>) -> Self {
        let n = targets.len();
        Self { consumer, input, route, targets, buffers: vec![Vec::new(); n], since: vec![None; n], next: 0 }
    }
}

/// All outputs of a task.
pub struct Outputs {
    edges: Vec<OutputEdge>,
    batch_records: usize,
    linger: Duration,
    /// Time spent blocked on full channels since last taken.
    pub backpressure: Duration,
    /// The last watermark broadcast, re-sent on channels opened by a reconfiguration.
    last_watermark: Option<Timestamp>,
}

impl Outputs {
    /// Outputs over `edges`.
    pub fn new(edges: Vec<OutputEdge>, batch_records: usize, linger: Duration) -> Self {
        Self {
            edges,
            batch_records: batch_records.max(1),
            linger,
            backpressure: Duration::ZERO,
            last_watermark: None,
        }
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
        let target = match &edge.route {
            Route::Forward(i) => *i,
            Route::Rebalance => {
                edge.next = (edge.next + 1) % edge.targets.len();
                edge.next
            }
            Route::Key { key_fn, table, num_buckets } => {
                record.key = key_fn(&record.value).map_err(koala_dataflow::DataflowError::from)?;
                table[usize::from(bucket_of(&record.key, *num_buckets))] as usize
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

    /// Flushes, then sends `message` on every channel (watermarks, end of stream). Records
    /// buffered before it are therefore ahead of it, as FIFO requires.
    pub fn broadcast(&mut self, message: &ChannelMessage) -> Result<(), RuntimeError> {
        self.flush_all()?;
        if let ChannelMessage::Watermark(w) = message {
            self.last_watermark = Some(*w);
        }
        for e in &mut self.edges {
            for t in &mut e.targets {
                self.backpressure += t.send(message.clone())?;
            }
        }
        Ok(())
    }

    /// Switches the edges to `consumer` to a new routing (a reconfiguration). `build` makes the
    /// new edge for an input, taking over the channels it keeps from the map it is given (same
    /// connection, so per-channel FIFO holds across the switch). Every channel of the new edge and
    /// every dropped channel gets `Marker(epoch)` (nothing after it was routed by the old table);
    /// dropped channels then get end of stream; new edges get the last watermark, so new tasks
    /// learn the event time at once.
    pub fn switch_edges(
        &mut self,
        consumer: OperatorId,
        epoch: koala_types::Epoch,
        mut build: impl FnMut(usize, &mut HashMap<TaskId, ChannelSender>) -> Result<OutputEdge, RuntimeError>,
    ) -> Result<(), RuntimeError> {
        self.flush_all()?;
        let (mine, mut rest): (Vec<OutputEdge>, Vec<OutputEdge>) =
            std::mem::take(&mut self.edges).into_iter().partition(|e| e.consumer == consumer);
        for old in mine {
            let mut reuse: HashMap<TaskId, ChannelSender> =
                old.targets.into_iter().map(|t| (t.to(), t)).collect();
            let mut new = build(old.input, &mut reuse)?;
            for t in &mut new.targets {
                self.backpressure += t.send(ChannelMessage::Marker(epoch))?;
            }
            for (_, mut dropped) in reuse {
                self.backpressure += dropped.send(ChannelMessage::Marker(epoch))?;
                self.backpressure += dropped.send(ChannelMessage::EndOfStream)?;
            }
            if let Some(w) = self.last_watermark {
                for t in &mut new.targets {
                    self.backpressure += t.send(ChannelMessage::Watermark(w))?;
                }
            }
            rest.push(new);
        }
        self.edges = rest;
        Ok(())
    }
}
