//! `[state]` of a job config: the backend of keyed state, its cache and its state servers.

use serde::{Deserialize, Serialize};

use super::{ConfigError, invalid};

/// `[state]`: the store of keyed state (docs/architecture.md §5).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StateSection {
    /// `fjall` (the default), `memory`, `none` (keeps nothing: the benchmark ceiling), or
    /// `remote` (state servers shared by every task of an operator; needs `protocol = "remote"`).
    pub backend: koala_protocol::StateBackendKind,
    /// MiB of the write-back cache of each task in front of fjall or of the state servers;
    /// 0 = no cache. Unset = the task's share of its worker's memory budget (`[runtime]
    /// worker_memory_mb`) after its queues and store. The memory and none backends have none.
    pub cache_mb: Option<u64>,
    /// `remote`: how many state servers `koala run` starts (default 1); bucket `b` lives on
    /// server `b mod servers`.
    pub servers: Option<u32>,
    /// `remote`: addresses (`host:port`) of state servers started elsewhere (`koala
    /// state-server`), instead of `servers`; `koala coordinator` needs them. `koala run` fills
    /// this in with the servers it started.
    pub server_addresses: Vec<String>,
}

/// The smallest `[runtime] worker_memory_mb`: room for fjall's block cache and a few small tasks.
pub const MIN_WORKER_MEMORY_MB: u64 = 64;
/// The largest `[runtime] worker_memory_mb` (1 TiB; a typo guard).
pub const MAX_WORKER_MEMORY_MB: u64 = 1 << 20;

impl StateSection {
    /// What workers are told (with [`CoordinatorMessage::Deploy`](koala_protocol::CoordinatorMessage)),
    /// but for the worker budget ([`JobConfig::state_options`] adds it).
    pub fn options(&self) -> koala_protocol::StateOptions {
        let has_cache = self.has_cache();
        koala_protocol::StateOptions {
            backend: self.backend,
            cache_bytes: if has_cache { self.cache_mb.unwrap_or(0).saturating_mul(1 << 20) } else { 0 },
            cache_from_budget: has_cache && self.cache_mb.is_none(),
            worker_memory_bytes: None,
            servers: self.server_addresses.clone(),
        }
    }

    /// Whether the backend has a state cache (fjall's write-back cache, Remote's client cache).
    pub fn has_cache(&self) -> bool {
        matches!(
            self.backend,
            koala_protocol::StateBackendKind::Fjall | koala_protocol::StateBackendKind::Remote
        )
    }

    /// How many state servers `koala run` starts: 0 unless the backend is remote and no
    /// external addresses are given.
    pub fn servers_to_start(&self) -> u32 {
        match self.backend {
            koala_protocol::StateBackendKind::Remote if self.server_addresses.is_empty() => {
                self.servers.unwrap_or(1)
            }
            _ => 0,
        }
    }

    /// Checks the section against the protocol (docs/protocols.md §7.1: `protocol = "remote"`
    /// and `[state] backend = "remote"` go together).
    pub(super) fn validate(&self, protocol: koala_protocol::Protocol) -> Result<(), ConfigError> {
        use koala_protocol::{Protocol, StateBackendKind as B};
        let remote = self.backend == B::Remote;
        match (protocol, remote) {
            (Protocol::Remote, false) => {
                return Err(invalid(
                    "protocol",
                    format!(
                        "\"remote\" keeps state on state servers, but state.backend is {:?}; set [state] backend = \"remote\" too",
                        self.backend.name()
                    ),
                ));
            }
            (Protocol::Koala | Protocol::StopAndRestart, true) => {
                return Err(invalid(
                    "state.backend",
                    format!(
                        "\"remote\" state is shared by every task, so ownership moves and state must not; protocol {:?} {}; set protocol = \"remote\" (the Remote baseline) or use backend = \"fjall\"",
                        protocol.name(),
                        if protocol == Protocol::Koala {
                            "fetches and moves state between tasks' own stores"
                        } else {
                            "moves state between tasks' own stores"
                        }
                    ),
                ));
            }
            _ => {}
        }
        if !matches!(self.backend, B::Fjall | B::Remote) && self.cache_mb.is_some() {
            return Err(invalid(
                "state.cache_mb",
                format!(
                    "only the fjall and remote backends have a cache, and backend is {:?}; remove cache_mb or set backend = \"fjall\"",
                    self.backend.name()
                ),
            ));
        }
        if !remote && (self.servers.is_some() || !self.server_addresses.is_empty()) {
            return Err(invalid(
                "state.servers",
                format!(
                    "state servers hold remote state, and backend is {:?}; remove servers/server_addresses or set backend = \"remote\"",
                    self.backend.name()
                ),
            ));
        }
        if self.servers == Some(0) {
            return Err(invalid("state.servers", "0 state servers cannot hold state; use 1 or more"));
        }
        if self.servers.is_some() && !self.server_addresses.is_empty() {
            return Err(invalid(
                "state.server_addresses",
                "give either servers (koala run starts them) or server_addresses (started elsewhere), not both",
            ));
        }
        if let Some(bad) = self.server_addresses.iter().find(|a| !a.contains(':')) {
            return Err(invalid(
                "state.server_addresses",
                format!(
                    "{bad:?} is not host:port (e.g. \"10.0.0.5:7000\", as `koala state-server` prints it)"
                ),
            ));
        }
        Ok(())
    }
}
