//! What the fuzz targets run (docs/testing.md §9): each target in `fuzz_targets/` is one line
//! calling a function here, so the decoders a koala process runs on bytes from the network (and
//! on a job config or an HTTP body from a user) are driven the same way by libFuzzer and by the
//! seed corpus writer (`examples/write_corpus.rs`, from [`seeds`]).
//!
//! A decoder may refuse its input; what fails a run is a panic, an allocation beyond
//! libFuzzer's `-malloc_limit_mb`/`-rss_limit_mb`, or an input that takes longer than
//! `-timeout`. Messages that decode must also encode again, and their encoding must decode to
//! a message that encodes the same way (a field the binary codec cannot carry back fails here).

pub mod seeds;

use std::io::{self, Read};
use std::time::Duration;

use koala_types::frame::read_frame_sized;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Decodes `bytes` as a `T`; if it decodes, checks that it survives a round trip through the
/// codec. Panics (a finding) on a round trip that fails.
pub fn round_trip<T: Serialize + DeserializeOwned>(bytes: &[u8]) {
    let Ok(message) = koala_types::decode::<T>(bytes) else { return };
    let name = std::any::type_name::<T>();
    let encoded =
        koala_types::encode(&message).unwrap_or_else(|e| panic!("{name} decoded but does not encode: {e}"));
    let again: T =
        koala_types::decode(&encoded).unwrap_or_else(|e| panic!("{name} re-encoded does not decode: {e}"));
    let twice = koala_types::encode(&again).unwrap_or_else(|e| panic!("{name} does not encode twice: {e}"));
    assert_eq!(encoded, twice, "{name}: encode(decode(encode(m))) != encode(m)");
}

/// A reader that hands out at most `piece` bytes per read, as a socket may.
struct Pieces<'a> {
    bytes: &'a [u8],
    piece: usize,
}

impl Read for Pieces<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = out.len().min(self.bytes.len()).min(self.piece);
        out[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

/// Reads frames of `T` from `stream` until it ends or a frame is refused: a refusal must be
/// `InvalidData` (an oversize or undecodable frame) or `UnexpectedEof` (a frame cut short).
fn read_frames_of<T: DeserializeOwned>(stream: &[u8], piece: usize) {
    let mut reader = Pieces { bytes: stream, piece };
    loop {
        match read_frame_sized::<_, T>(&mut reader) {
            Ok(Some((_, size))) => assert!(size >= 4, "a frame of {size} bytes"),
            Ok(None) => return,
            Err(e) => {
                assert!(
                    matches!(e.kind(), io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof),
                    "{}: an error of kind {:?}: {e}",
                    std::any::type_name::<T>(),
                    e.kind()
                );
                return;
            }
        }
    }
}

/// The `frame` target: byte 0 picks the message type read, byte 1 how many bytes each read
/// returns (0: as many as asked), the rest is the stream of length-prefixed frames.
pub fn frames(data: &[u8]) {
    let [kind, piece, stream @ ..] = data else { return };
    let piece = if *piece == 0 { usize::MAX } else { usize::from(*piece) };
    use koala_protocol::{ClientReply, ControlHello, CoordinatorMessage, WorkerMessage};
    use koala_runtime::fuzzing::{ChannelHello, DrrsWire, KoalaWire};
    use koala_state::remote::{StateRequest, StateResponse};
    match kind % 10 {
        0 => read_frames_of::<ControlHello>(stream, piece),
        1 => read_frames_of::<ClientReply>(stream, piece),
        2 => read_frames_of::<CoordinatorMessage>(stream, piece),
        3 => read_frames_of::<WorkerMessage>(stream, piece),
        4 => read_frames_of::<ChannelHello>(stream, piece),
        5 => read_frames_of::<koala_types::ChannelMessage>(stream, piece),
        6 => read_frames_of::<KoalaWire>(stream, piece),
        7 => read_frames_of::<DrrsWire>(stream, piece),
        8 => read_frames_of::<StateRequest>(stream, piece),
        _ => read_frames_of::<StateResponse>(stream, piece),
    }
}

/// The `handshake` target: the bytes as a greeting a listener reads and as a verdict a
/// connecting peer reads, and as a token given by a user.
pub fn handshake(data: &[u8]) {
    use koala_types::handshake::{Refusal, Token, read_greeting, read_verdict};
    match read_greeting(&mut &data[..], Duration::from_secs(1)) {
        Ok((_, _, token)) => assert!(token.is_none_or(|t| !t.is_empty() && t.len() <= usize::from(u16::MAX))),
        Err(Refusal::Oversize(len)) => assert!(len > koala_types::handshake::MAX_GREETING_BYTES),
        Err(refusal) => drop(refusal.to_string()),
    }
    if let Err(e) = read_verdict(&mut &data[..]) {
        drop(e.to_string());
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(token) = Token::parse(text, "fuzz")
    {
        assert!(token.matches(text.trim().as_bytes()));
        assert!(!format!("{token:?}{token}").contains(token.expose()) || token.expose().len() < 8);
    }
}

/// The `control` target: every coordinator ↔ worker and client ↔ coordinator message.
pub fn control(data: &[u8]) {
    round_trip::<koala_protocol::ControlHello>(data);
    round_trip::<koala_protocol::ClientReply>(data);
    round_trip::<koala_protocol::CoordinatorMessage>(data);
    round_trip::<koala_protocol::WorkerMessage>(data);
}

/// The `data_channel` target: a data connection's first frame and its messages, the peer
/// lanes' messages of Koala (fetches, answers, filters) and DRRS (pushed state), and the
/// state bundles a fetch answer carries.
pub fn data_channel(data: &[u8]) {
    round_trip::<koala_runtime::fuzzing::ChannelHello>(data);
    round_trip::<koala_types::ChannelMessage>(data);
    round_trip::<koala_runtime::fuzzing::KoalaWire>(data);
    round_trip::<koala_runtime::fuzzing::DrrsWire>(data);
    round_trip::<Vec<(u8, Vec<u8>)>>(data);
}

/// The `state_server` target: a state server's requests and its answers.
pub fn state_server(data: &[u8]) {
    round_trip::<koala_state::remote::StateRequest>(data);
    round_trip::<koala_state::remote::StateResponse>(data);
}

/// The `config` target: a job config's text parsed, checked against its query's graph (a
/// workloads query built from its `[params]`, else the keyed aggregate's) and every error
/// placed at its line, as `koala run` does before anything starts.
pub fn config(data: &[u8]) {
    use koala_coordinator::config::{ConfigSource, JobConfig};
    let Ok(text) = std::str::from_utf8(data) else { return };
    let source = ConfigSource::new("fuzz.toml", text);
    let config = match JobConfig::parse(text, "fuzz.toml") {
        Ok(config) => config,
        Err(e) => return drop(e.to_string()),
    };
    let params: Option<koala_workloads::QueryParams> = toml::from_str(&config.params_text()).ok();
    let graph = params
        .and_then(|p| koala_workloads::build_query(&config.query, &p).ok())
        .or_else(|| koala_workloads::build_query("keyed-aggregate", &Default::default()).ok());
    let Some(graph) = graph else { return };
    match config.validate(&graph) {
        Ok(tasks) => assert_eq!(tasks.len(), graph.operators.len()),
        Err(e) => drop(source.place_error(e).to_string()),
    }
    for (i, r) in config.reconfigurations.iter().enumerate() {
        if let Err(e) = r.request(&format!("reconfigurations[{i}]")) {
            drop(source.place_error(e).to_string());
        }
    }
    drop(config.protocol_label());
    drop(config.state_options());
    let _ = source.locate("params.generator.key_space");
}

/// The `http_body` target: byte 0 picks the route (`POST /api/rescale`, `rebalance`, `migrate`
/// or an unknown one), the rest is the body; the text is also read as a query string and an
/// `Authorization` header by the routes' other parsers.
pub fn http_body(data: &[u8]) {
    use koala_coordinator::http::api::{MAX_SECONDS, parse_request, seconds_param};
    use koala_coordinator::http::auth::ApiAuth;
    let [route, body @ ..] = data else { return };
    let kind = ["rescale", "rebalance", "migrate", "unknown"][usize::from(route % 4)];
    match parse_request(kind, body) {
        Ok(koala_protocol::ReconfigRequest::Rebalance { moves, .. }) => {
            let listed: usize = moves.iter().map(|(b, _)| b.len()).sum();
            assert!(listed <= koala_coordinator::control::MAX_LISTED_BUCKETS, "{listed} buckets");
        }
        Ok(_) => {}
        Err(e) => assert!((400..500).contains(&e.status), "{e:?}"),
    }
    let Ok(text) = std::str::from_utf8(body) else { return };
    if let Ok(seconds) = seconds_param(text) {
        assert!((1..=MAX_SECONDS).contains(&seconds));
    }
    let token = koala_types::handshake::Token::parse("0123456789abcdef-fuzz", "fuzz").ok();
    let (header, query) = text.split_once('\n').unwrap_or((text, text));
    for loopback in [true, false] {
        if let Ok(auth) = ApiAuth::new(loopback, token.clone()) {
            for path in ["/", "/api/job"] {
                drop(auth.decide(Some(header), path, query));
                drop(auth.decide(None, path, query));
            }
        }
    }
}
