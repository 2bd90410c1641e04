//! `[coordinator]` of a job config: the HTTP port, the job token and the control port's limits
//! on connections that have not greeted yet.

/// `[coordinator]` of a job config.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorSection {
    /// The port of the HTTP API, dashboard and `/metrics`, on the coordinator's host (default 0:
    /// any free port; `koala run` and `koala demo` print the URL; `--http-port` overrides it).
    #[serde(default)]
    pub http_port: Option<u16>,
    /// A file holding the job token (docs/deploy.md): required by the control port, the
    /// workers' data ports, the state servers and every HTTP route when they do not listen on
    /// loopback. The
    /// environment variable `KOALA_TOKEN` takes precedence; `koala run` generates one otherwise.
    #[serde(default)]
    pub token_file: Option<std::path::PathBuf>,
    /// Milliseconds a new control connection may take to send its greeting (default 5000).
    #[serde(default)]
    pub handshake_idle_ms: Option<u64>,
    /// Control connections waiting for their greeting at once; more are refused (default 64).
    #[serde(default)]
    pub max_pending_connections: Option<usize>,
}

impl CoordinatorSection {
    /// The bounds on the control port's unadmitted connections.
    pub fn gate_limits(&self) -> koala_types::handshake::GateLimits {
        let default = koala_types::handshake::GateLimits::default();
        koala_types::handshake::GateLimits {
            idle: self.handshake_idle_ms.map_or(default.idle, std::time::Duration::from_millis),
            max_pending: self.max_pending_connections.unwrap_or(default.max_pending),
        }
    }
}
