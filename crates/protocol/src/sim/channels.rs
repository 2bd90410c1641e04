//! The simulated job's channels: every channel between two endpoints is a FIFO queue, with the
//! set of non-empty ones kept for O(1) random choice.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use koala_types::{BucketId, ChannelMessage, Epoch, InputChannel, TaskId, Timestamp};

use crate::control::ReconfigPlan;
use crate::drrs::{DrrsPeer, Subscale};
use crate::koala::{
    FetchRequest, FetchResponse, FilterRequest, FilterResponse, PeerMessage, Reconfiguration, TaskAck,
};
use crate::switch::RoutingSwitch;

/// An endpoint of a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Node {
    Upstream(TaskId),
    Task(TaskId),
    /// A task of the operator the target operator feeds.
    Consumer(TaskId),
    Coordinator,
}

/// Channels between the same endpoints that are independent connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// The data channel of one operator input: a self-join's two channels from one upstream
    /// task are independent FIFO queues (nothing orders one against the other).
    Data(usize),
    Peer,
    State,
    Control,
}

/// What travels on a channel.
#[derive(Clone, Debug)]
pub(crate) enum Msg {
    Data(ChannelMessage),
    Peer(PeerMessage),
    FetchRequest(FetchRequest),
    FetchResponse(FetchResponse),
    FilterRequest(FilterRequest),
    Filter(FilterResponse),
    /// Stop-and-restart: a chunk of moved state (key, counter) and the buckets' timers.
    State {
        epoch: Epoch,
        entries: Vec<(Vec<u8>, u64)>,
        timers: Vec<(Timestamp, Vec<u8>)>,
    },
    /// Stop-and-restart: the sender moved everything it moves to this task.
    StateEnd(Epoch),
    Prepare(Arc<ReconfigPlan>),
    Start(Arc<Reconfiguration>),
    /// An upstream switches to this routing (Koala, a DRRS subscale), as the runtime's
    /// `TaskCommand::Switch` carries it.
    Switch(Arc<RoutingSwitch>),
    Drain(Epoch),
    /// An upstream switches to this routing and resumes (stop-and-restart, after `Drain`).
    Resume(Arc<RoutingSwitch>),
    /// The task may exit: nobody will fetch from it.
    Release,
    Ack(Epoch, TaskAck),
    /// A task finished (to the coordinator, as the job's coordinator hears `TaskFinished`): an
    /// upstream that ended, a stop-and-restart task that exited by its rule, or a consumer whose
    /// inputs all ended.
    Finished(TaskId),
    /// A Koala task's timer (`TaskAction::WakeAfter`), on a channel to itself.
    Wake,
    /// A Koala task's clock, on a channel to itself: delivered as `TaskEvent::ProcessingTime`
    /// at the world's step then.
    Clock,
    /// A location's filter build (`TaskAction::BuildFilter`), on a channel to itself: the
    /// runtime builds filters in the background, between its inputs, so the filter is built and
    /// sent at a random later step — after the answers to fetches the location serves meanwhile,
    /// and never if the location exits first.
    BuildFilter {
        to: TaskId,
        request: FilterRequest,
    },
    /// A consumer of the reconfigured operator adds the created tasks' channels and acks
    /// `Prepared` (the runtime's `TaskCommand::AddInputs`, sent with the `Prepare`).
    AddInputs {
        epoch: Epoch,
        channels: Vec<InputChannel>,
    },
    /// The coordinator tells a new task that an upstream finished before it switched.
    EndedUpstream(TaskId),
    /// DRRS: a peer-channel message.
    DrrsPeer(DrrsPeer),
    /// DRRS: a subscale starts at a task.
    DrrsStart(Arc<Subscale>),
    /// DRRS: a pushed bucket (key, counter) with the timers set aside for it, on the state lane.
    Bucket {
        epoch: Epoch,
        bucket: BucketId,
        entries: Vec<(Vec<u8>, u64)>,
        timers: Vec<(Timestamp, Vec<u8>)>,
    },
    /// DRRS: the runtime sent a pushed bucket (to the sender itself, at a random later step).
    Pushed {
        to: TaskId,
        bucket: BucketId,
    },
}

pub(crate) type ChannelKey = (Node, Node, Kind);

/// All FIFO queues, with the set of non-empty ones kept for O(1) random choice.
#[derive(Default)]
pub(crate) struct Channels {
    queues: Vec<(ChannelKey, VecDeque<Msg>)>,
    index: BTreeMap<ChannelKey, usize>,
    nonempty: Vec<usize>,
    position: Vec<Option<usize>>,
}

impl Channels {
    pub(crate) fn push(&mut self, key: ChannelKey, msg: Msg) {
        let id = match self.index.get(&key) {
            Some(&id) => id,
            None => {
                self.queues.push((key, VecDeque::new()));
                self.position.push(None);
                self.index.insert(key, self.queues.len() - 1);
                self.queues.len() - 1
            }
        };
        self.queues[id].1.push_back(msg);
        if self.position[id].is_none() {
            self.position[id] = Some(self.nonempty.len());
            self.nonempty.push(id);
        }
    }

    pub(crate) fn nonempty(&self) -> usize {
        self.nonempty.len()
    }

    /// The `i`-th non-empty channel and its head.
    pub(crate) fn head(&self, i: usize) -> Option<(ChannelKey, &Msg)> {
        let (key, queue) = &self.queues[*self.nonempty.get(i)?];
        Some((*key, queue.front()?))
    }

    /// Messages in channel `key`.
    pub(crate) fn len_of(&self, key: &ChannelKey) -> usize {
        self.index.get(key).map_or(0, |&id| self.queues[id].1.len())
    }

    /// Record batches queued on the data channels to `task` (the runtime's input queue: what
    /// `KoalaTask::set_input_backlog` reports).
    pub(crate) fn data_batches_to(&self, task: TaskId) -> usize {
        self.nonempty
            .iter()
            .filter_map(|&id| self.queues.get(id))
            .filter(|((_, to, kind), _)| *to == Node::Task(task) && matches!(kind, Kind::Data(_)))
            .map(|(_, queue)| {
                queue.iter().filter(|m| matches!(m, Msg::Data(ChannelMessage::Batch(_)))).count()
            })
            .sum()
    }

    /// Puts `msg` back at the head of channel `key` (the part of a batch a task did not take).
    pub(crate) fn push_front(&mut self, key: ChannelKey, msg: Msg) {
        self.push(key, msg);
        if let Some(&id) = self.index.get(&key) {
            let queue = &mut self.queues[id].1;
            if let Some(m) = queue.pop_back() {
                queue.push_front(m);
            }
        }
    }

    /// Pops the head of the `i`-th non-empty channel.
    pub(crate) fn pop(&mut self, i: usize) -> Option<(ChannelKey, Msg)> {
        let id = *self.nonempty.get(i)?;
        let (key, queue) = &mut self.queues[id];
        let msg = queue.pop_front()?;
        let key = *key;
        if queue.is_empty() {
            self.position[id] = None;
            self.nonempty.swap_remove(i);
            if let Some(&moved) = self.nonempty.get(i) {
                self.position[moved] = Some(i);
            }
        }
        Some((key, msg))
    }
}
