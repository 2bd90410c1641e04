//! Koala's checkpoint cut under the simulator (`crate::koala::CheckpointCut`, docs/protocols.md
//! §13): after a reconfiguration, owner `N` owns every key and location `O` still holds their
//! state (cold); `N` fetches a key on its first access, looking ahead over the records it holds
//! (several fetches in flight), and pulls others in the background, and `O` answers by deleting
//! (one live copy). Records add to a key's state or clear it (a window purging a key). Checkpoints
//! run concurrently: a source injects barriers into its channels to `N` and to `O`, each task
//! snapshots at its own barrier — `N` once it holds no record taken before the barrier and waits
//! for no answer — and a checkpoint completes when both did. Every channel is a FIFO queue; each
//! step delivers the head of a random queue, lets the source emit, starts a checkpoint, sends a
//! pull or crashes the job, driven by a seeded generator.
//!
//! Checked: restoring every completed checkpoint by the cut's rule
//! ([`restore_steps`]: the other parts with their retained entries, the owner's tombstones, the
//! owner's own part) gives exactly the oracle's state after the records the source emitted
//! before its barrier (each key at one version, none lost, none brought back); a crash restores
//! the latest and rewinds the source; at the end the state (`N`'s and what `O` still holds,
//! never a key in both) equals the oracle's over all records. [`Mutant`]s drop a part of the rule
//! and must be caught.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use koala_types::CheckpointId;

use super::rng::SplitMix64 as Rng;
use crate::koala::{CheckpointCut, CutPart, RestoreStep, restore_steps};

/// A part of the rule the run leaves out, to show the checks catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    /// The rule as built.
    None,
    /// A location keeps no copy of what it serves to an owner past its snapshot (rule 2).
    NoRetention,
    /// The owner's snapshot lists no installed keys (rule 3).
    NoTombstones,
    /// The owner snapshots with fetches outstanding (rule 1).
    SnapshotWithFetchesOutstanding,
}

/// What one run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CutSimStats {
    /// Steps taken.
    pub steps: u64,
    /// Checkpoints completed (each restored and checked).
    pub completed: u64,
    /// Crashes.
    pub crashes: u64,
    /// Fetch and pull answers that carried state.
    pub moved: u64,
    /// Entries some snapshot recorded as retained.
    pub retained: u64,
}

const KEYS: u64 = 12;
const RECORDS: u64 = 60;
/// Records `N` holds at most (its bounded inbox), the look-ahead of its fetches.
const INBOX: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Add(u64),
    Clear,
}

/// Record `i` of the source: deterministic, so a rewound source emits the same records.
fn record(i: u64) -> (u64, Op) {
    let mix = i.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17) ^ i;
    let key = mix % KEYS;
    if (mix >> 8).is_multiple_of(5) { (key, Op::Clear) } else { (key, Op::Add(1 + (mix >> 16) % 9)) }
}

type State = BTreeMap<u64, u64>;

fn initial() -> State {
    (0..KEYS).map(|k| (k, 100 + k)).collect()
}

fn apply(state: &mut State, (key, op): (u64, Op)) {
    match op {
        Op::Add(x) => *state.entry(key).or_insert(0) += x,
        Op::Clear => {
            state.remove(&key);
        }
    }
}

fn oracle(records: u64) -> State {
    let mut state = initial();
    for i in 0..records {
        apply(&mut state, record(i));
    }
    state
}

fn entry(key: u64, value: u64) -> (Vec<u8>, Vec<u8>) {
    (key.to_be_bytes().to_vec(), value.to_be_bytes().to_vec())
}

fn unentry(key: &[u8], value: &[u8]) -> Option<(u64, u64)> {
    Some((u64::from_be_bytes(key.try_into().ok()?), u64::from_be_bytes(value.try_into().ok()?)))
}

#[derive(Clone, Debug)]
enum Data {
    Record(u64),
    Barrier(CheckpointId),
}

/// A location's answer: the requested keys (with their state, if it held any) and pulled ones.
type Answer = (Vec<(u64, Option<u64>)>, Vec<(u64, u64)>);

#[derive(Clone, Debug)]
struct Request {
    keys: Vec<u64>,
    pull: usize,
    tag: CheckpointId,
}

/// A task's part of a checkpoint.
#[derive(Clone, Debug, Default)]
struct Part {
    store: State,
    cut: CutPart,
    /// `N`: records processed before its barrier.
    position: u64,
}

struct Job {
    /// `N`'s store, records it holds (with the source position), keys it asked for.
    n_store: State,
    n_inbox: VecDeque<u64>,
    n_requested: BTreeSet<u64>,
    n_outstanding: usize,
    n_cut: CheckpointCut,
    n_pending: Option<CheckpointId>,
    o_store: State,
    o_cut: CheckpointCut,
    /// Channels: source → N, source → O, N → O, O → N.
    to_n: VecDeque<Data>,
    to_o: VecDeque<CheckpointId>,
    requests: VecDeque<Request>,
    answers: VecDeque<Answer>,
    emitted: u64,
    /// The checkpoint running and the parts taken of it.
    running: Option<(CheckpointId, BTreeMap<&'static str, Part>)>,
    next_checkpoint: CheckpointId,
}

impl Job {
    /// The job as restored from `latest` (or from the start), with the source at its position.
    fn new(latest: Option<&(CheckpointId, Part, Part)>, next_checkpoint: CheckpointId) -> Self {
        let (id, n_store, o_store, emitted) = match latest {
            // Restore re-buckets: `N` owns every key, so all of it comes back at `N`.
            Some((id, n, o)) => (*id, restore(n, o), State::new(), n.position),
            None => (0, State::new(), initial(), 0),
        };
        Self {
            n_store,
            n_inbox: VecDeque::new(),
            n_requested: BTreeSet::new(),
            n_outstanding: 0,
            n_cut: CheckpointCut::new(id),
            n_pending: None,
            o_store,
            o_cut: CheckpointCut::new(id),
            to_n: VecDeque::new(),
            to_o: VecDeque::new(),
            requests: VecDeque::new(),
            answers: VecDeque::new(),
            emitted,
            running: None,
            next_checkpoint,
        }
    }
}

/// `N`'s state restored from a checkpoint's parts by the cut's order.
fn restore(n: &Part, o: &Part) -> State {
    let mut state = State::new();
    for step in restore_steps("n", ["n", "o"]) {
        match step {
            RestoreStep::Other(_) => {
                state.extend(o.store.iter().map(|(k, v)| (*k, *v)));
                state.extend(o.cut.retained.iter().filter_map(|(k, v)| unentry(k, v)));
            }
            RestoreStep::Tombstones => {
                for key in &n.cut.installed {
                    if let Ok(bytes) = <[u8; 8]>::try_from(key.as_slice()) {
                        state.remove(&u64::from_be_bytes(bytes));
                    }
                }
            }
            RestoreStep::Own => state.extend(n.store.iter().map(|(k, v)| (*k, *v))),
        }
    }
    state
}

/// Runs one seed; `crash_at`: crash at exactly this step (besides the random crashes when
/// `random_crashes`). `Err` says which check failed.
pub fn run_cut(
    seed: u64,
    mutant: Mutant,
    crash_at: Option<u64>,
    random_crashes: bool,
) -> Result<CutSimStats, String> {
    let mut rng = Rng::new(seed);
    let mut stats = CutSimStats::default();
    let mut latest: Option<(CheckpointId, Part, Part)> = None;
    let mut job = Job::new(None, 1);
    loop {
        stats.steps += 1;
        if stats.steps > 100_000 {
            return Err(format!("seed {seed}: no progress after {} steps", stats.steps));
        }
        let crash =
            crash_at == Some(stats.steps) || (random_crashes && stats.crashes < 3 && rng.chance(1, 150));
        if crash {
            stats.crashes += 1;
            job = Job::new(latest.as_ref(), job.next_checkpoint);
            continue;
        }
        let done = job.emitted == RECORDS
            && job.to_n.is_empty()
            && job.n_inbox.is_empty()
            && job.n_pending.is_none()
            && job.requests.is_empty()
            && job.answers.is_empty()
            && job.running.is_none();
        if done {
            break;
        }
        match rng.below(7) {
            0 if job.emitted < RECORDS => {
                job.to_n.push_back(Data::Record(job.emitted));
                job.emitted += 1;
            }
            1 if job.running.is_none() && job.emitted < RECORDS => {
                let id = job.next_checkpoint;
                job.next_checkpoint += 1;
                job.to_n.push_back(Data::Barrier(id));
                job.to_o.push_back(id);
                job.running = Some((id, BTreeMap::new()));
            }
            2 if job.n_pending.is_none() && job.n_inbox.len() < INBOX => match job.to_n.pop_front() {
                Some(Data::Record(i)) => {
                    job.n_inbox.push_back(i);
                    look_ahead(&mut job);
                }
                Some(Data::Barrier(id)) => job.n_pending = Some(id),
                None => {}
            },
            3 => {
                if let Some(id) = job.to_o.pop_front() {
                    let part = Part { store: job.o_store.clone(), cut: job.o_cut.snapshot(id), position: 0 };
                    stats.retained += part.cut.retained.len() as u64;
                    take_part(&mut job, &mut latest, &mut stats, "o", part)?;
                }
            }
            4 => {
                if let Some(request) = job.requests.pop_front() {
                    serve(&mut job, request, mutant);
                }
            }
            5 => {
                if let Some((values, extra)) = job.answers.pop_front() {
                    job.n_outstanding -= 1;
                    let mut keys = Vec::new();
                    for (key, value) in values.into_iter().chain(extra.into_iter().map(|(k, v)| (k, Some(v))))
                    {
                        if let Some(value) = value {
                            stats.moved += 1;
                            // An answer never overwrites state the owner already has.
                            if job.n_store.insert(key, value).is_some() {
                                return Err(format!("seed {seed}: key {key} arrived twice at its owner"));
                            }
                        }
                        keys.push(key.to_be_bytes());
                    }
                    job.n_cut.on_installed(keys.iter().map(|k| &k[..]));
                }
            }
            _ => {
                if rng.chance(1, 4)
                    && job.n_outstanding == 0
                    && job.n_pending.is_none()
                    && !job.o_store.is_empty()
                {
                    job.n_outstanding += 1;
                    job.requests.push_back(Request { keys: Vec::new(), pull: 2, tag: job.n_cut.tag() });
                }
            }
        }
        process(&mut job);
        if let Some(id) = job.n_pending {
            let idle = job.n_inbox.is_empty()
                && (job.n_outstanding == 0 || mutant == Mutant::SnapshotWithFetchesOutstanding);
            if idle {
                job.n_pending = None;
                let mut cut = job.n_cut.snapshot(id);
                if mutant == Mutant::NoTombstones {
                    cut.installed.clear();
                }
                let position =
                    job.emitted - job.to_n.iter().filter(|d| matches!(d, Data::Record(_))).count() as u64;
                let part = Part { store: job.n_store.clone(), cut, position };
                take_part(&mut job, &mut latest, &mut stats, "n", part)?;
            }
        }
    }
    let mut end = job.n_store.clone();
    for (key, value) in &job.o_store {
        if end.insert(*key, *value).is_some() {
            return Err(format!("seed {seed}: key {key} is held by its owner and its old location"));
        }
    }
    if end != oracle(RECORDS) {
        return Err(format!("seed {seed}: final state {end:?}, the oracle's {:?}", oracle(RECORDS)));
    }
    Ok(stats)
}

/// `N` asks for the state of the keys its held records need that it has neither here nor asked
/// for (one request per key, whatever the number of records).
fn look_ahead(job: &mut Job) {
    let missing: Vec<u64> = job
        .n_inbox
        .iter()
        .map(|i| record(*i).0)
        .filter(|k| !job.n_store.contains_key(k) && !job.n_requested.contains(k))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if !missing.is_empty() {
        job.n_requested.extend(&missing);
        job.n_outstanding += 1;
        job.requests.push_back(Request { keys: missing, pull: 0, tag: job.n_cut.tag() });
    }
}

/// `N` processes its held records in order while the head's key is settled (here, or answered).
fn process(job: &mut Job) {
    while let Some(&i) = job.n_inbox.front() {
        let (key, op) = record(i);
        let settled =
            job.n_store.contains_key(&key) || (job.n_requested.contains(&key) && !awaited(job, key));
        if !settled {
            return;
        }
        job.n_inbox.pop_front();
        apply(&mut job.n_store, (key, op));
    }
}

/// Whether an answer about `key` is still on its way.
fn awaited(job: &Job, key: u64) -> bool {
    job.requests.iter().any(|r| r.keys.contains(&key))
        || job.answers.iter().any(|(v, _)| v.iter().any(|(k, _)| *k == key))
}

/// `O` answers: it deletes what it sends, and keeps a copy for its next snapshot when the
/// requester is past it.
fn serve(job: &mut Job, request: Request, mutant: Mutant) {
    let values: Vec<(u64, Option<u64>)> = request.keys.iter().map(|k| (*k, job.o_store.remove(k))).collect();
    let pulled: Vec<u64> = job.o_store.keys().take(request.pull).copied().collect();
    let extra: Vec<(u64, u64)> = pulled.iter().filter_map(|k| Some((*k, job.o_store.remove(k)?))).collect();
    if mutant != Mutant::NoRetention {
        let served = values
            .iter()
            .filter_map(|(k, v)| Some(entry(*k, (*v)?)))
            .chain(extra.iter().map(|(k, v)| entry(*k, *v)));
        job.o_cut.on_served(request.tag, served);
    }
    job.answers.push_back((values, extra));
}

/// A task's part of the running checkpoint; once both are in, the checkpoint completed: its
/// restore must be the oracle's state at its position.
fn take_part(
    job: &mut Job,
    latest: &mut Option<(CheckpointId, Part, Part)>,
    stats: &mut CutSimStats,
    task: &'static str,
    part: Part,
) -> Result<(), String> {
    let Some((id, parts)) = job.running.as_mut() else { return Ok(()) };
    parts.insert(task, part);
    if parts.len() < 2 {
        return Ok(());
    }
    let id = *id;
    let (Some(n), Some(o)) = (parts.remove("n"), parts.remove("o")) else { return Ok(()) };
    job.running = None;
    let restored = restore(&n, &o);
    let expected = oracle(n.position);
    if restored != expected {
        return Err(format!(
            "checkpoint {id} at position {} restores {restored:?}, the oracle's state is {expected:?}",
            n.position
        ));
    }
    stats.completed += 1;
    *latest = Some((id, n, o));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_completed_checkpoint_restores_the_oracles_state_over_many_seeds() {
        let mut totals = CutSimStats::default();
        for seed in 0..400 {
            let s = run_cut(seed, Mutant::None, None, true).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            totals.completed += s.completed;
            totals.crashes += s.crashes;
            totals.moved += s.moved;
            totals.retained += s.retained;
        }
        // The runs exercised what the rule is about.
        assert!(totals.completed > 400, "{totals:?}");
        assert!(totals.crashes > 100, "{totals:?}");
        assert!(totals.moved > 1000, "{totals:?}");
        assert!(totals.retained > 0, "no serve ever overtook a snapshot: {totals:?}");
    }

    #[test]
    fn a_crash_at_every_step_recovers_exactly() {
        for seed in 0..6 {
            let steps = run_cut(seed, Mutant::None, None, false).expect("clean run").steps;
            for at in 1..steps {
                run_cut(seed, Mutant::None, Some(at), false)
                    .unwrap_or_else(|e| panic!("seed {seed}, crash at step {at} of {steps}: {e}"));
            }
        }
    }

    fn caught(mutant: Mutant) -> usize {
        (0..400).filter(|s| run_cut(*s, mutant, None, true).is_err()).count()
    }

    #[test]
    fn leaving_out_any_part_of_the_rule_is_caught() {
        for mutant in [Mutant::NoRetention, Mutant::NoTombstones, Mutant::SnapshotWithFetchesOutstanding] {
            assert!(caught(mutant) > 0, "{mutant:?} passed every seed");
        }
    }
}
