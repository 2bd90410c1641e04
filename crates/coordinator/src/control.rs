//! The coordinator's control port: workers register on it (then stay connected), and clients
//! (`koala rescale|rebalance|migrate`) submit one request each and get one reply. Every
//! connection is admitted by the port's [`Gate`] first (protocol version, job token, bounds on
//! unadmitted connections: `koala_types::handshake`), each on its own thread, so a silent peer
//! holds no one up.

use std::collections::BTreeMap;
use std::io::{BufReader, BufWriter, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use koala_protocol::{ClientReply, ControlHello, CoordinatorMessage, ReconfigRequest, WorkerMessage};
use koala_types::WorkerId;
use koala_types::frame::{read_frame, write_frame};
use koala_types::handshake::{ControlLimits, Gate, Refusal, Role, Token, connect_control};
use koala_types::tls::{Conn, ConnReader, ConnWriter, Tls, accepted};

use crate::error::CoordinatorError;

/// How long the coordinator waits for workers to register and to acknowledge a deployment.
pub(crate) const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Something that happened on the control plane.
pub enum Event {
    /// A worker sent a message; `None` when its connection closed.
    Worker(WorkerId, Option<WorkerMessage>),
    /// A client submitted a request; answer on the sender.
    Client(ReconfigRequest, Sender<ClientReply>),
}

/// The registered workers' control connections.
pub struct Workers {
    writers: BTreeMap<WorkerId, BufWriter<ConnWriter>>,
    /// Data-plane address of every worker.
    pub addrs: BTreeMap<WorkerId, String>,
}

impl Workers {
    /// Sends one message to one worker.
    pub fn send(&mut self, worker: usize, msg: &CoordinatorMessage) -> Result<(), CoordinatorError> {
        let id = WorkerId(worker as u32);
        let w = self.writers.get_mut(&id).ok_or_else(|| CoordinatorError::Io {
            context: format!("sending to {id}"),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such worker"),
        })?;
        write_frame(w, msg).and_then(|_| w.flush()).map_err(|source| CoordinatorError::Io {
            context: format!("sending to worker{worker}"),
            source,
        })?;
        Ok(())
    }

    /// Sends one message to every worker.
    pub fn broadcast(&mut self, msg: &CoordinatorMessage) -> Result<(), CoordinatorError> {
        let ids: Vec<WorkerId> = self.writers.keys().copied().collect();
        for id in ids {
            self.send(id.0 as usize, msg)?;
        }
        Ok(())
    }

    /// Sends one message to every worker that still takes it: a worker whose connection broke
    /// is skipped with a warning, as its loss reaches the event loop when the connection's reader
    /// sees it close (or its heartbeats stop), which starts a recovery. For the checkpoint
    /// messages, so a worker killed as a checkpoint starts or completes is recovered from instead
    /// of failing the job on the write.
    pub fn broadcast_to_reachable(&mut self, msg: &CoordinatorMessage) {
        let ids: Vec<WorkerId> = self.writers.keys().copied().collect();
        for id in ids {
            if let Err(e) = self.send(id.0 as usize, msg) {
                tracing::warn!(worker = %id, "{e}; its loss is handled when its connection closes");
            }
        }
    }

    /// Whether no worker registered.
    pub fn is_empty(&self) -> bool {
        self.writers.is_empty()
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.writers.len()
    }

    /// Whether `worker` is one of these (not one of an earlier run of the job: recovery).
    pub fn contains(&self, worker: WorkerId) -> bool {
        self.writers.contains_key(&worker)
    }

    /// The workers' ids.
    pub fn ids(&self) -> Vec<WorkerId> {
        self.writers.keys().copied().collect()
    }
}

/// A worker's registration as the accept thread hands it over: its control connection, data
/// address and pid, or why an authenticated worker could not register (another build: the job
/// fails loudly rather than wait for it).
type Registration = Result<(Conn, String, u32), String>;

/// Workers that register after the job started (a recovery: restarted or replacement workers).
pub struct Registrations {
    incoming: Receiver<Registration>,
    next_id: u32,
    events: Sender<Event>,
}

impl Registrations {
    /// Waits (at most `limit`) for `count` workers to register, then takes any others already
    /// waiting (a replacement); ids continue after every id given so far.
    pub fn collect(&mut self, count: u32, limit: Duration) -> Result<Workers, CoordinatorError> {
        let mut workers = collect_workers(&self.incoming, count, &self.events, self.next_id, limit)?;
        while let Ok(Ok((stream, addr, pid))) = self.incoming.try_recv() {
            let id = WorkerId(self.next_id + workers.len() as u32);
            register(&mut workers, id, (stream, addr, pid), &self.events)?;
        }
        self.next_id += workers.len() as u32;
        Ok(workers)
    }
}

/// Accepts connections for the life of the job, each admitted by `gate` (after a TLS handshake,
/// with `tls`): the first `expected` workers are returned once registered; clients are turned
/// into [`Event::Client`]s.
pub fn accept(
    listener: &TcpListener,
    gate: Gate,
    tls: Option<Tls>,
    expected: u32,
    events: &Sender<Event>,
) -> Result<(Workers, Registrations), CoordinatorError> {
    let (worker_tx, worker_rx) = unbounded::<Registration>();
    let accept_listener = listener
        .try_clone()
        .map_err(|source| CoordinatorError::Io { context: "cloning the control listener".into(), source })?;
    let client_events = events.clone();
    std::thread::Builder::new()
        .name("koala-accept".into())
        .spawn(move || accept_loop(&accept_listener, &gate, tls.as_ref(), &worker_tx, &client_events))
        .map_err(|source| CoordinatorError::Io { context: "spawning the accept thread".into(), source })?;
    let workers = collect_workers(&worker_rx, expected, events, 0, STARTUP_TIMEOUT)?;
    let next_id = workers.len() as u32;
    Ok((workers, Registrations { incoming: worker_rx, next_id, events: events.clone() }))
}

fn accept_loop(
    listener: &TcpListener,
    gate: &Gate,
    tls: Option<&Tls>,
    workers: &Sender<Registration>,
    events: &Sender<Event>,
) {
    for conn in listener.incoming() {
        let Ok(stream) = conn else { continue };
        let peer = stream.peer_addr().map_or_else(|_| "?".into(), |a| a.to_string());
        let pending = match gate.enter(&stream) {
            Ok(pending) => pending,
            Err(refusal) => {
                tracing::warn!(%peer, reason = %refusal, "control port: refused a connection");
                continue;
            }
        };
        let (workers, events) = (workers.clone(), events.clone());
        let (tls, idle) = (tls.cloned(), gate.idle());
        let spawned = std::thread::Builder::new().name("koala-greeting".into()).spawn(move || {
            let mut stream = match accepted(tls.as_ref(), stream, idle) {
                Ok(stream) => stream,
                Err(e) => {
                    return tracing::warn!(%peer, error = %e, "control port: refused a connection (TLS)");
                }
            };
            let role = match pending.admit(&mut stream) {
                Ok(role) => role,
                Err(refusal) => return refused(&peer, &refusal, &workers),
            };
            greeted(stream, role, &peer, &workers, &events);
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot spawn a thread for a control connection; dropped");
        }
    }
}

/// Logs a refusal; a worker of another build (it had the token, or none is required) also
/// fails the registration under way, loudly, instead of leaving the job waiting for it.
fn refused(peer: &str, refusal: &Refusal, workers: &Sender<Registration>) {
    tracing::warn!(%peer, reason = %refusal, "control port: refused a connection");
    if let Refusal::Version { role: Role::Worker, .. } = refusal {
        tracing::error!(%peer, reason = %refusal, "a worker of another koala build tried to register");
        let _ = workers.send(Err(format!("the worker at {peer} was refused: {refusal}")));
    }
}

/// Reads the hello of an admitted connection and hands it on.
fn greeted(mut stream: Conn, role: Role, peer: &str, workers: &Sender<Registration>, events: &Sender<Event>) {
    let _ = stream.tcp().set_nodelay(true);
    let _ = stream.tcp().set_read_timeout(Some(Duration::from_secs(10)));
    // Unbuffered: nothing after the hello may be taken from the connection here.
    match (role, read_frame::<_, ControlHello>(&mut stream)) {
        (Role::Worker, Ok(Some(ControlHello::Worker { data_addr, pid }))) => {
            tracing::debug!(%data_addr, pid, "a worker said hello");
            let _ = stream.tcp().set_read_timeout(None);
            if workers.send(Ok((stream, data_addr, pid))).is_err() {
                tracing::error!("a worker registered after the job ended; ignored");
            }
        }
        (Role::Client, Ok(Some(ControlHello::Client(request)))) => answer_client(stream, request, events),
        (Role::Worker, other) => {
            // Same version and token, yet no worker hello: a broken build, not a stranger.
            let error = format!("the worker at {peer} sent no valid registration ({other:?})");
            tracing::error!(%peer, "{error}");
            let _ = workers.send(Err(error));
        }
        (role, other) => {
            tracing::error!(%peer, ?role, ?other, "an admitted connection sent no valid hello; dropped")
        }
    }
}

fn answer_client(stream: Conn, request: ReconfigRequest, events: &Sender<Event>) {
    let reply = request_reply(events, request);
    let mut w = BufWriter::new(stream);
    if write_frame(&mut w, &reply).and_then(|_| w.flush()).is_err() {
        tracing::warn!("a client left before its reply");
    }
}

/// Hands a client's request to the job's event loop and waits for its answer: the one path of
/// every request, whether it came over the framed control protocol (`koala rescale` …) or over
/// HTTP (`POST /api/rescale` …). The event loop validates it against the current deployment
/// (`reconfig::plan`) and queues or starts it.
pub fn request_reply(events: &Sender<Event>, request: ReconfigRequest) -> ClientReply {
    let (tx, rx) = bounded(1);
    if events.send(Event::Client(request, tx)).is_err() {
        return ClientReply::Rejected { error: "the job has ended".into() };
    }
    rx.recv_timeout(Duration::from_secs(30)).unwrap_or(ClientReply::Rejected {
        error: "the coordinator did not answer within 30 s; it may still take the request \
                    later: watch the job's output for its start before resubmitting"
            .into(),
    })
}

/// What a client prints for a reply: `Ok` with the line for an accepted or queued request,
/// `Err` with the line for a rejected one (`koala rescale` and `POST /api/rescale` alike).
pub fn reply_line(reply: &ClientReply) -> Result<String, String> {
    match reply {
        ClientReply::Accepted { epoch } => Ok(format!("accepted as reconfiguration {epoch}")),
        ClientReply::Queued { ahead } => {
            Ok(format!("queued behind {ahead} reconfiguration(s); it starts when they complete"))
        }
        ClientReply::Rejected { error } => Err(format!("rejected: {error}")),
    }
}

/// The most buckets one request may list, all moves together: as many as there are bucket ids
/// (`u16`). Ranges expand as they are parsed, so a short text could otherwise list billions.
pub const MAX_LISTED_BUCKETS: usize = 1 << 16;

/// Parses a bucket move, `BUCKETS:TASK` (`3,4,10-12:1`: buckets 3, 4, 10, 11 and 12 go to task
/// 1), for `koala rebalance --move` and `POST /api/rebalance` alike; `field` names the input in
/// errors (`--move`, `moves[0]`).
pub fn parse_move(text: &str, field: &str) -> Result<(Vec<u16>, u32), String> {
    let (buckets, task) = text
        .split_once(':')
        .ok_or_else(|| format!("{field} {text:?}: expected BUCKETS:TASK, e.g. 3,4,10-12:1"))?;
    let task: u32 =
        task.trim().parse().map_err(|_| format!("{field} {text:?}: task {task:?} is not a number"))?;
    let mut out = Vec::new();
    for part in buckets.split(',') {
        let part = part.trim();
        let bad = || format!("{field} {text:?}: {part:?} is not a bucket or a range like 10-12");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u16, u16) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b {
                    return Err(format!("{field} {text:?}: range {part:?} is empty"));
                }
                if out.len() + usize::from(b - a) + 1 > MAX_LISTED_BUCKETS {
                    return Err(too_many_buckets(field));
                }
                out.extend(a..=b);
            }
            None if out.len() < MAX_LISTED_BUCKETS => out.push(part.parse().map_err(|_| bad())?),
            None => return Err(too_many_buckets(field)),
        }
    }
    Ok((out, task))
}

/// The error of a request listing more than [`MAX_LISTED_BUCKETS`] buckets.
pub fn too_many_buckets(field: &str) -> String {
    format!(
        "{field}: more than {MAX_LISTED_BUCKETS} buckets listed; a bucket moves once, so list each at most once"
    )
}

fn collect_workers(
    incoming: &Receiver<Registration>,
    expected: u32,
    events: &Sender<Event>,
    first_id: u32,
    limit: Duration,
) -> Result<Workers, CoordinatorError> {
    let mut workers = Workers { writers: BTreeMap::new(), addrs: BTreeMap::new() };
    let deadline = Instant::now() + limit;
    while (workers.writers.len() as u32) < expected {
        let registration = incoming
            .recv_deadline(deadline)
            .map_err(|_| {
                CoordinatorError::Timeout(format!(
                    "only {} of {expected} workers registered",
                    workers.writers.len()
                ))
            })?
            .map_err(CoordinatorError::Registration)?;
        let id = WorkerId(first_id + workers.writers.len() as u32);
        register(&mut workers, id, registration, events)?;
    }
    Ok(workers)
}

/// Welcomes a registered worker as `id` and starts reading its messages. Ids follow registration
/// order; the log line ties each to its process (pid) and address, and the worker names its data
/// dir after it (`koala_runtime::WORKER_ID_PLACEHOLDER`).
fn register(
    workers: &mut Workers,
    id: WorkerId,
    (stream, data_addr, pid): (Conn, String, u32),
    events: &Sender<Event>,
) -> Result<(), CoordinatorError> {
    tracing::info!(worker = %id, pid, %data_addr, "{id} registered: pid {pid}, data address {data_addr}");
    let (reader, writer) = stream
        .split()
        .map_err(|source| CoordinatorError::Io { context: "splitting a worker connection".into(), source })?;
    let reader = BufReader::new(reader);
    workers.addrs.insert(id, data_addr);
    workers.writers.insert(id, BufWriter::new(writer));
    workers.send(id.0 as usize, &CoordinatorMessage::Welcome { worker: id })?;
    let events = events.clone();
    std::thread::Builder::new()
        .name(format!("koala-from-{id}"))
        .spawn(move || read_worker(id, reader, &events))
        .map_err(|source| CoordinatorError::Io { context: "spawning a worker reader".into(), source })?;
    Ok(())
}

fn read_worker(id: WorkerId, mut reader: BufReader<ConnReader>, events: &Sender<Event>) {
    loop {
        match read_frame::<_, WorkerMessage>(&mut reader) {
            Ok(Some(m)) => {
                if events.send(Event::Worker(id, Some(m))).is_err() {
                    return;
                }
            }
            Ok(None) => break,
            Err(e) => {
                tracing::error!(worker = %id, error = %e, "bad frame from worker; dropping its connection");
                break;
            }
        }
    }
    let _ = events.send(Event::Worker(id, None));
}

/// Sends one request to a running coordinator and waits for its reply (`koala rescale` …),
/// presenting `token` (required if the coordinator does not listen on loopback), over TLS with
/// `tls`. The handshake is bounded and names a peer that is not a control port
/// (`connect_control`: the HTTP API).
pub fn submit(
    coordinator: &str,
    request: ReconfigRequest,
    token: Option<&Token>,
    tls: Option<&Tls>,
) -> std::io::Result<ClientReply> {
    let mut stream = connect_control(coordinator, Role::Client, token, tls, ControlLimits::default())?;
    let mut w = BufWriter::new(&mut stream);
    write_frame(&mut w, &ControlHello::Client(request))?;
    w.flush()?;
    drop(w);
    stream.tcp().set_read_timeout(Some(Duration::from_secs(60)))?;
    read_frame(&mut BufReader::new(stream))?.ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the coordinator closed the connection")
    })
}
