//! The coordinator's side of DRRS (docs/protocols.md §11): one reconfiguration of a keyed operator
//! as a sequence of subscales, each `Begin` → every `PeerReady` → `Switch` → every `Done`. It
//! runs inside [`crate::engine::Engine`] (the phase driver prepares every task first), so the
//! job's coordinator and the simulator drive the same decisions.
//!
//! An upstream task may finish at any time. It sends end of stream to the tasks of the last
//! table it switched to; every other task with a channel from it is told here
//! ([`CoordinatorMessage::UpstreamEnded`]) once nothing of that upstream can still be in flight
//! to it: it never switched to a table naming the task, or the task acked `Done` for the last
//! subscale whose marker that upstream sent it.

use std::collections::{BTreeMap, BTreeSet};

use koala_types::{Epoch, OperatorId, TaskId};

use super::messages::{DrrsControl, Subscale};
use super::plan::{Step, subscales};
use super::{DrrsOptions, DrrsSchedule, plan_epoch, subscale_epoch};
use crate::control::{CoordinatorMessage, TaskAck};

/// What the DRRS coordinator asks the engine to do.
#[derive(Clone, Debug, PartialEq)]
pub enum DrrsStep {
    /// Send to every worker.
    Broadcast(CoordinatorMessage),
    /// Every subscale completed.
    Completed,
}

#[derive(Debug)]
enum Phase {
    /// Waiting for `PeerReady`; `done` holds early `Done`s (a task with nothing to wait for).
    Ready { pending: BTreeSet<TaskId>, done: BTreeSet<TaskId> },
    /// Upstreams switched; waiting for `Done`.
    Done { pending: BTreeSet<TaskId> },
}

#[derive(Debug)]
struct Run {
    operator: OperatorId,
    epoch: Epoch,
    steps: Vec<Step>,
    /// `tables[0]` is the assignment before, `tables[i + 1]` the one after subscale `i`.
    tables: Vec<Vec<TaskId>>,
    /// Tasks live before and after: upstreams keep channels to them in every table.
    keep: BTreeSet<TaskId>,
    index: usize,
    phase: Phase,
    /// Upstream tasks still running.
    live: BTreeSet<TaskId>,
    /// Upstream tasks that finished.
    finished: BTreeSet<TaskId>,
    /// The table each upstream routes by (an index into `tables`).
    switched: BTreeMap<TaskId, usize>,
    /// Per task, the upstreams it has open channels from, as far as this run knows.
    channels: BTreeMap<TaskId, BTreeSet<TaskId>>,
    /// (task, subscale) of every `Done`.
    done: BTreeSet<(TaskId, usize)>,
}

impl Run {
    /// The tasks upstreams have channels to when they route by `tables[t]`.
    fn outputs(&self, t: usize) -> BTreeSet<TaskId> {
        self.tables[t].iter().chain(&self.keep).copied().collect()
    }

    /// The tasks of subscale `i`: every output of the table before or after it (each gets a
    /// marker from every upstream).
    fn participants(&self, i: usize) -> BTreeSet<TaskId> {
        self.outputs(i).union(&self.outputs(i + 1)).copied().collect()
    }

    fn subscale_epoch(&self) -> Epoch {
        subscale_epoch(self.epoch, self.index)
    }
}

/// The DRRS coordinator core: see the module docs.
#[derive(Debug, Default)]
pub struct DrrsCoordinator {
    options: DrrsOptions,
    run: Option<Run>,
}

impl DrrsCoordinator {
    /// A coordinator with these knobs.
    pub fn new(options: DrrsOptions) -> Self {
        Self { options, run: None }
    }

    /// The knobs.
    pub fn options(&self) -> DrrsOptions {
        self.options
    }

    /// Whether no reconfiguration runs.
    pub fn is_idle(&self) -> bool {
        self.run.is_none()
    }

    /// Starts reconfiguration `epoch` of `operator` from assignment `old` to `new`; `upstreams`
    /// are its running upstream tasks. Returns the first subscale's `Begin`.
    pub fn start(
        &mut self,
        operator: OperatorId,
        epoch: Epoch,
        old: Vec<TaskId>,
        new: Vec<TaskId>,
        upstreams: BTreeSet<TaskId>,
    ) -> Result<Vec<DrrsStep>, String> {
        if let Some(r) = &self.run {
            return Err(format!("DRRS reconfiguration {} of {} is still running", r.epoch, r.operator));
        }
        if self.options.schedule != DrrsSchedule::Ported {
            let name = self.options.schedule.name();
            return Err(format!("the DRRS schedule \"{name}\" is not built yet; use \"ported\""));
        }
        let steps = subscales(&old, &new, self.options.subscales)?;
        if steps.is_empty() {
            return Ok(vec![DrrsStep::Completed]);
        }
        let mut tables = vec![old.clone()];
        tables.extend(steps.iter().map(|s| s.assignment.clone()));
        let channels = old.iter().map(|t| (*t, upstreams.clone())).collect();
        let before: BTreeSet<TaskId> = old.iter().copied().collect();
        let keep = new.iter().copied().filter(|t| before.contains(t)).collect();
        let run = Run {
            operator,
            epoch,
            steps,
            tables,
            keep,
            index: 0,
            phase: Phase::Done { pending: BTreeSet::new() },
            live: upstreams,
            finished: BTreeSet::new(),
            switched: BTreeMap::new(),
            channels,
            done: BTreeSet::new(),
        };
        self.run = Some(run);
        let mut out = Vec::new();
        self.begin(&mut out);
        Ok(out)
    }

    /// Starts the current subscale: flushes end-of-upstream notices first (a task must not
    /// expect a marker from an upstream that finished), then `Begin`.
    fn begin(&mut self, out: &mut Vec<DrrsStep>) {
        self.notify_ended(out);
        let Some(r) = self.run.as_mut() else { return };
        let i = r.index;
        let tasks = r.participants(i);
        for &t in &tasks {
            // A new task opens channels from the running upstreams with its first subscale.
            r.channels.entry(t).or_insert_with(|| r.live.clone());
        }
        let subscale = Subscale {
            operator: r.operator,
            epoch: r.subscale_epoch(),
            index: i,
            count: r.steps.len(),
            moves: r.steps[i].moves.clone(),
            upstreams: r.live.clone(),
            wait_records: self.options.wait_records,
        };
        r.phase = Phase::Ready { pending: tasks.clone(), done: BTreeSet::new() };
        let control = DrrsControl::Begin { subscale: Box::new(subscale), tasks: tasks.into_iter().collect() };
        out.push(DrrsStep::Broadcast(CoordinatorMessage::Drrs(Box::new(control))));
    }

    /// A task's `PeerReady` or `Done`, or an upstream's `Switched`. An ack the running subscale
    /// does not expect is an error.
    pub fn on_ack(&mut self, from: TaskId, epoch: Epoch, ack: &TaskAck) -> Result<Vec<DrrsStep>, String> {
        let mut out = Vec::new();
        let Some(r) = self.run.as_mut() else {
            return Err(format!(
                "{ack:?} from {from} for epoch {epoch} with no DRRS reconfiguration running"
            ));
        };
        if *ack == TaskAck::Switched {
            // Upstreams confirm a switch; the subscale completes on its tasks' `Done`.
            if plan_epoch(epoch) == r.epoch {
                let to = (epoch - subscale_epoch(r.epoch, 0)) as usize + 1;
                let at = r.switched.entry(from).or_insert(0);
                *at = (*at).max(to);
            }
            return Ok(out);
        }
        let current = r.subscale_epoch();
        let refused = |state: &str| format!("{ack:?} from {from} for epoch {epoch}: {state}");
        if epoch != current {
            return Err(refused(&format!("subscale {current} is running")));
        }
        let i = r.index;
        let participants = r.participants(i);
        match (ack, &mut r.phase) {
            (TaskAck::PeerReady, Phase::Ready { pending, done }) => {
                if !pending.remove(&from) {
                    return Err(refused("not awaited"));
                }
                if pending.is_empty() {
                    let done = std::mem::take(done);
                    let pending = participants.difference(&done).copied().collect();
                    r.phase = Phase::Done { pending };
                    let table: BTreeSet<TaskId> = r.tables[i + 1].iter().copied().collect();
                    let control = DrrsControl::Switch {
                        epoch,
                        operator: r.operator,
                        assignment: r.tables[i + 1].iter().map(|t| t.index).collect(),
                        keep: r.keep.difference(&table).map(|t| t.index).collect(),
                        upstreams: r.live.iter().copied().collect(),
                        last: i + 1 == r.steps.len(),
                    };
                    out.push(DrrsStep::Broadcast(CoordinatorMessage::Drrs(Box::new(control))));
                }
            }
            (TaskAck::Done, Phase::Ready { pending, done }) => {
                // Done before the last PeerReady: the task sent its own PeerReady already.
                if pending.contains(&from) || !participants.contains(&from) {
                    return Err(refused("Done before PeerReady"));
                }
                done.insert(from);
                r.done.insert((from, i));
            }
            (TaskAck::Done, Phase::Done { pending }) => {
                if !pending.remove(&from) {
                    return Err(refused("not awaited"));
                }
                r.done.insert((from, i));
            }
            _ => return Err(refused("not awaited")),
        }
        self.next_if_done(&mut out);
        Ok(out)
    }

    /// The running subscale completed: start the next one, or complete.
    fn next_if_done(&mut self, out: &mut Vec<DrrsStep>) {
        let Some(r) = self.run.as_mut() else { return };
        if !matches!(&r.phase, Phase::Done { pending } if pending.is_empty()) {
            return;
        }
        if r.index + 1 < r.steps.len() {
            r.index += 1;
            self.begin(out);
        } else {
            self.notify_ended(out);
            self.run = None;
            out.push(DrrsStep::Completed);
        }
    }

    /// An upstream task finished: later subscales do not wait for it, and tasks it will not
    /// send end of stream to are told (now or once it is safe).
    pub fn upstream_finished(&mut self, upstream: TaskId) -> Vec<DrrsStep> {
        let mut out = Vec::new();
        if let Some(r) = self.run.as_mut()
            && r.live.remove(&upstream)
        {
            r.finished.insert(upstream);
            self.notify_ended(&mut out);
        }
        out
    }

    /// Tells every task with a channel from a finished upstream that will carry no end of stream
    /// that the upstream ended, once nothing of it can still be in flight to the task.
    fn notify_ended(&mut self, out: &mut Vec<DrrsStep>) {
        let Some(r) = self.run.as_mut() else { return };
        let mut notices: BTreeMap<TaskId, Vec<TaskId>> = BTreeMap::new();
        for &u in &r.finished {
            let at = r.switched.get(&u).copied().unwrap_or(0);
            let outputs: Vec<BTreeSet<TaskId>> = (0..=at).map(|t| r.outputs(t)).collect();
            for (&task, ups) in r.channels.iter_mut() {
                if !ups.contains(&u) || outputs[at].contains(&task) {
                    continue;
                }
                // The last subscale whose marker `u` sent to the task (to the outputs before and
                // after each subscale it switched).
                let last =
                    (0..at).rev().find(|&k| outputs[k].contains(&task) || outputs[k + 1].contains(&task));
                if last.is_none_or(|k| r.done.contains(&(task, k))) {
                    ups.remove(&u);
                    notices.entry(u).or_default().push(task);
                }
            }
        }
        for (upstream, tasks) in notices {
            out.push(DrrsStep::Broadcast(CoordinatorMessage::UpstreamEnded { upstream, tasks }));
        }
    }

    /// Tasks whose acks the running subscale waits for (timeouts, error messages).
    pub fn waiting_for(&self) -> Vec<(TaskId, String)> {
        let Some(r) = &self.run else { return Vec::new() };
        let what = format!("subscale {}/{}", r.index + 1, r.steps.len());
        match &r.phase {
            Phase::Ready { pending, .. } => {
                pending.iter().map(|t| (*t, format!("PeerReady ({what})"))).collect()
            }
            Phase::Done { pending } => pending.iter().map(|t| (*t, format!("Done ({what})"))).collect(),
        }
    }
}
