//! Remote state (`[state] backend = "remote"`, the Remote baseline of paper §5.1.2;
//! docs/architecture.md §5 "Remote state"): keyed state lives in one or more state servers
//! ([`StateServer`], `koala state-server`), each an fjall database behind the project's framed
//! TCP codec (`koala_types::frame`), and tasks reach it through a [`RemoteEnv`].
//!
//! - **Key space.** A server keeps one keyspace per *operator*, not per task: a key written by
//!   task 0 is read by whichever task owns its bucket afterwards. That is what makes a
//!   reconfiguration move ownership and no state (the `remote` protocol, docs/protocols.md §7.1).
//!   Opening a task opens a handle on its operator's key space; [`StateEnv::drop_task`]
//!   invalidates the task's handles and keeps the data (another task owns it now).
//! - **Partitioning.** Bucket `b` lives on server `b mod n` of the `n` servers the env was given
//!   (the same list, in the same order, on every worker).
//! - **Batching.** [`StateBackend::get_many`] and [`StateBackend::write_many`] send one request
//!   per server involved, all before reading any answer, so a batch costs one round trip however
//!   many servers it touches. A write batch is atomic per server (a failure is fatal anyway: the
//!   worker stops, see [`StateError`]). Scans stream one bucket at a time over a connection of
//!   their own (a scan's sink may use the store); each bucket is read from a server snapshot.
//! - **Link.** Every request and answer crosses the worker's emulated link if one is set
//!   ([`RemoteEnv::with_link`], `[runtime] link_mb_per_sec`), since they stand in for network
//!   traffic.
//! - **Cache.** None here; the runtime may put a write-back cache in front
//!   ([`crate::CachedEnv`], `[state] cache_mb`), whose dirty entries the `remote` protocol
//!   flushes with [`StateBackend::release_buckets`] before a bucket's new owner reads it.
//!
//! ```
//! use koala_state::{RemoteEnv, StateEnv, StateKey, StateServer, StateWrite};
//! use koala_types::{OperatorId, TaskId};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let server = StateServer::start("127.0.0.1:0", dir.path(), None, None)?;
//! let env = RemoteEnv::new(vec![server.addr().to_string()], None);
//! let (t0, t1) = (TaskId::new(OperatorId(1), 0), TaskId::new(OperatorId(1), 1));
//! let key = StateKey::new(7, 0, b"user-42".to_vec());
//! env.open_task(t0)?.write_many(vec![StateWrite::Put(key.clone(), b"3".to_vec())])?;
//! // Bucket 7 changes owner: task 1 reads what task 0 wrote; nothing moved.
//! assert_eq!(env.open_task(t1)?.get_many(&[key])?, vec![Some(b"3".to_vec())]);
//! # Ok(())
//! # }
//! ```

mod pool;
mod server;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use koala_types::handshake::Token;
use koala_types::tls::Tls;
use koala_types::{BucketId, OperatorId, TaskId};
use serde::{Deserialize, Serialize};

use crate::key::check_value;
use crate::scan::{Chunker, sorted_buckets};
use crate::{
    LayoutError, ScanSink, StateBackend, StateEnv, StateError, StateKey, StateWrite, encode_state_key,
};

use pool::{Conn, Pool, Servers};
pub use server::StateServer;

/// Bytes per chunk a server streams a bucket scan in.
const SERVER_SCAN_CHUNK: usize = 256 * 1024;

/// A request to a state server: one frame, answered by one [`StateResponse`] frame (a scan by
/// [`StateResponse::Chunk`]s, then [`StateResponse::ScanEnd`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StateRequest {
    /// Read `keys` of `operator`'s key space: answered by `Values`, one per key, in order.
    Get {
        /// The operator whose key space is read.
        operator: OperatorId,
        /// The keys.
        keys: Vec<StateKey>,
    },
    /// Apply `writes` as one batch (last write of a key wins): answered by `Done`.
    Write {
        /// The operator whose key space is written.
        operator: OperatorId,
        /// The writes.
        writes: Vec<StateWrite>,
    },
    /// Stream every entry of `bucket` in key order: `Chunk`s, then `ScanEnd`.
    Scan {
        /// The operator.
        operator: OperatorId,
        /// The bucket.
        bucket: BucketId,
    },
    /// Up to `limit` keys of `bucket` after `after` (`StateBackend::bucket_keys_after`): `Keys`.
    KeysAfter {
        /// The operator.
        operator: OperatorId,
        /// The bucket.
        bucket: BucketId,
        /// Resume after this key (`None` = from the bucket's start).
        after: Option<StateKey>,
        /// At most this many keys.
        limit: u32,
    },
    /// Remove every entry of `buckets`: `Done`.
    DeleteBuckets {
        /// The operator.
        operator: OperatorId,
        /// The buckets.
        buckets: Vec<BucketId>,
    },
    /// An estimate of the entries of `operator`'s key space: `Len`.
    Len {
        /// The operator.
        operator: OperatorId,
    },
    /// Make every acknowledged write durable (fsync): `Done`.
    Persist,
}

/// A state server's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StateResponse {
    /// Values of a `Get`, one per key (`None` = missing).
    Values(Vec<Option<Vec<u8>>>),
    /// A write, delete or persist was applied.
    Done,
    /// Entries of a scan, in key order.
    Chunk(Vec<(StateKey, Vec<u8>)>),
    /// The scan is complete.
    ScanEnd,
    /// Keys of a `KeysAfter`.
    Keys(Vec<StateKey>),
    /// The estimate of a `Len`.
    Len(u64),
    /// The request failed at the server; the message says why.
    Failed(String),
}

/// Called with the bytes of every frame sent to or received from a server (the worker's
/// emulated link, `[runtime] link_mb_per_sec`); it may sleep until the bytes "arrived".
pub type LinkHook = Arc<dyn Fn(usize) + Send + Sync>;

/// The state of every task of a worker on shared state servers (see the module docs).
pub struct RemoteEnv {
    servers: Arc<Servers>,
    /// Env-wide requests (persist).
    pool: Pool,
    tasks: Mutex<HashMap<TaskId, Arc<AtomicBool>>>,
}

impl RemoteEnv {
    /// An env on the servers at `addrs` (bucket `b` on `addrs[b % addrs.len()]`), each
    /// connection presenting the job token `token` (a server off loopback requires it).
    /// Connections open on first use. An empty list is refused at the first operation.
    pub fn new(addrs: Vec<String>, token: Option<Token>) -> Self {
        Self::build(addrs, token, None, None)
    }

    /// [`RemoteEnv::new`] over TLS (`tls`: each server's certificate is checked).
    pub fn with_tls(addrs: Vec<String>, token: Option<Token>, tls: Option<Tls>) -> Self {
        Self::build(addrs, token, tls, None)
    }

    /// [`RemoteEnv::with_tls`] whose traffic crosses `link` (called with each frame's bytes).
    pub fn with_link(addrs: Vec<String>, token: Option<Token>, tls: Option<Tls>, link: LinkHook) -> Self {
        Self::build(addrs, token, tls, Some(link))
    }

    fn build(addrs: Vec<String>, token: Option<Token>, tls: Option<Tls>, link: Option<LinkHook>) -> Self {
        let servers = Arc::new(Servers { addrs, token, tls, link });
        Self { pool: Pool::new(servers.clone()), servers, tasks: Mutex::default() }
    }

    /// The servers' addresses.
    pub fn addrs(&self) -> &[String] {
        &self.servers.addrs
    }

    fn tasks(
        &self,
        op: &'static str,
    ) -> Result<MutexGuard<'_, HashMap<TaskId, Arc<AtomicBool>>>, StateError> {
        self.tasks
            .lock()
            .map_err(|_| StateError::Poisoned { store: "remote state env task registry".to_owned(), op })
    }
}

impl std::fmt::Debug for RemoteEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteEnv").field("servers", &self.servers.addrs).finish_non_exhaustive()
    }
}

impl StateEnv for RemoteEnv {
    fn open_task(&self, task: TaskId) -> Result<Box<dyn StateBackend>, StateError> {
        if self.servers.addrs.is_empty() {
            return Err(StateError::Remote {
                server: "(none)".into(),
                op: "open_task",
                message: "the remote backend was given no state server addresses".into(),
            });
        }
        let dropped = self.tasks("open_task")?.entry(task).or_default().clone();
        Ok(Box::new(RemoteBackend { task, dropped, pool: Pool::new(self.servers.clone()) }))
    }

    /// Invalidates the task's handles; the state stays on the servers (it belongs to the
    /// operator, and its buckets' owners read it).
    fn drop_task(&self, task: TaskId) -> Result<(), StateError> {
        if let Some(dropped) = self.tasks("drop_task")?.remove(&task) {
            dropped.store(true, Ordering::Release);
        }
        Ok(())
    }

    fn persist(&self) -> Result<(), StateError> {
        let requests = (0..self.servers.addrs.len()).map(|s| (s, StateRequest::Persist)).collect();
        self.pool.round_trip("persist", requests).map(drop)
    }
}

/// A task's handle on its operator's key space on the state servers.
pub struct RemoteBackend {
    task: TaskId,
    dropped: Arc<AtomicBool>,
    pool: Pool,
}

impl std::fmt::Debug for RemoteBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteBackend").field("task", &self.task).finish_non_exhaustive()
    }
}

impl RemoteBackend {
    fn check(&self, op: &'static str) -> Result<(), StateError> {
        if self.dropped.load(Ordering::Acquire) {
            return Err(StateError::Dropped { task: self.task, op });
        }
        Ok(())
    }

    fn layout(&self, op: &'static str) -> impl Fn(LayoutError) -> StateError {
        let task = self.task;
        move |source| StateError::Layout { task, op, source }
    }

    fn unexpected(&self, op: &'static str, answer: &StateResponse) -> StateError {
        StateError::Remote {
            server: "?".into(),
            op,
            message: format!("unexpected answer {}", answer_kind(answer)),
        }
    }
}

fn answer_kind(answer: &StateResponse) -> &'static str {
    match answer {
        StateResponse::Values(_) => "Values",
        StateResponse::Done => "Done",
        StateResponse::Chunk(_) => "Chunk",
        StateResponse::ScanEnd => "ScanEnd",
        StateResponse::Keys(_) => "Keys",
        StateResponse::Len(_) => "Len",
        StateResponse::Failed(_) => "Failed",
    }
}

impl StateBackend for RemoteBackend {
    fn task(&self) -> TaskId {
        self.task
    }

    fn get_many(&self, keys: &[StateKey]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        const OP: &str = "get_many";
        self.check(OP)?;
        for key in keys {
            encode_state_key(key).map_err(self.layout(OP))?;
        }
        let servers = &self.pool.servers;
        // Per server: its keys and where their answers go.
        let mut per_server: Vec<(Vec<StateKey>, Vec<usize>)> = vec![Default::default(); servers.addrs.len()];
        for (i, key) in keys.iter().enumerate() {
            let (keys, at) = &mut per_server[servers.of(key.bucket)];
            keys.push(key.clone());
            at.push(i);
        }
        let operator = self.task.operator;
        let mut positions = Vec::new();
        let mut requests = Vec::new();
        for (server, (keys, at)) in per_server.into_iter().enumerate() {
            if !keys.is_empty() {
                positions.push(at);
                requests.push((server, StateRequest::Get { operator, keys }));
            }
        }
        let mut out = vec![None; keys.len()];
        for (answer, at) in self.pool.round_trip(OP, requests)?.into_iter().zip(positions) {
            let StateResponse::Values(values) = answer else { return Err(self.unexpected(OP, &answer)) };
            if values.len() != at.len() {
                return Err(self.unexpected(OP, &StateResponse::Values(values)));
            }
            for (value, i) in values.into_iter().zip(at) {
                out[i] = value;
            }
        }
        Ok(out)
    }

    fn write_many(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        const OP: &str = "write_many";
        self.check(OP)?;
        // Check everything first so a rejected entry sends nothing (atomic batch).
        for write in &writes {
            encode_state_key(write.key()).map_err(self.layout(OP))?;
            if let StateWrite::Put(_, value) = write {
                check_value(value).map_err(self.layout(OP))?;
            }
        }
        let servers = &self.pool.servers;
        let mut per_server: Vec<Vec<StateWrite>> = vec![Vec::new(); servers.addrs.len()];
        for write in writes {
            per_server[servers.of(write.key().bucket)].push(write);
        }
        let operator = self.task.operator;
        let requests: Vec<(usize, StateRequest)> = per_server
            .into_iter()
            .enumerate()
            .filter(|(_, w)| !w.is_empty())
            .map(|(server, writes)| (server, StateRequest::Write { operator, writes }))
            .collect();
        for answer in self.pool.round_trip(OP, requests)? {
            if answer != StateResponse::Done {
                return Err(self.unexpected(OP, &answer));
            }
        }
        Ok(())
    }

    fn scan_buckets(
        &self,
        buckets: &[BucketId],
        chunk_bytes: usize,
        sink: ScanSink<'_>,
    ) -> Result<u64, StateError> {
        const OP: &str = "scan_buckets";
        self.check(OP)?;
        let servers = &self.pool.servers;
        let mut chunker = Chunker::new(chunk_bytes, sink);
        for bucket in sorted_buckets(buckets) {
            let server = servers.of(bucket);
            // A connection of its own: the sink may use this store meanwhile.
            let mut conn = Conn::open(&servers.addrs[server], servers.token.as_ref(), servers.tls.as_ref())
                .map_err(|e| servers.error(server, OP, e))?;
            let request = StateRequest::Scan { operator: self.task.operator, bucket };
            servers.pace(conn.send(&request).map_err(|e| servers.error(server, OP, e))?);
            loop {
                let (answer, bytes) = conn.receive().map_err(|e| servers.error(server, OP, e))?;
                servers.pace(bytes);
                match answer {
                    StateResponse::Chunk(entries) => {
                        for (key, value) in entries {
                            chunker.push(key, value)?;
                        }
                    }
                    StateResponse::ScanEnd => break,
                    StateResponse::Failed(message) => return Err(servers.error(server, OP, message)),
                    other => return Err(self.unexpected(OP, &other)),
                }
            }
        }
        chunker.finish()
    }

    fn bucket_keys_after(
        &self,
        bucket: BucketId,
        after: Option<&StateKey>,
        limit: usize,
    ) -> Result<Vec<StateKey>, StateError> {
        const OP: &str = "bucket_keys_after";
        self.check(OP)?;
        if let Some(after) = after {
            encode_state_key(after).map_err(self.layout(OP))?;
        }
        if limit == 0 {
            return Ok(Vec::new());
        }
        let request = StateRequest::KeysAfter {
            operator: self.task.operator,
            bucket,
            after: after.cloned(),
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
        };
        match self.pool.one(OP, self.pool.servers.of(bucket), request)? {
            StateResponse::Keys(keys) => Ok(keys),
            other => Err(self.unexpected(OP, &other)),
        }
    }

    fn delete_buckets(&self, buckets: &[BucketId]) -> Result<(), StateError> {
        const OP: &str = "delete_buckets";
        self.check(OP)?;
        let servers = &self.pool.servers;
        let mut per_server: Vec<Vec<BucketId>> = vec![Vec::new(); servers.addrs.len()];
        for bucket in sorted_buckets(buckets) {
            per_server[servers.of(bucket)].push(bucket);
        }
        let operator = self.task.operator;
        let requests = per_server
            .into_iter()
            .enumerate()
            .filter(|(_, b)| !b.is_empty())
            .map(|(server, buckets)| (server, StateRequest::DeleteBuckets { operator, buckets }))
            .collect();
        for answer in self.pool.round_trip(OP, requests)? {
            if answer != StateResponse::Done {
                return Err(self.unexpected(OP, &answer));
            }
        }
        Ok(())
    }

    /// The operator's entries over all servers (every task of the operator reports the same
    /// number: the key space is shared).
    fn approximate_len(&self) -> Result<u64, StateError> {
        const OP: &str = "approximate_len";
        self.check(OP)?;
        let operator = self.task.operator;
        let requests =
            (0..self.pool.servers.addrs.len()).map(|s| (s, StateRequest::Len { operator })).collect();
        let mut total = 0;
        for answer in self.pool.round_trip(OP, requests)? {
            let StateResponse::Len(n) = answer else { return Err(self.unexpected(OP, &answer)) };
            total += n;
        }
        Ok(total)
    }

    fn is_shared(&self) -> bool {
        true
    }

    /// Nothing is buffered here (every write is a round trip that the server acknowledged), so
    /// there is nothing to write back.
    fn release_buckets(&self, _buckets: &[BucketId]) -> Result<u64, StateError> {
        self.check("release_buckets")?;
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(bucket: BucketId, user: &str) -> StateKey {
        StateKey::new(bucket, 0, user.as_bytes().to_vec())
    }

    /// Buckets spread over three servers: a batch touching all of them is one request each, and
    /// every value comes back in the caller's order.
    #[test]
    fn keys_are_partitioned_by_bucket_over_the_servers() -> Result<(), Box<dyn std::error::Error>> {
        let dirs = [tempfile::tempdir()?, tempfile::tempdir()?, tempfile::tempdir()?];
        let servers: Vec<StateServer> = dirs
            .iter()
            .map(|d| StateServer::start("127.0.0.1:0", d.path(), None, None))
            .collect::<Result<_, _>>()?;
        let frames = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = frames.clone();
        let env = RemoteEnv::with_link(
            servers.iter().map(|s| s.addr().to_string()).collect(),
            None,
            None,
            Arc::new(move |_| {
                counted.fetch_add(1, Ordering::Relaxed);
            }),
        );
        let task = TaskId::new(OperatorId(3), 0);
        let store = env.open_task(task)?;
        let keys: Vec<StateKey> = (0..9).map(|b| key(b, "k")).collect();
        store.write_many(keys.iter().map(|k| StateWrite::Put(k.clone(), vec![k.bucket as u8])).collect())?;
        let values = store.get_many(&keys.iter().rev().cloned().collect::<Vec<_>>())?;
        assert_eq!(values, (0..9u8).rev().map(|b| Some(vec![b])).collect::<Vec<_>>());
        assert_eq!(frames.load(Ordering::Relaxed), 2, "one paced round trip per batch");
        // Each server holds exactly its buckets: b mod 3.
        for (i, server) in servers.iter().enumerate() {
            let alone = RemoteEnv::new(vec![server.addr().to_string()], None).open_task(task)?;
            let found = alone.get_many(&keys)?;
            let expected: Vec<Option<Vec<u8>>> =
                (0..9u8).map(|b| (usize::from(b) % 3 == i).then_some(vec![b])).collect();
            assert_eq!(found, expected, "server {i}");
        }
        Ok(())
    }

    #[test]
    fn an_unreachable_server_is_an_error_naming_it() -> Result<(), Box<dyn std::error::Error>> {
        // A port nobody listens on: bind one, learn it, close it.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string();
        let store = RemoteEnv::new(vec![addr.clone()], None).open_task(TaskId::new(OperatorId(1), 0))?;
        match store.get_many(&[key(1, "a")]) {
            Err(StateError::Remote { server, op, .. }) => assert_eq!((server, op), (addr, "get_many")),
            other => panic!("expected a remote error, got {other:?}"),
        }
        assert!(RemoteEnv::new(Vec::new(), None).open_task(TaskId::new(OperatorId(1), 0)).is_err());
        Ok(())
    }
}
