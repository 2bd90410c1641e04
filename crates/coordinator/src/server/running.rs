//! The running phase of a job: one event loop over the workers' messages, client requests, the
//! reconfiguration schedule, checkpoints and recoveries, until every task has finished; then the
//! summary.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use koala_protocol::{ClientReply, CoordinatorMessage, ReconfigRequest, WorkerMessage};
use koala_types::WorkerId;

use super::startup::{EarlyClients, Started};
use super::{JobRun, JobSummary, memory_report};
use crate::autoscale::driver::Driver;
use crate::checkpoint::Checkpoints;
use crate::clock::unix_ms;
use crate::control::{Event, Registrations};
use crate::ending::EndWatch;
use crate::error::CoordinatorError;
use crate::http::live::{Live, Phase, Running};
use crate::job::{JobState, Queued};
use crate::metrics_store::{MetricSample, MetricsStore};
use crate::progress::{ProgressEvent, SecondAggregator};

/// How long a job that cannot recover waits, after a task failed, to hear that a worker died
/// ([`EventLoop::worker_lost_behind`]). Only a failing job waits.
const LOSS_GRACE: Duration = Duration::from_secs(1);

/// What the HTTP API was last handed: deployment epoch, running epoch, queued, completed and
/// finished tasks.
type Published = (u64, Option<u64>, usize, u64, usize);

/// A running job and everything its event loop keeps between turns.
pub(super) struct EventLoop<'a> {
    job: &'a JobRun,
    state: JobState<'a>,
    checkpoints: Option<Checkpoints>,
    events: Receiver<Event>,
    registrations: Registrations,
    live: Arc<Live>,
    /// Reconfigurations of the config not yet due: seconds from the start, request.
    schedule: VecDeque<(f64, ReconfigRequest)>,
    started: Instant,
    /// Seconds a resumed job had run before this start.
    resumed_s: f64,
    seconds: SecondAggregator,
    autoscale: Option<Driver>,
    heartbeat_timeout: Duration,
    end_watch: EndWatch,
    /// When each worker was last heard from.
    last_seen: BTreeMap<WorkerId, Instant>,
    /// The sources were told to stop (duration over, or asked to).
    stop_sent: bool,
    /// Asked to stop before the input ended.
    interrupted: bool,
    published: Published,
}

impl<'a> EventLoop<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        job: &'a JobRun,
        started: Started<'a>,
        events: Receiver<Event>,
        registrations: Registrations,
        live: Arc<Live>,
        schedule: VecDeque<(f64, ReconfigRequest)>,
        resumed_s: f64,
    ) -> Result<Self, CoordinatorError> {
        let Started { state, checkpoints, started } = started;
        let config = &job.config;
        let autoscale = Driver::new(config, state.graph)?;
        let mut seconds = SecondAggregator::new(state.graph, state.start_ms / 1000);
        if let Some((operator, budget)) = autoscale.as_ref().map(|a| a.driven()) {
            seconds = seconds.driving(operator, budget);
        }
        let last_seen = state.engine.deployment().workers.keys().map(|w| (*w, Instant::now())).collect();
        Ok(Self {
            job,
            state,
            checkpoints,
            events,
            registrations,
            live,
            schedule,
            started,
            resumed_s,
            seconds,
            autoscale,
            heartbeat_timeout: Duration::from_secs_f64(config.runtime.heartbeat_timeout_s),
            end_watch: EndWatch::new(Duration::from_secs_f64(config.runtime.end_timeout_s)),
            last_seen,
            stop_sent: false,
            interrupted: false,
            published: (0, None, 0, 0, 0),
        })
    }

    /// Runs the job until every task has finished, or an error no checkpoint recovers from.
    /// The requests that came while it started are submitted first, then a resumed job's pending
    /// ones start.
    pub(super) fn run(&mut self, early_clients: EarlyClients) -> Result<(), CoordinatorError> {
        for (request, reply) in early_clients {
            self.state.submit(request, reply)?;
        }
        self.state.start_next()?;
        loop {
            if self.state.engine.all_finished() {
                return Ok(());
            }
            // Only with nothing queued: a coordinator that was busy has heartbeats waiting.
            if let Some((worker, seen)) = self.last_seen.iter().min_by_key(|(_, t)| **t)
                && seen.elapsed() > self.heartbeat_timeout
                && self.events.is_empty()
            {
                let lost =
                    CoordinatorError::WorkerSilent { worker: *worker, seconds: seen.elapsed().as_secs_f64() };
                self.recover_from(lost)?;
                continue;
            }
            self.tick()?;
            let event = self.events.recv_timeout(Duration::from_millis(20));
            if let Ok(Event::Worker(worker, _)) = &event
                && !self.state.workers.contains(*worker)
            {
                // A worker of the job before a recovery: it no longer takes part.
                continue;
            }
            if let Ok(Event::Worker(worker, Some(_))) = &event {
                self.last_seen.insert(*worker, Instant::now());
            }
            self.on_event(event)?;
            self.after_event()?;
        }
    }

    /// What is due whatever arrived: checkpoints, stall and end checks, stopping the sources,
    /// and the scheduled reconfigurations.
    fn tick(&mut self) -> Result<(), CoordinatorError> {
        if let Some(c) = self.checkpoints.as_mut() {
            c.tick(&mut self.state)?;
        }
        self.state.check_stalled()?;
        self.state.check_ending(&mut self.end_watch)?;
        let asked_to_stop =
            self.job.stop.as_ref().is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed));
        let elapsed_s = self.started.elapsed().as_secs_f64();
        let duration_over =
            self.job.config.duration_s.is_some_and(|d| elapsed_s + self.resumed_s >= d as f64);
        if !self.stop_sent && (asked_to_stop || duration_over) {
            self.stop_sent = true;
            if asked_to_stop {
                self.interrupted = true;
                tracing::info!("asked to stop: the sources end now and the job drains what is in flight");
            }
            self.state.workers.broadcast(&CoordinatorMessage::StopSources)?;
        }
        while self.schedule.front().is_some_and(|(at, _)| self.started.elapsed().as_secs_f64() >= *at) {
            if let Some((_, request)) = self.schedule.pop_front() {
                self.state.queue.push_back(Queued { request, reply: None, came_ms: unix_ms() });
            }
            self.state.start_next()?;
        }
        Ok(())
    }

    /// Rolls the job back to its last completed checkpoint after `cause` (a lost or silent
    /// worker, a failed task), or fails with `cause` when no checkpoint can recover it.
    fn recover_from(&mut self, cause: CoordinatorError) -> Result<(), CoordinatorError> {
        let sinks_done = sinks_finished(&self.state);
        let Some(c) = self.checkpoints.as_mut().filter(|c| c.may_recover() && !sinks_done) else {
            return Err(self.worker_lost_behind(cause));
        };
        let ids = c.recover(&mut self.state, &mut self.registrations, &self.events, &cause)?;
        self.last_seen = ids.into_iter().map(|w| (w, Instant::now())).collect();
        // The restored sources run until they are told to stop again.
        self.stop_sent = false;
        Ok(())
    }

    /// The cause to fail with for `cause`: a task that failed is often the first sign of a worker
    /// that died (its channel to a task there broke before the worker's control connection was
    /// seen closing), so a worker lost within [`LOSS_GRACE`] after it is named as the cause.
    fn worker_lost_behind(&self, cause: CoordinatorError) -> CoordinatorError {
        let CoordinatorError::TaskFailed { task, error } = cause else { return cause };
        let deadline = Instant::now() + LOSS_GRACE;
        while let Some(wait) = deadline.checked_duration_since(Instant::now()) {
            match self.events.recv_timeout(wait) {
                Ok(Event::Worker(worker, None)) => {
                    return CoordinatorError::WorkerLostBehindTask { worker, task, error };
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        CoordinatorError::TaskFailed { task, error }
    }

    fn on_event(&mut self, event: Result<Event, RecvTimeoutError>) -> Result<(), CoordinatorError> {
        match event {
            Ok(Event::Worker(_, Some(WorkerMessage::Metrics(samples)))) => {
                self.live.add_samples(&samples);
                self.state.totals.add(self.state.graph, &samples);
                self.seconds.add(&samples);
                let rows: Vec<MetricSample> = samples
                    .iter()
                    .map(|s| MetricSample {
                        time_s: s.time_s,
                        task: self.state.name(s.task),
                        metric: s.metric.clone(),
                        value: s.value,
                    })
                    .collect();
                self.state.store.insert_samples(&self.job.run, &rows)?;
            }
            Ok(Event::Worker(_, Some(WorkerMessage::TaskFinished { task }))) => {
                self.state.task_finished(task)?;
                if let Some(c) = self.checkpoints.as_mut() {
                    c.on_finished(&mut self.state, task)?;
                }
            }
            Ok(Event::Worker(worker, Some(WorkerMessage::CheckpointAck { task, id, ack }))) => {
                let Some(c) = self.checkpoints.as_mut() else {
                    return Err(CoordinatorError::Protocol {
                        epoch: self.state.epoch,
                        source_task: worker.to_string(),
                        error: format!("a checkpoint {id} acknowledgement in a job without checkpoints"),
                    });
                };
                c.on_ack(&mut self.state, task, id, ack)?;
            }
            Ok(Event::Worker(_, Some(WorkerMessage::TaskFailed { task, error }))) => {
                // With checkpoints, a failed task rolls the job back like a lost worker does:
                // often it failed because a worker died (its channel to a task there broke)
                // before the coordinator heard of the death.
                let failed = CoordinatorError::TaskFailed { task: self.state.name(task), error };
                self.recover_from(failed)?;
            }
            Ok(Event::Worker(_, Some(WorkerMessage::TaskAck { task, epoch, ack }))) => {
                self.state.on_ack(task, epoch, ack)?;
            }
            Ok(Event::Worker(worker, None)) => self.recover_from(CoordinatorError::WorkerLost(worker))?,
            Ok(Event::Worker(_, Some(WorkerMessage::Heartbeat))) => {}
            Ok(Event::Worker(_, Some(WorkerMessage::FirstOutput { unix_ms, .. }))) => {
                if let Some(c) = self.checkpoints.as_mut() {
                    c.on_first_output(&mut self.state, unix_ms)?;
                }
            }
            Ok(Event::Worker(worker, Some(WorkerMessage::Memory(report)))) => {
                memory_report(self.job, worker, report)
            }
            Ok(Event::Worker(worker, Some(other))) => {
                let what = format!("{other:?}").chars().take(60).collect::<String>();
                return Err(CoordinatorError::Protocol {
                    epoch: self.state.epoch,
                    source_task: worker.to_string(),
                    error: format!("unexpected message while the job runs: {what}"),
                });
            }
            Ok(Event::Client(request, reply)) => self.state.submit(request, reply)?,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return Err(CoordinatorError::Timeout("event channel closed".into()));
            }
        }
        Ok(())
    }

    /// One aggregator: the seconds every task has reported feed the policy and the progress
    /// lines alike; the HTTP API gets what changed.
    fn after_event(&mut self) -> Result<(), CoordinatorError> {
        let complete = self.seconds.complete(unix_ms() / 1000);
        if let Some(a) = self.autoscale.as_mut() {
            a.tick(&mut self.state, self.stop_sent, &complete)?;
        }
        publish(&self.live, &self.state, &mut self.published);
        if let Some(tx) = &self.job.progress {
            for s in complete {
                let _ = tx.send(ProgressEvent::Second(s.progress));
            }
        }
        Ok(())
    }

    /// Ends the run: records how it ended, shuts the workers down, refuses what is still queued
    /// and, if it ran to its end, settles the metrics and sums it up.
    pub(super) fn finish(
        mut self,
        result: Result<(), CoordinatorError>,
    ) -> Result<JobSummary, CoordinatorError> {
        let job = self.job;
        record_end(&mut self.state.store, &job.run, &result, self.interrupted);
        self.live.update(|now| now.phase = Phase::Ended);
        let _ = self.state.workers.broadcast(&CoordinatorMessage::Shutdown);
        result?;
        if self.state.engine.running().is_some() {
            tracing::warn!(waiting = ?self.state.engine.waiting_for(), "the job ended during a reconfiguration");
        }
        for q in self.state.queue.drain(..) {
            if let Some(r) = q.reply {
                let _ = r.send(ClientReply::Rejected { error: "the job ended first".into() });
            }
        }
        if let Some(tx) = &job.progress {
            for s in self.seconds.complete(u64::MAX) {
                let _ = tx.send(ProgressEvent::Second(s.progress));
            }
        }
        // Every sample is stored now. Koala's and DRRS's tasks acknowledge no bytes (their state
        // moves after the hand-over or in the background): each of their reconfigurations gets
        // the report's figure. Stop-and-restart's and Remote's acknowledged hand-over is exact
        // per reconfiguration already (their tasks' `state_bytes_eager` count the same bytes).
        if job.config.protocol.keeps_processing() {
            crate::report::settle_bytes_moved(&mut self.state.store, &job.run)?;
        }
        let totals = std::mem::take(&mut self.state.totals);
        let (checkpoints, checkpoints_skipped, recoveries) =
            self.checkpoints.map(|c| (c.completed, c.skipped, c.recoveries)).unwrap_or_default();
        Ok(JobSummary {
            run: job.run.clone(),
            elapsed: self.started.elapsed(),
            records_in: totals.records_in,
            records_out: totals.records_out,
            records_in_once: totals.records_in_once(),
            records_out_once: totals.records_out_once(),
            replayed_at_least: totals.replayed_at_least,
            rewritten_at_least: totals.rewritten_at_least,
            late_dropped: totals.late_dropped,
            metrics_db: job.config.metrics_path(),
            reconfigurations: self.state.completed,
            checkpoints,
            checkpoints_skipped,
            recoveries,
            interrupted: self.interrupted,
            malformed: totals.malformed,
        })
    }
}

/// Records in the metrics store how the run ended: failed (`result`'s error), interrupted (asked
/// to stop before its input ended) or finished. A failure to record is logged: the run's own
/// outcome matters more.
fn record_end(store: &mut MetricsStore, run: &str, result: &Result<(), CoordinatorError>, interrupted: bool) {
    use crate::metrics_store::RunStatus;
    let (status, detail) = match result {
        Err(e) => (RunStatus::Failed, Some(e.to_string())),
        Ok(()) if interrupted => (
            RunStatus::Interrupted,
            Some("asked to stop before its input ended: the sources were cut short".into()),
        ),
        Ok(()) => (RunStatus::Finished, None),
    };
    if let Err(e) = store.end_run(run, status, unix_ms(), detail.as_deref()) {
        tracing::warn!(error = %e, "could not record how the run ended");
    }
}

/// Hands the deployment and the reconfiguration queue to the HTTP API when they changed
/// (`published`: what it has).
fn publish(live: &Live, state: &JobState<'_>, published: &mut (u64, Option<u64>, usize, u64, usize)) {
    let d = state.engine.deployment();
    let running = state.engine.running();
    let now = (d.epoch, running.map(|p| p.epoch), state.queue.len(), state.completed, d.finished.len());
    if now == *published {
        return;
    }
    *published = now;
    let running = running.map(|p| Running {
        epoch: p.epoch,
        operator: state.graph.operator(p.operator).map_or(String::new(), |o| o.name.clone()),
    });
    let (deployment, queued, completed) = (d.clone(), state.queue.len(), state.completed);
    live.update(|snapshot| {
        snapshot.deployment = Some(deployment);
        snapshot.running = running;
        snapshot.queued = queued;
        snapshot.completed = completed;
    });
}

/// Whether every sink task finished: its output is final, so a lost worker then ends the job
/// as before instead of replaying (a restored sink would write it again).
fn sinks_finished(state: &JobState) -> bool {
    let d = state.engine.deployment();
    state
        .graph
        .operators
        .iter()
        .filter(|o| matches!(o.kind, koala_dataflow::OperatorKind::Sink { .. }))
        .flat_map(|o| {
            d.tasks.get(&o.id).into_iter().flatten().map(move |i| koala_types::TaskId::new(o.id, *i))
        })
        .all(|t| d.finished.contains(&t))
}
