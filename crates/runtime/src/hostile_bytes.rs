//! Bytes from a peer that passed the gate but is broken or hostile, fed to every decoder of a
//! frame a koala process reads (docs/deploy.md §Security): the frame reader
//! (`koala_types::frame`), each control message, the data connections' messages, the
//! protocols' peer messages and the state server's requests and answers. Random bytes and
//! valid frames with bytes flipped, cut or inserted must be refused as `InvalidData` (or read
//! as some message), never panic; a length prefix above the cap is refused from the prefix
//! alone, before a body buffer is allocated or read. A bounded property test of the normal suite.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read};

use koala_protocol::{
    ClientReply, ControlHello, CoordinatorMessage, Deployment, Protocol, ReconfigRequest, RuntimeOptions,
    StateBackendKind, StateOptions, TaskAck, TaskSample, WorkerMessage,
};
use koala_state::remote::{StateRequest, StateResponse};
use koala_state::{StateKey, StateWrite};
use koala_types::frame::{MAX_FRAME_BYTES, read_frame, write_frame};
use koala_types::{ChannelMessage, InputChannel, OperatorId, Record, StateEntry, TaskId, WorkerId};
use proptest::prelude::*;
use serde::de::DeserializeOwned;

use crate::channel::ChannelHello;

/// Decodes `bytes` as one frame of `T`: whatever comes back, it must not panic, and anything
/// refused is `InvalidData` or a short read.
fn decode_as<T: DeserializeOwned>(bytes: &[u8]) -> Result<(), String> {
    match read_frame::<_, T>(&mut &bytes[..]) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.kind(), io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof) => Ok(()),
        Err(e) => Err(format!("{}: an error of kind {:?}: {e}", std::any::type_name::<T>(), e.kind())),
    }
}

/// `bytes` through every decoder a koala process runs on a frame from a peer.
fn every_decoder(bytes: &[u8]) -> Result<(), String> {
    decode_as::<ControlHello>(bytes)?;
    decode_as::<ClientReply>(bytes)?;
    decode_as::<CoordinatorMessage>(bytes)?;
    decode_as::<WorkerMessage>(bytes)?;
    decode_as::<ChannelHello>(bytes)?;
    decode_as::<ChannelMessage>(bytes)?;
    decode_as::<crate::task::KoalaWire>(bytes)?;
    decode_as::<crate::task::DrrsWire>(bytes)?;
    decode_as::<StateRequest>(bytes)?;
    decode_as::<StateResponse>(bytes)
}

/// `payload` behind a length prefix that matches it, so the decoders run on it.
fn framed(payload: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(payload.len()).unwrap_or(u32::MAX).to_le_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

fn task(operator: u32, index: u32) -> TaskId {
    TaskId::new(OperatorId(operator), index)
}

fn deployment() -> Deployment {
    Deployment {
        run: "run-1".into(),
        query: "keyed-aggregate".into(),
        query_params: "rate = 10".into(),
        workers: BTreeMap::from([(WorkerId(0), "10.0.0.1:7100".to_string())]),
        placement: BTreeMap::from([(task(0, 0), WorkerId(0)), (task(1, 0), WorkerId(0))]),
        tasks: BTreeMap::from([(OperatorId(0), vec![0]), (OperatorId(1), vec![0])]),
        epoch: 2,
        routing: BTreeMap::from([(OperatorId(1), vec![0; 8])]),
        num_buckets: 8,
        options: RuntimeOptions {
            batch_records: 64,
            linger_ms: 1,
            channel_capacity: 64,
            sink_dir: "out".into(),
            capacity: Default::default(),
            max_queued_records: 1000,
            checkpoint: Default::default(),
        },
        protocol: Protocol::Koala,
        extra_keys: 0,
        drain_keys_per_sec: 0,
        finished: BTreeSet::from([task(0, 0)]),
    }
}

/// Valid frames of every kind a peer sends, to mutate.
fn valid_frames() -> Vec<Vec<u8>> {
    let key = StateKey::new(3, 0, b"user-7".to_vec());
    let state = StateOptions {
        backend: StateBackendKind::Remote,
        cache_bytes: 1 << 20,
        servers: vec!["10.0.0.2:7200".into()],
        ..Default::default()
    };
    vec![
        frame(&ControlHello::Worker { data_addr: "10.0.0.1:7100".into(), pid: 42 }),
        frame(&ControlHello::Client(ReconfigRequest::Rebalance {
            operator: "aggregate".into(),
            moves: vec![(vec![0, 1, 2], 1)],
        })),
        frame(&ClientReply::Rejected { error: "no operator".into() }),
        frame(&CoordinatorMessage::Deploy(Box::new(deployment()), state)),
        frame(&CoordinatorMessage::UpstreamEnded {
            upstream: task(0, 0),
            tasks: vec![task(1, 0), task(1, 1)],
        }),
        frame(&WorkerMessage::Metrics(vec![TaskSample {
            time_s: 9,
            task: task(1, 0),
            metric: "records_in".into(),
            value: 1.5,
        }])),
        frame(&WorkerMessage::TaskAck {
            task: task(1, 0),
            epoch: 2,
            ack: TaskAck::StateSent { bytes: 10, entries: 2 },
        }),
        frame(&ChannelHello { to: task(1, 0), channel: InputChannel { input: 0, from: task(0, 0) } }),
        frame(&ChannelMessage::Batch(vec![Record {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            time: 5,
            due_ms: 6,
        }])),
        frame(&ChannelMessage::State {
            epoch: 2,
            entries: vec![StateEntry { bucket: 3, state: 0, key: b"k".to_vec(), value: b"v".to_vec() }],
        }),
        frame(&StateRequest::Write {
            operator: OperatorId(1),
            writes: vec![StateWrite::Put(key.clone(), b"3".to_vec())],
        }),
        frame(&StateRequest::KeysAfter {
            operator: OperatorId(1),
            bucket: 3,
            after: Some(key.clone()),
            limit: 10,
        }),
        frame(&StateRequest::Get { operator: OperatorId(1), keys: vec![key.clone(), key.clone()] }),
        frame(&StateRequest::Scan { operator: OperatorId(1), bucket: 3 }),
        frame(&StateRequest::DeleteBuckets { operator: OperatorId(1), buckets: vec![3, 4] }),
        frame(&StateRequest::Len { operator: OperatorId(1) }),
        frame(&StateRequest::Persist),
        frame(&StateResponse::Values(vec![Some(b"3".to_vec()), None])),
        frame(&StateResponse::Keys(vec![key.clone()])),
        frame(&StateResponse::Len(7)),
        frame(&StateResponse::Failed("no space left".into())),
        frame(&StateResponse::Chunk(vec![(key, b"3".to_vec())])),
    ]
}

/// `message` as one frame.
fn frame<T: serde::Serialize>(message: &T) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame(&mut out, message).unwrap_or_else(|e| panic!("encoding: {e}"));
    out
}

/// A reader that holds a 4-byte length prefix and fails the test if anything past it is read.
struct PrefixOnly {
    prefix: [u8; 4],
    at: usize,
}

impl Read for PrefixOnly {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        assert!(self.at < 4, "the body of an oversize frame was read");
        let n = buf.len().min(4 - self.at);
        buf[..n].copy_from_slice(&self.prefix[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic_a_decoder(mut bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        every_decoder(&framed(&bytes)).map_err(TestCaseError::fail)?;
        // As a frame whose prefix claims anything up to twice what follows (a claim up to the
        // cap grows the buffer only as bytes arrive: `frame`'s tests; the oversize test below
        // covers claims above the cap).
        if bytes.len() >= 4 {
            let claimed = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            let bound = u32::try_from(2 * bytes.len() + 1).unwrap_or(u32::MAX);
            bytes[..4].copy_from_slice(&(claimed % bound).to_le_bytes());
        }
        every_decoder(&bytes).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn mutated_valid_frames_never_panic_a_decoder(
        which in any::<prop::sample::Index>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        inserted in proptest::collection::vec(any::<u8>(), 0..16),
    ) {
        let frames = valid_frames();
        let frame = &frames[which.index(frames.len())];
        let mut payload = frame[4..].to_vec();
        for (at, byte) in &flips {
            let i = at.index(payload.len());
            payload[i] ^= byte | 1;
        }
        every_decoder(&framed(&payload)).map_err(TestCaseError::fail)?;
        // Cut short, behind a prefix that still claims the whole frame, and cut with bytes
        // inserted at the cut, behind a matching prefix.
        let at = cut.index(payload.len() + 1);
        let mut short = frame[..4].to_vec();
        short.extend_from_slice(&payload[..at]);
        every_decoder(&short).map_err(TestCaseError::fail)?;
        let mut grown = payload[..at].to_vec();
        grown.extend_from_slice(&inserted);
        grown.extend_from_slice(&payload[at..]);
        every_decoder(&framed(&grown)).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn a_length_prefix_above_the_cap_is_refused_from_the_prefix_alone(
        len in (MAX_FRAME_BYTES as u64 + 1)..=u64::from(u32::MAX),
    ) {
        let prefix = u32::try_from(len).map_err(|e| TestCaseError::fail(e.to_string()))?.to_le_bytes();
        let refused = |result: io::Result<()>| match result {
            Err(e) => e.kind() == io::ErrorKind::InvalidData && e.to_string().contains("exceeds"),
            Ok(()) => false,
        };
        let oversize = || PrefixOnly { prefix, at: 0 };
        prop_assert!(refused(read_frame::<_, ControlHello>(&mut oversize()).map(drop)), "ControlHello");
        prop_assert!(refused(read_frame::<_, ChannelMessage>(&mut oversize()).map(drop)), "ChannelMessage");
        prop_assert!(refused(read_frame::<_, StateRequest>(&mut oversize()).map(drop)), "StateRequest");
    }
}

/// Every valid frame still decodes as its own kind: the mutations above start from real
/// messages, not from bytes every decoder refuses anyway.
#[test]
fn the_valid_frames_decode() {
    let frames = valid_frames();
    assert!(read_frame::<_, ControlHello>(&mut &frames[0][..]).is_ok_and(|m| m.is_some()));
    assert!(read_frame::<_, CoordinatorMessage>(&mut &frames[3][..]).is_ok_and(|m| m.is_some()));
    for frame in &frames[10..] {
        let request = read_frame::<_, StateRequest>(&mut &frame[..]).is_ok_and(|m| m.is_some());
        assert!(request || read_frame::<_, StateResponse>(&mut &frame[..]).is_ok_and(|m| m.is_some()));
    }
    let mut again = Vec::new();
    let Some(Some(deploy)) = read_frame::<_, CoordinatorMessage>(&mut &frames[3][..]).ok() else {
        panic!("Deploy does not decode");
    };
    write_frame(&mut again, &deploy).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again, frames[3]);
}
