//! The Koala task's turns while it takes no data: messages wait for a full peer lane, or the
//! core holds `max_queued_records` (docs/architecture.md §4).

use std::time::{Duration, Instant};

use crossbeam_channel::{Select, TryRecvError};

use super::super::TaskSetup;
use super::KoalaOperator;
use crate::RuntimeError;
use crate::output::Outputs;

impl KoalaOperator {
    /// One turn while messages wait for a full peer lane: serve a command, a fetch or a peer
    /// message, or move waiting messages into a lane that made room. No data input meanwhile:
    /// backpressure goes upstream, and what waits stays bounded (`crate::peer::Outbox`). Time
    /// spent waiting counts as backpressure.
    pub(super) fn wait_for_peers(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        timeout: Duration,
    ) -> Result<(), RuntimeError> {
        let blocked = self.outbox.blocked();
        let never = crossbeam_channel::never();
        let mut ready = Select::new();
        let commands = ready.recv(&setup.commands);
        let fetches = ready.recv(&setup.fetch_inbox);
        let peers = ready.recv(if self.intake.peer_waiting() { &never } else { &setup.peer_inbox });
        for lane in &blocked {
            ready.send(lane);
        }
        let started = Instant::now();
        let which = ready.ready_timeout(timeout);
        self.op.metrics.backpressure += started.elapsed();
        // `ready` may report spuriously: every operation below is a try, and the loop comes back.
        match which {
            Err(_) => Ok(()),
            Ok(i) if i == commands => match setup.commands.try_recv() {
                Ok(cmd) => self.on_command(setup, outputs, cmd),
                Err(TryRecvError::Empty) => Ok(()),
                Err(TryRecvError::Disconnected) => Err(RuntimeError::WorkerGone(setup.task)),
            },
            Ok(i) if i == fetches || i == peers => {
                let lane = if i == fetches { &setup.fetch_inbox } else { &setup.peer_inbox };
                match lane.try_recv() {
                    Ok(item) => self.on_peer(setup, outputs, item.channel.from, item.message),
                    Err(_) => Ok(()),
                }
            }
            Ok(_) => self.outbox.flush(),
        }
    }

    /// One turn while the core holds `max_queued_records` and no data waits: serve a command, a
    /// fetch or a peer message, or notice data arriving — left in the queue — and start counting
    /// `input_paused_ms` then (the loop does not wake for data it does not take otherwise, so a
    /// pause would count only from the next event).
    pub(super) fn wait_while_full(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        timeout: Duration,
    ) -> Result<(), RuntimeError> {
        let never = crossbeam_channel::never();
        let mut ready = Select::new();
        let commands = ready.recv(&setup.commands);
        let fetches = ready.recv(&setup.fetch_inbox);
        let peers = ready.recv(if self.intake.peer_waiting() { &never } else { &setup.peer_inbox });
        let data = ready.recv(setup.inbox.queue());
        // `ready` may report spuriously: every operation below is a try, and the loop comes back.
        match ready.ready_timeout(timeout) {
            Err(_) => Ok(()),
            Ok(i) if i == data => {
                if !setup.inbox.queue().is_empty() {
                    self.op.metrics.input_paused(true, Instant::now());
                }
                Ok(())
            }
            Ok(i) if i == commands => match setup.commands.try_recv() {
                Ok(cmd) => self.on_command(setup, outputs, cmd),
                Err(TryRecvError::Empty) => Ok(()),
                Err(TryRecvError::Disconnected) => Err(RuntimeError::WorkerGone(setup.task)),
            },
            Ok(i) => {
                let lane = if i == fetches { &setup.fetch_inbox } else { &setup.peer_inbox };
                debug_assert!(i == fetches || i == peers);
                match lane.try_recv() {
                    Ok(item) => self.on_peer(setup, outputs, item.channel.from, item.message),
                    Err(_) => Ok(()),
                }
            }
        }
    }
}
