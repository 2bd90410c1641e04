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
use super::plan::{single_pairs, subscales};
use super::{DrrsOptions, DrrsSchedule, plan_epoch, subscale_epoch};
use crate::control::{CoordinatorMessage, TaskAck};
use crate::moves::Moves;

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
    /// Not started yet.
    Pending,
    /// Waiting for `PeerReady`; `done` holds early `Done`s (a task with nothing to wait for).
    Ready { pending: BTreeSet<TaskId>, done: BTreeSet<TaskId> },
    /// Upstreams switched; waiting for `Done`.
    Done { pending: BTreeSet<TaskId> },
    /// Every task acked `Done`.
    Completed,
}

/// One subscale of the run.
#[derive(Debug)]
struct Sub {
    moves: Moves,
    phase: Phase,
    /// The tasks taking part (set at `Begin`).
    tasks: BTreeSet<TaskId>,
    /// Its place in the order of switches, once switched: upstreams route by `tables[slot + 1]`
    /// after it.
    slot: Option<usize>,
}

impl Sub {
    fn is_running(&self) -> bool {
        matches!(self.phase, Phase::Ready { .. } | Phase::Done { .. })
    }

    /// Whether `task` sends or receives in this subscale.
    fn moves_at(&self, task: TaskId) -> bool {
        self.moves.keys().any(|(from, to)| *from == task || *to == task)
    }
}

#[derive(Debug)]
struct Run {
    operator: OperatorId,
    epoch: Epoch,
    schedule: DrrsSchedule,
    subs: Vec<Sub>,
    /// Subscales begun: `subs[..begun]`, in the order they began (a subscale's index, and so its
    /// epoch, is its place in that order).
    begun: usize,
    /// `tables[0]` is the assignment before, `tables[k]` the one after the `k`-th switch.
    tables: Vec<Vec<TaskId>>,
    /// `order[k]`: the subscale of the `k + 1`-th switch.
    order: Vec<usize>,
    /// Tasks live before and after: upstreams keep channels to them in every table.
    keep: BTreeSet<TaskId>,
    /// Every task of the operator before or after (the overlapping schedule keeps channels to
    /// all of them until the last switch).
    all: BTreeSet<TaskId>,
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
    /// The tasks upstreams have channels to when they route by `tables[k]`. Under the
    /// overlapping schedule every task of the operator, between the first and the last switch:
    /// which subscale switches next is not known when a subscale begins, so every task takes part
    /// in every subscale and gets its markers.
    fn outputs(&self, k: usize) -> BTreeSet<TaskId> {
        if self.schedule == DrrsSchedule::Overlapping && k > 0 && k < self.subs.len() {
            return self.all.clone();
        }
        self.tables[k].iter().chain(&self.keep).copied().collect()
    }

    /// The tasks of subscale `i` as it begins: every output of the table before or after its
    /// switch (each gets a marker from every upstream). Under the ported schedule subscale `i`
    /// is the `i + 1`-th switch, from the current table; under the overlapping one every task of
    /// the operator.
    fn participants(&self, i: usize) -> BTreeSet<TaskId> {
        match self.schedule {
            DrrsSchedule::Ported => {
                let now = self.tables.last().expect("the table before");
                let after = applied(now, &self.subs[i].moves);
                now.iter().chain(&after).chain(&self.keep).copied().collect()
            }
            DrrsSchedule::Overlapping => self.all.clone(),
        }
    }

    fn subscale_epoch(&self, i: usize) -> Epoch {
        subscale_epoch(self.epoch, i)
    }

    /// The subscale an epoch names, if it belongs to this run.
    fn index_of(&self, epoch: Epoch) -> Option<usize> {
        if plan_epoch(epoch) != self.epoch {
            return None;
        }
        let i = (epoch - subscale_epoch(self.epoch, 0)) as usize;
        (i < self.subs.len()).then_some(i)
    }

    /// The subscale to begin next, if one may. Under the ported schedule the next in index order,
    /// once no other runs. Under the overlapping one as the original DRRS's `MinHoldScheduler`
    /// picks: of the tasks moving in subscales that may begin, the one with the fewest buckets in
    /// running subscales (new tasks first), and of its subscales that may begin, the one whose
    /// pair has the most subscales left (then the lowest index).
    fn next_to_begin(&self) -> Option<usize> {
        let first = self.begun;
        if first >= self.subs.len() {
            return None;
        }
        if self.schedule == DrrsSchedule::Ported {
            return self.may_begin(first).then_some(first);
        }
        let ready: Vec<usize> = (first..self.subs.len()).filter(|&j| self.may_begin(j)).collect();
        let existed: BTreeSet<TaskId> = self.tables[0].iter().copied().collect();
        let load = |t: TaskId| -> usize {
            let running = self.subs.iter().filter(|s| s.is_running());
            running
                .flat_map(|s| s.moves.iter())
                .filter(|((f, to), _)| *f == t || *to == t)
                .map(|(_, b)| b.len())
                .sum()
        };
        let task = ready
            .iter()
            .flat_map(|&j| self.subs[j].moves.keys().flat_map(|&(from, to)| [from, to]))
            .min_by_key(|&t| (existed.contains(&t), load(t), t))?;
        let left = |j: usize| {
            let pairs: Vec<&Pair> = self.subs[j].moves.keys().collect();
            self.subs[first..].iter().filter(|s| s.moves.keys().any(|p| pairs.contains(&p))).count()
        };
        ready
            .into_iter()
            .filter(|&j| self.subs[j].moves_at(task))
            .max_by_key(|&j| (left(j), std::cmp::Reverse(j)))
    }

    /// Whether subscale `i` may begin now: under the ported schedule once no other runs; under
    /// the overlapping one once its sender and its receiver each move in fewer than
    /// [`MAX_RUNNING_PER_TASK`] running subscales and none of its pair runs.
    fn may_begin(&self, i: usize) -> bool {
        match self.schedule {
            DrrsSchedule::Ported => !self.subs.iter().any(Sub::is_running),
            DrrsSchedule::Overlapping => self.subs[i].moves.keys().all(|(from, to)| {
                // One running subscale per pair: a pair's subscales run one after another.
                let pair_busy =
                    self.subs.iter().any(|s| s.is_running() && s.moves.contains_key(&(*from, *to)));
                !pair_busy
                    && [from, to].iter().all(|t| {
                        self.subs.iter().filter(|s| s.is_running() && s.moves_at(**t)).count()
                            < MAX_RUNNING_PER_TASK
                    })
            }),
        }
    }
}

/// A sender and a receiver.
type Pair = (TaskId, TaskId);

/// `table` with `moves` made.
fn applied(table: &[TaskId], moves: &Moves) -> Vec<TaskId> {
    let mut table = table.to_vec();
    for (&(_, to), buckets) in moves {
        for &b in buckets {
            table[usize::from(b)] = to;
        }
    }
    table
}

/// Overlapping schedule: the most running subscales a task sends or receives in (the original
/// DRRS's limit of two per task).
pub const MAX_RUNNING_PER_TASK: usize = 2;

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
    /// are its running upstream tasks. Returns the `Begin` of every subscale that may start.
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
        let schedule = self.options.schedule;
        let moves: Vec<Moves> = match schedule {
            DrrsSchedule::Ported => {
                subscales(&old, &new, self.options.subscales)?.into_iter().map(|s| s.moves).collect()
            }
            DrrsSchedule::Overlapping if self.options.subscales != 0 => {
                return Err(format!(
                    "the overlapping DRRS schedule runs single-pair subscales, about two per pair; \
                     subscales = {} needs schedule = \"ported\"",
                    self.options.subscales
                ));
            }
            DrrsSchedule::Overlapping => single_pairs(&old, &new)?,
        };
        if moves.is_empty() {
            return Ok(vec![DrrsStep::Completed]);
        }
        let channels = old.iter().map(|t| (*t, upstreams.clone())).collect();
        let before: BTreeSet<TaskId> = old.iter().copied().collect();
        let keep = new.iter().copied().filter(|t| before.contains(t)).collect();
        let all = old.iter().chain(&new).copied().collect();
        let subs = moves
            .into_iter()
            .map(|moves| Sub { moves, phase: Phase::Pending, tasks: BTreeSet::new(), slot: None })
            .collect();
        let run = Run {
            operator,
            epoch,
            schedule,
            subs,
            begun: 0,
            tables: vec![old],
            order: Vec::new(),
            keep,
            all,
            live: upstreams,
            finished: BTreeSet::new(),
            switched: BTreeMap::new(),
            channels,
            done: BTreeSet::new(),
        };
        self.run = Some(run);
        let mut out = Vec::new();
        self.begin_next(&mut out);
        Ok(out)
    }

    /// Begins every subscale that may begin, in the order [`Run::next_to_begin`] picks: flushes end-of-upstream notices
    /// first (a task must not expect a marker from an upstream that finished), then `Begin`.
    fn begin_next(&mut self, out: &mut Vec<DrrsStep>) {
        self.notify_ended(out);
        let wait_records = self.options.wait_records;
        let Some(r) = self.run.as_mut() else { return };
        while let Some(next) = r.next_to_begin() {
            // Subscales begin, and are numbered, in the order picked: the rest keep theirs.
            let sub = r.subs.remove(next);
            r.subs.insert(r.begun, sub);
            let i = r.begun;
            r.begun += 1;
            let tasks = r.participants(i);
            for &t in &tasks {
                // A new task opens channels from the running upstreams with its first subscale.
                r.channels.entry(t).or_insert_with(|| r.live.clone());
            }
            let subscale = Subscale {
                operator: r.operator,
                epoch: r.subscale_epoch(i),
                index: i,
                count: r.subs.len(),
                moves: r.subs[i].moves.clone(),
                upstreams: r.live.clone(),
                wait_records,
            };
            r.subs[i].phase = Phase::Ready { pending: tasks.clone(), done: BTreeSet::new() };
            r.subs[i].tasks = tasks.clone();
            let control =
                DrrsControl::Begin { subscale: Box::new(subscale), tasks: tasks.into_iter().collect() };
            out.push(DrrsStep::Broadcast(CoordinatorMessage::Drrs(Box::new(control))));
        }
    }

    /// A task's `PeerReady` or `Done`, or an upstream's `Switched`. An ack no running subscale
    /// expects is an error.
    pub fn on_ack(&mut self, from: TaskId, epoch: Epoch, ack: &TaskAck) -> Result<Vec<DrrsStep>, String> {
        let mut out = Vec::new();
        let Some(r) = self.run.as_mut() else {
            return Err(format!(
                "{ack:?} from {from} for epoch {epoch} with no DRRS reconfiguration running"
            ));
        };
        if *ack == TaskAck::Switched {
            // Upstreams confirm a switch; the subscale completes on its tasks' `Done`.
            if let Some(slot) = r.index_of(epoch).and_then(|i| r.subs[i].slot) {
                let at = r.switched.entry(from).or_insert(0);
                *at = (*at).max(slot + 1);
            }
            return Ok(out);
        }
        let refused = |state: &str| format!("{ack:?} from {from} for epoch {epoch}: {state}");
        let Some(i) = r.index_of(epoch).filter(|&i| r.subs[i].is_running()) else {
            return Err(refused("no such subscale is running"));
        };
        let sub = &mut r.subs[i];
        match (ack, &mut sub.phase) {
            (TaskAck::PeerReady, Phase::Ready { pending, done }) => {
                if !pending.remove(&from) {
                    return Err(refused("not awaited"));
                }
                let _ = done;
                Self::switch_ready(r, &mut out);
            }
            (TaskAck::Done, Phase::Ready { pending, done }) => {
                // Done before the last PeerReady: the task sent its own PeerReady already.
                if pending.contains(&from) || !sub.tasks.contains(&from) {
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
        let mut completed = false;
        for sub in &mut r.subs {
            if matches!(&sub.phase, Phase::Done { pending } if pending.is_empty()) {
                sub.phase = Phase::Completed;
                completed = true;
            }
        }
        if completed {
            if r.subs.iter().all(|s| matches!(s.phase, Phase::Completed)) {
                self.notify_ended(&mut out);
                self.run = None;
                out.push(DrrsStep::Completed);
            } else {
                self.begin_next(&mut out);
            }
        }
        Ok(out)
    }

    /// Switches, in subscale order, every subscale whose tasks are all `PeerReady` and whose
    /// predecessors switched: routing tables, markers and epochs at the upstreams only grow, so a
    /// subscale ready before an earlier one waits for that one's switch (its transfer overlaps
    /// theirs all the same).
    fn switch_ready(r: &mut Run, out: &mut Vec<DrrsStep>) {
        while let Some(sub) = r.subs.get_mut(r.order.len())
            && let Phase::Ready { pending, done } = &mut sub.phase
            && pending.is_empty()
        {
            let done = std::mem::take(done);
            sub.phase = Phase::Done { pending: sub.tasks.difference(&done).copied().collect() };
            let i = r.order.len();
            out.push(Self::switch(r, i));
        }
    }

    /// Every task of subscale `i` is `PeerReady`: the upstreams switch to the current table with
    /// its moves applied.
    fn switch(r: &mut Run, i: usize) -> DrrsStep {
        let slot = r.order.len();
        let table = applied(&r.tables[slot], &r.subs[i].moves);
        r.tables.push(table);
        r.order.push(i);
        r.subs[i].slot = Some(slot);
        let outputs = r.outputs(slot + 1);
        let control = DrrsControl::Switch {
            epoch: r.subscale_epoch(i),
            operator: r.operator,
            assignment: r.tables[slot + 1].iter().map(|t| t.index).collect(),
            keep: outputs.iter().filter(|t| !r.tables[slot + 1].contains(t)).map(|t| t.index).collect(),
            upstreams: r.live.iter().copied().collect(),
            last: slot + 1 == r.subs.len(),
        };
        DrrsStep::Broadcast(CoordinatorMessage::Drrs(Box::new(control)))
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
                if last.is_none_or(|k| r.done.contains(&(task, r.order[k]))) {
                    ups.remove(&u);
                    notices.entry(u).or_default().push(task);
                }
            }
        }
        for (upstream, tasks) in notices {
            out.push(DrrsStep::Broadcast(CoordinatorMessage::UpstreamEnded { upstream, tasks }));
        }
    }

    /// Tasks whose acks the running subscales wait for (timeouts, error messages).
    pub fn waiting_for(&self) -> Vec<(TaskId, String)> {
        let Some(r) = &self.run else { return Vec::new() };
        let mut waiting = Vec::new();
        for (i, sub) in r.subs.iter().enumerate() {
            let what = format!("subscale {}/{}", i + 1, r.subs.len());
            match &sub.phase {
                Phase::Ready { pending, .. } => {
                    waiting.extend(pending.iter().map(|t| (*t, format!("PeerReady ({what})"))))
                }
                Phase::Done { pending } => {
                    waiting.extend(pending.iter().map(|t| (*t, format!("Done ({what})"))))
                }
                Phase::Pending | Phase::Completed => {}
            }
        }
        waiting
    }
}
