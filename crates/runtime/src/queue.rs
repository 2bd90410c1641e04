//! A task's data queue: one bounded queue shared by all its data channels (so per-channel FIFO
//! holds and the task sees one stream of input), with room handed out **in the order senders
//! asked for it**.
//!
//! A plain bounded channel is not fair under backpressure: when a slot frees, the sender that
//! was woken for it often loses the slot to a sender that happens to be running (a co-located
//! source retrying at once), goes to the back of the wait list, and loses again. Measured in
//! the 4 → 8 scale-out experiment: one source's channel to a saturated task on the other worker
//! got no slot for 8.6 s while the co-located source sent freely; that source reported no lag
//! for those seconds and the other source's zero lag made the job look caught up. Here every
//! send takes a ticket and waits until (a) every earlier ticket has been served and (b) the
//! queue has room, so each waiting channel gets its turn: a slot is never taken by barging.

use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, unbounded};

use koala_types::InputChannel;

use crate::channel::TaskInput;

/// The admission state shared by the queue's two ends.
#[derive(Debug)]
struct Gate {
    state: Mutex<GateState>,
    room: Condvar,
    capacity: usize,
}

#[derive(Debug, Default)]
struct GateState {
    /// Messages in the queue.
    queued: usize,
    /// The next ticket handed out.
    next_ticket: u64,
    /// The ticket whose turn it is.
    serving: u64,
    /// Tickets handed out and not yet served (senders waiting or about to).
    waiting: usize,
    /// Tickets given up (timed out) before their turn: skipped when it comes.
    abandoned: BTreeSet<u64>,
    /// The receiving end is gone: every send fails.
    closed: bool,
    /// Channels whose senders wait before taking a turn: those of `by_intake` and
    /// `by_alignment`.
    held_back: BTreeSet<InputChannel>,
    /// Held back by a Koala task's intake ([`DataReceiver::hold_back`]).
    by_intake: BTreeSet<InputChannel>,
    /// Held back by barrier alignment ([`AlignmentHold`]).
    by_alignment: BTreeSet<InputChannel>,
    /// Senders waiting because their channel is held back.
    waiting_held: usize,
}

impl GateState {
    /// Recomputes the held-back channels; true if they changed (waiting senders must look).
    fn rehold(&mut self) -> bool {
        let held: BTreeSet<InputChannel> = self.by_intake.union(&self.by_alignment).copied().collect();
        let changed = held != self.held_back;
        self.held_back = held;
        changed
    }

    /// Passes the turn to the next ticket still wanted.
    fn advance(&mut self) {
        self.serving += 1;
        while self.abandoned.remove(&self.serving) {
            self.serving += 1;
        }
    }
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        // A sender or receiver panicking while holding the lock leaves the counters valid.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Why a send did not complete; the message is handed back.
#[derive(Debug)]
pub enum SendFailed {
    /// The receiving task is gone.
    Closed(TaskInput),
    /// The deadline passed before the queue had room for this sender's turn.
    Timeout(TaskInput),
}

/// A task's data queue with `capacity` messages of room (at least one).
pub fn data_queue(capacity: usize) -> (DataSender, DataReceiver) {
    let (tx, rx) = unbounded();
    let gate = Arc::new(Gate {
        state: Mutex::new(GateState::default()),
        room: Condvar::new(),
        capacity: capacity.max(1),
    });
    (DataSender { queue: tx, gate: gate.clone() }, DataReceiver { queue: rx, gate })
}

/// The sending end of a data queue (one per channel feeding it; clones share the turn order).
#[derive(Clone, Debug)]
pub struct DataSender {
    queue: Sender<TaskInput>,
    gate: Arc<Gate>,
}

impl DataSender {
    /// Sends one message, waiting for this sender's turn and for room. Returns how long it
    /// waited (backpressure); fails only if the receiving task is gone.
    pub fn send(&self, item: TaskInput) -> Result<Duration, TaskInput> {
        self.send_until(item, None).map_err(|e| match e {
            SendFailed::Closed(item) | SendFailed::Timeout(item) => item,
        })
    }

    /// [`Self::send`] that gives up after `timeout`.
    #[cfg(test)]
    pub fn send_timeout(&self, item: TaskInput, timeout: Duration) -> Result<Duration, SendFailed> {
        self.send_until(item, Some(Instant::now() + timeout))
    }

    /// Messages in the queue that the task has not taken yet.
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.gate.lock().queued
    }

    fn send_until(&self, item: TaskInput, deadline: Option<Instant>) -> Result<Duration, SendFailed> {
        let gate = &self.gate;
        let mut state = gate.lock();
        let mut started = None;
        // A held-back channel waits before it takes a turn, so it holds up no other channel.
        while state.held_back.contains(&item.channel) && !state.closed {
            started.get_or_insert_with(Instant::now);
            state.waiting_held += 1;
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            state = match left {
                None => gate.room.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner),
                Some(left) if left.is_zero() => state,
                Some(left) => {
                    gate.room.wait_timeout(state, left).unwrap_or_else(std::sync::PoisonError::into_inner).0
                }
            };
            state.waiting_held -= 1;
            if left.is_some_and(|l| l.is_zero()) {
                return Err(SendFailed::Timeout(item));
            }
        }
        if state.closed {
            return Err(SendFailed::Closed(item));
        }
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.waiting += 1;
        while state.serving != ticket || state.queued >= gate.capacity {
            if state.closed {
                return Err(SendFailed::Closed(item));
            }
            started.get_or_insert_with(Instant::now);
            state = match deadline {
                None => gate.room.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        // Give the turn up without holding back the tickets behind it.
                        state.waiting -= 1;
                        if state.serving == ticket {
                            state.advance();
                        } else {
                            state.abandoned.insert(ticket);
                        }
                        gate.room.notify_all();
                        return Err(SendFailed::Timeout(item));
                    }
                    gate.room.wait_timeout(state, left).unwrap_or_else(std::sync::PoisonError::into_inner).0
                }
            };
        }
        state.queued += 1;
        state.advance();
        state.waiting -= 1;
        // Pushed under the lock, so turns are also queue order.
        let sent = self.queue.send(item);
        if state.waiting > 0 {
            // The next ticket may go now if there is room.
            gate.room.notify_all();
        }
        drop(state);
        match sent {
            Ok(()) => Ok(started.map_or(Duration::ZERO, |s| s.elapsed())),
            Err(e) => Err(SendFailed::Closed(e.into_inner())),
        }
    }
}

/// Barrier alignment's hold on a task's data queue (docs/architecture.md §10, "bounded
/// alignment"): a channel whose barrier arrived stops being read — its senders wait, as a Koala
/// task's intake makes them wait ([`DataReceiver::hold_back`]; the two sets add up) — so what
/// the task buffers behind a barrier is at most what was already queued, however long the
/// other channels' barriers take. Flink's aligned checkpoints block a channel the same way. No
/// wait can close a cycle: a held channel's barrier is already through, and the barriers the
/// task still waits for come on channels it keeps reading.
#[derive(Clone, Debug)]
pub(crate) struct AlignmentHold {
    gate: Arc<Gate>,
}

impl AlignmentHold {
    /// Holds back exactly `channels` for alignment (empty: none).
    pub(crate) fn set(&self, channels: &BTreeSet<InputChannel>) {
        let mut state = self.gate.lock();
        if state.by_alignment != *channels {
            state.by_alignment.clone_from(channels);
            if state.rehold() {
                self.gate.room.notify_all();
            }
        }
    }
}

/// The receiving end of a data queue. Take messages with [`Self::recv`], or wait on
/// [`Self::queue`] in a `select!` and call [`Self::took`] for each message taken.
#[derive(Debug)]
pub struct DataReceiver {
    queue: Receiver<TaskInput>,
    gate: Arc<Gate>,
}

impl DataReceiver {
    /// The underlying queue, to wait on together with other channels.
    pub fn queue(&self) -> &Receiver<TaskInput> {
        &self.queue
    }

    /// Makes the senders of `channels` wait (until a later call leaves them out) while the
    /// others go on; what they sent before stays in the queue. A Koala task holds back the
    /// channels whose head its core refused (`KoalaTask::data_room`; `task::koala_intake`).
    pub fn hold_back(&self, channels: &BTreeSet<InputChannel>) {
        let mut state = self.gate.lock();
        if state.by_intake != *channels {
            state.by_intake.clone_from(channels);
            if state.rehold() {
                self.gate.room.notify_all();
            }
        }
    }

    /// The handle barrier alignment holds channels back with ([`AlignmentHold`]).
    pub(crate) fn alignment_hold(&self) -> AlignmentHold {
        AlignmentHold { gate: Arc::clone(&self.gate) }
    }

    /// Frees the room of one message taken from [`Self::queue`].
    pub fn took(&self) {
        let mut state = self.gate.lock();
        state.queued = state.queued.saturating_sub(1);
        if state.waiting > 0 {
            self.gate.room.notify_all();
        }
    }

    /// Takes the next message, waiting for one.
    #[cfg(test)]
    pub fn recv(&self) -> Result<TaskInput, crossbeam_channel::RecvError> {
        let item = self.queue.recv()?;
        self.took();
        Ok(item)
    }

    /// Takes the next message, waiting at most `timeout`.
    #[cfg(test)]
    pub fn recv_timeout(&self, timeout: Duration) -> Result<TaskInput, crossbeam_channel::RecvTimeoutError> {
        let item = self.queue.recv_timeout(timeout)?;
        self.took();
        Ok(item)
    }
}

impl Drop for DataReceiver {
    fn drop(&mut self) {
        let mut state = self.gate.lock();
        state.closed = true;
        self.gate.room.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use koala_types::{ChannelMessage, InputChannel, OperatorId, TaskId};

    use super::*;

    fn item(from: u32, n: u64) -> TaskInput {
        TaskInput {
            channel: InputChannel { input: 0, from: TaskId::new(OperatorId(0), from) },
            message: ChannelMessage::Watermark(n),
        }
    }

    fn from_and_n(item: &TaskInput) -> (u32, u64) {
        match item.message {
            ChannelMessage::Watermark(n) => (item.channel.from.index, n),
            _ => unreachable!("only watermarks are sent"),
        }
    }

    /// Spins (yielding) until `n` senders wait for their turn.
    fn until_waiting(tx: &DataSender, n: usize) {
        while tx.gate.lock().waiting < n {
            std::thread::yield_now();
        }
    }

    #[test]
    fn room_goes_to_senders_in_the_order_they_asked_and_never_past_the_capacity() {
        let (tx, rx) = data_queue(1);
        tx.send(item(0, 0)).expect("room for one");
        // Senders 1 and 2 ask, in that order, while the queue is full.
        let mut threads = Vec::new();
        for s in 1..=2 {
            let sender = tx.clone();
            threads.push(std::thread::spawn(move || sender.send(item(s, 0)).expect("sent")));
            until_waiting(&tx, s as usize);
        }
        // Sender 3 comes last: with a plain bounded channel it could take the next free slot
        // (it is running when the slot frees); here it waits for its turn.
        let late = tx.clone();
        threads.push(std::thread::spawn(move || late.send(item(3, 0)).expect("sent")));
        until_waiting(&tx, 3);
        let mut order = Vec::new();
        for _ in 0..4 {
            order.push(from_and_n(&rx.recv().expect("a message")).0);
            assert!(rx.queue().len() <= 1, "never more than the capacity queued");
        }
        for t in threads {
            assert!(t.join().expect("sender") > Duration::ZERO, "each sender waited");
        }
        assert_eq!(order, [0, 1, 2, 3]);
    }

    #[test]
    fn one_sender_keeps_its_order_through_a_small_queue() {
        let (tx, rx) = data_queue(2);
        let sender = std::thread::spawn(move || {
            for n in 0..500 {
                tx.send(item(0, n)).expect("the receiver lives");
            }
        });
        let got: Vec<u64> = (0..500).map(|_| from_and_n(&rx.recv().expect("a message")).1).collect();
        sender.join().expect("sender");
        assert_eq!(got, (0..500).collect::<Vec<_>>());
    }

    #[test]
    fn a_send_times_out_without_blocking_later_senders_and_fails_once_the_receiver_is_gone() {
        let (tx, rx) = data_queue(1);
        tx.send(item(0, 0)).expect("room for one");
        match tx.send_timeout(item(0, 1), Duration::from_millis(20)) {
            Err(SendFailed::Timeout(back)) => assert_eq!(from_and_n(&back), (0, 1), "the message comes back"),
            other => panic!("expected a timeout, got {other:?}"),
        }
        // The abandoned turn does not block the next sender.
        assert_eq!(from_and_n(&rx.recv().expect("first")), (0, 0));
        tx.send(item(1, 2)).expect("room again");
        assert_eq!(from_and_n(&rx.recv().expect("second")), (1, 2));
        drop(rx);
        assert!(tx.send(item(0, 3)).is_err(), "the receiver is gone");
    }

    #[test]
    fn a_held_back_channel_waits_without_holding_up_the_others_until_released() {
        let (tx, rx) = data_queue(4);
        let held = BTreeSet::from([item(1, 0).channel]);
        rx.hold_back(&held);
        let sender = tx.clone();
        let waiting = std::thread::spawn(move || sender.send(item(1, 1)).expect("sent once released"));
        while tx.gate.lock().waiting_held < 1 {
            std::thread::yield_now();
        }
        // Channel 0 goes on while channel 1 waits (it holds no turn: the queue has room).
        for n in 0..3 {
            tx.send(item(0, n)).expect("channel 0 is not held back");
        }
        let got: Vec<(u32, u64)> = (0..3).map(|_| from_and_n(&rx.recv().expect("a message"))).collect();
        assert_eq!(got, [(0, 0), (0, 1), (0, 2)]);
        assert!(rx.queue().is_empty(), "channel 1 sent nothing while held back");
        rx.hold_back(&BTreeSet::new());
        assert_eq!(from_and_n(&rx.recv().expect("released")), (1, 1));
        assert!(waiting.join().expect("sender") > Duration::ZERO, "the held-back send waited");
    }

    #[test]
    fn the_intake_and_alignment_hold_back_channels_together() {
        let (tx, rx) = data_queue(4);
        let (zero, one) = (item(0, 0).channel, item(1, 0).channel);
        rx.hold_back(&BTreeSet::from([zero]));
        let hold = rx.alignment_hold();
        hold.set(&BTreeSet::from([one]));
        assert_eq!(tx.gate.lock().held_back, BTreeSet::from([zero, one]));
        // The intake lets channel 0 go; alignment still holds channel 1, and channel 0 sends.
        rx.hold_back(&BTreeSet::new());
        assert!(matches!(tx.send_timeout(item(1, 1), Duration::from_millis(1)), Err(SendFailed::Timeout(_))));
        tx.send(item(0, 1)).expect("channel 0 is no longer held back");
        hold.set(&BTreeSet::new());
        tx.send(item(1, 2)).expect("channel 1 is released");
        let got: Vec<(u32, u64)> = (0..2).map(|_| from_and_n(&rx.recv().expect("a message"))).collect();
        assert_eq!(got, [(0, 1), (1, 2)]);
    }

    #[test]
    fn a_sender_blocked_on_a_full_queue_is_woken_when_the_receiver_goes() {
        let (tx, rx) = data_queue(1);
        tx.send(item(0, 0)).expect("room for one");
        let blocked = std::thread::spawn(move || tx.send(item(0, 1)).is_err());
        // The sender may or may not have blocked yet: either way it must fail, not hang.
        drop(rx);
        assert!(blocked.join().expect("sender"), "the send fails once the receiver is gone");
    }
}
