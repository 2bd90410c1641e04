//! The coordinator's HTTP server (docs/architecture.md §9, "Operating a running job"): a JSON
//! API, a Prometheus endpoint and a live dashboard, served while the job runs.
//!
//! | route | answer |
//! |---|---|
//! | `GET /` | the dashboard (one static page, no external resources) |
//! | `GET /api/job` | the run, the job graph, the deployment (tasks, workers, buckets) |
//! | `GET /api/metrics?seconds=N` | the last N seconds (default 60): the job, per operator, per task |
//! | `GET /api/reconfigurations` | every reconfiguration with state moved, pause, dip, recovery |
//! | `POST /api/rescale`, `/api/rebalance`, `/api/migrate` | a reconfiguration request |
//! | `GET /metrics` | Prometheus text exposition |
//!
//! Requests are served by `tiny_http` (synchronous, like the rest of the coordinator; no async
//! runtime), each on its own thread, at most [`MAX_IN_FLIGHT`] at once; bodies are limited to
//! [`MAX_BODY`] bytes. A reconfiguration request takes the path of `koala rescale`'s
//! ([`crate::control::request_reply`]): the event loop validates it against the deployment.
//! Errors are `{"error": "…"}` with a 4xx status (5xx only when the metrics store fails).
//!
//! When the server does not listen on loopback every route requires the job token (the
//! deployment, the metrics and the page are the job's business too): the header
//! `Authorization: Bearer <token>`, or for the dashboard page `/?token=<token>`; 401 without it
//! ([`auth`]). A wrong token is refused (403) wherever the server listens.

pub mod api;
pub mod auth;
pub mod live;
pub mod prometheus;
#[cfg(test)]
mod tests;
mod tls_front;

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use serde_json::{Value, json};
use tiny_http::{Header, Method, Request, Response, Server};

pub use crate::config::CoordinatorSection;
use crate::control::{Event, request_reply};
use crate::error::CoordinatorError;
use api::ApiError;
use auth::{ApiAuth, PAGE_ROUTES};
use koala_types::handshake::Token;
use koala_types::tls::Tls;
use live::Live;
use tls_front::TlsFront;

/// The dashboard page.
pub const DASHBOARD: &str = include_str!("dashboard.html");
/// Largest request body accepted, bytes.
pub const MAX_BODY: usize = 64 * 1024;
/// Requests served at once; more are answered 503 at once.
pub const MAX_IN_FLIGHT: usize = 32;

/// A running HTTP server; stops when dropped.
pub struct HttpServer {
    server: Arc<Server>,
    stopping: Arc<AtomicBool>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
    /// With TLS: the front on the public port (tiny_http then listens on loopback).
    front: Option<TlsFront>,
}

impl HttpServer {
    /// Serves `live` on `listener` until dropped (HTTPS with `tls`: `tls_front`); requests go to
    /// the job's event loop on `events`.
    pub fn start(
        listener: TcpListener,
        live: Arc<Live>,
        events: Sender<Event>,
        token: Option<Token>,
        tls: Option<Tls>,
    ) -> Result<Self, CoordinatorError> {
        let addr = listener
            .local_addr()
            .map_err(|source| CoordinatorError::Io { context: "reading the HTTP address".into(), source })?;
        let (listener, front) = match tls {
            None => (listener, None),
            Some(tls) => {
                let io = |context: &str| {
                    let context = format!("{context} for the HTTPS API on {addr}");
                    move |source| CoordinatorError::Io { context, source }
                };
                let inner =
                    TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).map_err(io("binding loopback"))?;
                let inner_addr = inner.local_addr().map_err(io("reading the loopback address"))?;
                (inner, Some(TlsFront::start(listener, inner_addr, tls).map_err(io("starting TLS"))?))
            }
        };
        let auth = ApiAuth::new(koala_types::handshake::is_loopback(addr.ip()), token).map_err(|e| {
            CoordinatorError::Io {
                context: format!("serving the HTTP API on {addr}"),
                source: std::io::Error::other(e),
            }
        })?;
        let auth = Arc::new(auth);
        let server = Server::from_listener(listener, None).map_err(|e| CoordinatorError::Io {
            context: format!("starting the HTTP server on {addr}"),
            source: std::io::Error::other(e.to_string()),
        })?;
        let server = Arc::new(server);
        let stopping = Arc::new(AtomicBool::new(false));
        let (accept, stop) = (server.clone(), stopping.clone());
        let thread = std::thread::Builder::new()
            .name("koala-http".into())
            .spawn(move || serve(&accept, &stop, &live, &events, &auth))
            .map_err(|source| CoordinatorError::Io { context: "spawning the HTTP thread".into(), source })?;
        Ok(Self { server, stopping, addr, thread: Some(thread), front })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        // The public port closes first.
        drop(self.front.take());
        self.stopping.store(true, Ordering::SeqCst);
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    server: &Server,
    stopping: &AtomicBool,
    live: &Arc<Live>,
    events: &Sender<Event>,
    auth: &Arc<ApiAuth>,
) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    loop {
        let request = match server.recv() {
            Ok(request) => request,
            Err(_) if stopping.load(Ordering::SeqCst) => return,
            Err(e) => {
                tracing::debug!(error = %e, "the HTTP server could not take a connection");
                continue;
            }
        };
        if in_flight.fetch_add(1, Ordering::SeqCst) >= MAX_IN_FLIGHT {
            in_flight.fetch_sub(1, Ordering::SeqCst);
            let busy = ApiError {
                status: 503,
                message: format!("{MAX_IN_FLIGHT} requests are being served; retry"),
            };
            let _ = request.respond(error_response(&busy));
            continue;
        }
        let (live, events, count, auth) = (live.clone(), events.clone(), in_flight.clone(), auth.clone());
        let spawned = std::thread::Builder::new().name("koala-http-request".into()).spawn(move || {
            handle(request, &live, &events, &auth);
            count.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            in_flight.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!("could not spawn a thread for an HTTP request; it was dropped");
        }
    }
}

fn header(name: &str, value: &str) -> Option<Header> {
    Header::from_bytes(name.as_bytes(), value.as_bytes()).ok()
}

fn respond_text(status: u16, content_type: &str, body: String) -> Response<std::io::Cursor<Vec<u8>>> {
    let mut response = Response::from_string(body).with_status_code(status);
    for h in [header("Content-Type", content_type), header("Cache-Control", "no-store")].into_iter().flatten()
    {
        response.add_header(h);
    }
    response
}

fn json_response(status: u16, value: &Value) -> Response<std::io::Cursor<Vec<u8>>> {
    respond_text(status, "application/json", value.to_string())
}

fn error_response(e: &ApiError) -> Response<std::io::Cursor<Vec<u8>>> {
    let mut response = json_response(e.status, &json!({ "error": e.message }));
    if e.status == 401
        && let Some(h) = header("WWW-Authenticate", "Bearer")
    {
        response.add_header(h);
    }
    response
}

/// The dashboard page's answer without the job token: what to open instead, in plain text.
fn page_refusal(e: &ApiError) -> Response<std::io::Cursor<Vec<u8>>> {
    respond_text(e.status, "text/plain; charset=utf-8", format!("{}\n", e.message))
}

/// The routes, for 404 answers.
const ROUTES: &str = "GET /, GET /api/job, GET /api/metrics?seconds=N, GET /api/reconfigurations, GET /metrics, \
                      POST /api/rescale, POST /api/rebalance, POST /api/migrate";

/// Reads the body, at most [`MAX_BODY`] bytes.
fn body(request: &mut Request) -> Result<Vec<u8>, ApiError> {
    let too_big = || ApiError { status: 413, message: format!("body: larger than {MAX_BODY} bytes") };
    if request.body_length().is_some_and(|n| n > MAX_BODY) {
        return Err(too_big());
    }
    let mut out = Vec::new();
    request
        .as_reader()
        .take(MAX_BODY as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| ApiError::bad(format!("body: could not be read: {e}")))?;
    if out.len() > MAX_BODY {
        return Err(too_big());
    }
    Ok(out)
}

fn handle(mut request: Request, live: &Live, events: &Sender<Event>, auth: &ApiAuth) {
    let url = request.url().to_string();
    let (path, query) = url.split_once('?').unwrap_or((url.as_str(), ""));
    let method = request.method().clone();
    let response = match auth.check(&request, path, query) {
        Ok(()) => route(&mut request, &method, path, query, live, events),
        Err(e) => {
            // The path only: a query may hold a token.
            tracing::warn!(
                remote = ?request.remote_addr(), method = %method, path, reason = %e.message,
                "HTTP API: refused a request"
            );
            // A browser opening the page gets words, not JSON.
            if PAGE_ROUTES.contains(&path) { Ok(page_refusal(&e)) } else { Err(e) }
        }
    };
    let response = response.unwrap_or_else(|e| error_response(&e));
    if let Err(e) = request.respond(response) {
        tracing::debug!(error = %e, "an HTTP client left before its answer");
    }
}

fn route(
    request: &mut Request,
    method: &Method,
    path: &str,
    query: &str,
    live: &Live,
    events: &Sender<Event>,
) -> Result<Response<std::io::Cursor<Vec<u8>>>, ApiError> {
    let get = matches!(method, Method::Get);
    let wrong_method = |allowed: &str| ApiError {
        status: 405,
        message: format!("{path} takes {allowed}, not {}", method.as_str()),
    };
    match path {
        "/" | "/index.html" if get => {
            let mut page = respond_text(200, "text/html; charset=utf-8", DASHBOARD.to_string());
            // Its address may hold the token (`?token=`): never send it on as a referrer.
            if let Some(h) = header("Referrer-Policy", "no-referrer") {
                page.add_header(h);
            }
            Ok(page)
        }
        "/api/job" if get => Ok(json_response(200, &api::job(live, &live.snapshot()))),
        "/api/metrics" if get => {
            let seconds = api::seconds_param(query)?;
            Ok(json_response(200, &api::metrics(live, &live.snapshot(), seconds)?))
        }
        "/api/reconfigurations" if get => {
            Ok(json_response(200, &api::reconfigurations(live, &live.snapshot())?))
        }
        "/metrics" if get => Ok(respond_text(
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            prometheus::render(&live.info, &live.snapshot()),
        )),
        "/api/rescale" | "/api/rebalance" | "/api/migrate" if matches!(method, Method::Post) => {
            let body = body(request)?;
            let req = api::parse_request(&path["/api/".len()..], &body)?;
            let (status, value) = api::reply(&request_reply(events, req))?;
            Ok(json_response(status, &value))
        }
        "/api/rescale" | "/api/rebalance" | "/api/migrate" => Err(wrong_method("POST")),
        "/" | "/index.html" | "/api/job" | "/api/metrics" | "/api/reconfigurations" | "/metrics" => {
            Err(wrong_method("GET"))
        }
        other => Err(ApiError { status: 404, message: format!("no route {other}; the API has {ROUTES}") }),
    }
}
