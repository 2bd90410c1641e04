//! The batch pipeline of a Koala task (docs/protocols.md §6, paper §3.1 Fig. 3c, §3.4): records queue in
//! arrival order; a batch whose keys are all local is processed at once; otherwise the task fetches
//! the remote keys from their KLT locations in one hop (one request per location, in parallel),
//! installs the answers, marks the keys local and then processes the batch in input order. Fetches
//! to retired tasks piggyback up to N extra keys, and an idle task keeps pulling them.
//!
//! At most one fetch round is outstanding at a time; a hand-over waits for it, so a sender never
//! gives away a bucket whose keys are in flight towards it.
//!
//! Every queued record keeps the operator input it arrived on; a batch goes to the operator as
//! consecutive runs of one input, in arrival order.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use koala_types::{BucketId, Record, TaskId, bucket_of};

use super::error::ProtocolError;
use super::klt::key_hash;
use super::messages::{ExtraKeys, FetchRequest, FetchResponse};
use super::task::{KoalaTask, TaskAction};

/// A fetch sent and not answered.
#[derive(Clone, Debug)]
struct Outstanding {
    location: TaskId,
    keys: BTreeSet<Vec<u8>>,
    extra_buckets: BTreeSet<BucketId>,
}

/// A record with the operator input it arrived on (0, or 1 for the right side of a join).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct InputRecord {
    pub(crate) input: usize,
    pub(crate) record: Record,
}

/// Splits records into consecutive runs of one input, keeping their order.
pub(crate) fn runs_by_input(records: impl IntoIterator<Item = InputRecord>) -> Vec<(usize, Vec<Record>)> {
    let mut runs: Vec<(usize, Vec<Record>)> = Vec::new();
    for InputRecord { input, record } in records {
        match runs.last_mut() {
            Some((i, run)) if *i == input => run.push(record),
            _ => runs.push((input, vec![record])),
        }
    }
    runs
}

/// A batch waiting for state.
#[derive(Clone, Debug)]
struct Waiting {
    batch: Vec<InputRecord>,
    needs: BTreeSet<u64>,
}

/// Records not yet processed and fetches in flight.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pipeline {
    pub(crate) inbox: VecDeque<InputRecord>,
    waiting: Option<Waiting>,
    outstanding: BTreeMap<u64, Outstanding>,
    next_id: u64,
}

impl Pipeline {
    /// No batch waits and no fetch is outstanding: the task is between two batches.
    pub(crate) fn is_quiet(&self) -> bool {
        self.waiting.is_none() && self.outstanding.is_empty()
    }

    fn request(
        &mut self,
        location: TaskId,
        keys: BTreeSet<Vec<u8>>,
        extra: Option<ExtraKeys>,
    ) -> (u64, FetchRequest) {
        self.next_id += 1;
        let id = self.next_id;
        let extra_buckets = extra.as_ref().map(|e| e.buckets.iter().copied().collect()).unwrap_or_default();
        let request = FetchRequest { id, keys: keys.iter().cloned().collect(), extra };
        self.outstanding.insert(id, Outstanding { location, keys, extra_buckets });
        (id, request)
    }
}

impl KoalaTask {
    /// Processes or starts fetching the next batch; true if it did anything.
    pub(super) fn try_process(&mut self, out: &mut Vec<TaskAction>) -> bool {
        if self.pipeline.waiting.is_some() || self.pipeline.inbox.is_empty() {
            return false;
        }
        let mut remote: BTreeMap<TaskId, BTreeSet<Vec<u8>>> = BTreeMap::new();
        for InputRecord { record: r, .. } in &self.pipeline.inbox {
            let bucket = bucket_of(&r.key, self.num_buckets);
            match self.klt.location(bucket, key_hash(&r.key)) {
                Some(loc) if loc == self.id => {}
                Some(loc) => {
                    remote.entry(loc).or_default().insert(r.key.clone());
                }
                None => {
                    // Inbox records are owned when queued and a hand-over takes its buckets' records
                    // out first, so this cannot happen; refuse to touch unowned state if it does.
                    debug_assert!(false, "unowned record in the inbox");
                    return false;
                }
            }
        }
        if remote.is_empty() {
            let batch: Vec<InputRecord> = self.pipeline.inbox.drain(..).collect();
            self.finish_batch(batch, out);
            self.pull(out);
            return true;
        }
        if !self.pipeline.outstanding.is_empty() {
            return false;
        }
        let batch: Vec<InputRecord> = self.pipeline.inbox.drain(..).collect();
        let mut needs = BTreeSet::new();
        for (loc, keys) in remote {
            let extra = self.extra_for(loc);
            let (id, request) = self.pipeline.request(loc, keys, extra);
            needs.insert(id);
            out.push(TaskAction::FetchState { from: loc, request });
        }
        self.pipeline.waiting = Some(Waiting { batch, needs });
        self.pull(out);
        true
    }

    fn finish_batch(&mut self, batch: Vec<InputRecord>, out: &mut Vec<TaskAction>) {
        for r in &batch {
            self.held.remove(r.record.time);
        }
        for (input, records) in runs_by_input(batch) {
            out.push(TaskAction::Process { input, records });
        }
    }

    /// The progressive part of a fetch to `location` (paper §3.4), if it is retired.
    fn extra_for(&self, location: TaskId) -> Option<ExtraKeys> {
        if self.extra_keys == 0 || !self.retired.contains(&location) {
            return None;
        }
        let buckets = self.klt.buckets_at(location);
        (!buckets.is_empty()).then_some(ExtraKeys { buckets, max: self.extra_keys })
    }

    /// Background pull from every retired location without an outstanding request.
    pub(super) fn pull(&mut self, out: &mut Vec<TaskAction>) {
        if self.extra_keys == 0 || self.transition.as_ref().is_some_and(|t| t.hand_over_pending()) {
            return;
        }
        let busy: BTreeSet<TaskId> = self.pipeline.outstanding.values().map(|o| o.location).collect();
        let retired: Vec<TaskId> = self.retired.iter().copied().filter(|l| !busy.contains(l)).collect();
        for loc in retired {
            if let Some(extra) = self.extra_for(loc) {
                let (_, request) = self.pipeline.request(loc, BTreeSet::new(), Some(extra));
                out.push(TaskAction::FetchState { from: loc, request });
            }
        }
    }

    pub(super) fn on_fetch_request(
        &mut self,
        from: TaskId,
        request: FetchRequest,
        out: &mut Vec<TaskAction>,
    ) -> Result<(), ProtocolError> {
        let extra_buckets = request.extra.iter().flat_map(|e| e.buckets.iter().copied());
        let key_buckets = request.keys.iter().map(|k| bucket_of(k, self.num_buckets));
        for bucket in key_buckets.chain(extra_buckets) {
            if self.klt.owns(bucket) {
                return Err(ProtocolError::FetchOfOwnedBucket { from, bucket });
            }
        }
        out.push(TaskAction::ServeFetch { to: from, request });
        Ok(())
    }

    pub(super) fn on_fetch_response(
        &mut self,
        from: TaskId,
        response: FetchResponse,
        out: &mut Vec<TaskAction>,
    ) -> Result<(), ProtocolError> {
        let unknown = ProtocolError::UnknownFetchResponse { from, request: response.id };
        let Some(o) = self.pipeline.outstanding.get(&response.id) else {
            return Err(unknown);
        };
        let answers_request = o.location == from
            && response.values.iter().all(|(k, _)| o.keys.contains(k))
            && response.extra.iter().all(|(k, _)| o.extra_buckets.contains(&bucket_of(k, self.num_buckets)))
            && response.exhausted.iter().all(|b| o.extra_buckets.contains(b));
        if !answers_request {
            return Err(unknown);
        }
        let Some(o) = self.pipeline.outstanding.remove(&response.id) else {
            return Err(unknown);
        };
        let mut entries = Vec::new();
        // Requested keys the location did not have are new: local from now on, too.
        for key in o.keys {
            self.klt.mark_local(bucket_of(&key, self.num_buckets), key_hash(&key));
        }
        for (key, value) in response.values {
            if let Some(v) = value {
                entries.push((key, v));
            }
        }
        for (key, value) in response.extra {
            self.klt.mark_local(bucket_of(&key, self.num_buckets), key_hash(&key));
            entries.push((key, value));
        }
        for b in response.exhausted {
            self.klt.exhausted(b, from);
        }
        if !entries.is_empty() {
            out.push(TaskAction::InstallState { entries });
        }
        let ready = match self.pipeline.waiting.as_mut() {
            Some(w) => {
                w.needs.remove(&response.id);
                w.needs.is_empty()
            }
            None => false,
        };
        if ready && let Some(w) = self.pipeline.waiting.take() {
            self.finish_batch(w.batch, out);
        }
        Ok(())
    }
}
