//! A consumer group's committed offsets (docs/architecture.md §11): what a Kafka source started
//! with `start = "committed"` reads from and commits to as it goes.
//!
//! rskafka 0.6 has no consumer-group API, so the three requests are encoded here as the Kafka
//! protocol defines them, at versions without tagged fields: FindCoordinator v0 (which broker
//! keeps the group), OffsetFetch v1 and OffsetCommit v2. The commits are "simple" commits
//! (generation −1, no member id): the job's own assignment ([`crate::assigned_partitions`])
//! decides which task reads which partition, never a group rebalance, so the group has no
//! members and the broker (tansu's group coordinator as Kafka's) accepts them as they come.

use std::collections::BTreeMap;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::ConnectorError;

const FIND_COORDINATOR: (i16, i16) = (10, 0);
const OFFSET_FETCH: (i16, i16) = (9, 1);
const OFFSET_COMMIT: (i16, i16) = (8, 2);
/// A response larger than this is not one of ours (guards the length prefix).
const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// A connection to the coordinator of one consumer group.
pub struct GroupOffsets {
    stream: TcpStream,
    group: String,
    correlation: i32,
}

impl GroupOffsets {
    /// Finds `group`'s coordinator through the first answering broker of `brokers` and connects
    /// to it.
    pub async fn connect(brokers: &[String], group: &str) -> Result<Self, ConnectorError> {
        let mut last = None;
        for broker in brokers {
            match Self::find_coordinator(broker, group).await {
                Ok(addr) => {
                    let stream = TcpStream::connect(&addr).await.map_err(|e| {
                        ConnectorError::io(format!("connecting to group coordinator {addr}"), e)
                    })?;
                    return Ok(Self { stream, group: group.to_string(), correlation: 1 });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| ConnectorError::Config("kafka: no brokers given".into())))
    }

    async fn find_coordinator(broker: &str, group: &str) -> Result<String, ConnectorError> {
        let stream = TcpStream::connect(broker)
            .await
            .map_err(|e| ConnectorError::io(format!("connecting to {broker}"), e))?;
        let mut conn = Self { stream, group: group.to_string(), correlation: 0 };
        let mut body = Writer::default();
        body.string(group);
        let mut r = conn.call(FIND_COORDINATOR, body, "finding the group coordinator").await?;
        let error = r.i16()?;
        let (_node, host, port) = (r.i32()?, r.string()?, r.i32()?);
        if error != 0 {
            return Err(protocol(format!("FindCoordinator for group {group:?} answered error code {error}")));
        }
        Ok(format!("{host}:{port}"))
    }

    /// The group's committed offsets (the next offset to read) of `partitions` of `topic`; a
    /// partition the group never committed is absent.
    pub async fn fetch(
        &mut self,
        topic: &str,
        partitions: &[i32],
    ) -> Result<BTreeMap<i32, i64>, ConnectorError> {
        let mut body = Writer::default();
        body.string(&self.group);
        body.i32(1);
        body.string(topic);
        body.len(partitions.len());
        partitions.iter().for_each(|&p| body.i32(p));
        let what = format!("fetching group {:?}'s offsets of {topic}", self.group);
        let mut r = self.call(OFFSET_FETCH, body, &what).await?;
        let mut offsets = BTreeMap::new();
        for _ in 0..r.len()? {
            let name = r.string()?;
            for _ in 0..r.len()? {
                let (partition, offset, _metadata, error) =
                    (r.i32()?, r.i64()?, r.nullable_string()?, r.i16()?);
                if error != 0 {
                    return Err(protocol(format!(
                        "{what}: partition {partition} answered error code {error}"
                    )));
                }
                if name == topic && offset >= 0 {
                    offsets.insert(partition, offset);
                }
            }
        }
        Ok(offsets)
    }

    /// Commits `offsets` (partition, next offset to read) of `topic` for the group.
    pub async fn commit(&mut self, topic: &str, offsets: &[(i32, i64)]) -> Result<(), ConnectorError> {
        let mut body = Writer::default();
        body.string(&self.group);
        body.i32(-1); // generation: a simple commit, outside any group membership
        body.string(""); // member id
        body.i64(-1); // retention: the broker's default
        body.i32(1);
        body.string(topic);
        body.len(offsets.len());
        for &(partition, offset) in offsets {
            body.i32(partition);
            body.i64(offset);
            body.nullable_string(None);
        }
        let what = format!("committing group {:?}'s offsets of {topic}", self.group);
        let mut r = self.call(OFFSET_COMMIT, body, &what).await?;
        for _ in 0..r.len()? {
            let _name = r.string()?;
            for _ in 0..r.len()? {
                let (partition, error) = (r.i32()?, r.i16()?);
                if error != 0 {
                    return Err(protocol(format!(
                        "{what}: partition {partition} answered error code {error}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Sends one request (header v1: key, version, correlation id, client id) and reads its
    /// response (header v0: the correlation id), returning the response body.
    async fn call(
        &mut self,
        (key, version): (i16, i16),
        body: Writer,
        what: &str,
    ) -> Result<Reader, ConnectorError> {
        self.correlation = self.correlation.wrapping_add(1);
        let mut request = Writer::default();
        request.i16(key);
        request.i16(version);
        request.i32(self.correlation);
        request.string("koala");
        request.0.extend_from_slice(&body.0);
        let size =
            i32::try_from(request.0.len()).map_err(|_| protocol(format!("{what}: request too large")))?;
        let io = |e| ConnectorError::io(what.to_string(), e);
        self.stream.write_all(&size.to_be_bytes()).await.map_err(io)?;
        self.stream.write_all(&request.0).await.map_err(io)?;
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).await.map_err(io)?;
        let size = usize::try_from(i32::from_be_bytes(size)).unwrap_or(usize::MAX);
        if size > MAX_RESPONSE_BYTES {
            return Err(protocol(format!("{what}: a response of {size} bytes")));
        }
        let mut bytes = vec![0u8; size];
        self.stream.read_exact(&mut bytes).await.map_err(io)?;
        let mut r = Reader { bytes, at: 0 };
        let correlation = r.i32()?;
        if correlation != self.correlation {
            return Err(protocol(format!(
                "{what}: answer to request {correlation}, sent {}",
                self.correlation
            )));
        }
        Ok(r)
    }
}

fn protocol(message: String) -> ConnectorError {
    ConnectorError::Config(format!("kafka: {message}"))
}

/// A request being encoded (big-endian, Kafka's non-flexible encodings).
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn i16(&mut self, v: i16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn len(&mut self, n: usize) {
        self.i32(i32::try_from(n).unwrap_or(i32::MAX));
    }
    fn string(&mut self, s: &str) {
        self.i16(i16::try_from(s.len()).unwrap_or(i16::MAX));
        self.0.extend_from_slice(s.as_bytes());
    }
    fn nullable_string(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.string(s),
            None => self.i16(-1),
        }
    }
}

/// A response being decoded; running past its end is an error, never a panic.
struct Reader {
    bytes: Vec<u8>,
    at: usize,
}

impl Reader {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], ConnectorError> {
        let slice =
            self.bytes.get(self.at..self.at + N).ok_or_else(|| protocol("a truncated response".into()))?;
        self.at += N;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }
    fn i16(&mut self) -> Result<i16, ConnectorError> {
        self.take().map(i16::from_be_bytes)
    }
    fn i32(&mut self) -> Result<i32, ConnectorError> {
        self.take().map(i32::from_be_bytes)
    }
    fn i64(&mut self) -> Result<i64, ConnectorError> {
        self.take().map(i64::from_be_bytes)
    }
    fn len(&mut self) -> Result<usize, ConnectorError> {
        Ok(usize::try_from(self.i32()?).unwrap_or(0))
    }
    fn nullable_string(&mut self) -> Result<Option<String>, ConnectorError> {
        let n = self.i16()?;
        let Ok(n) = usize::try_from(n) else {
            return Ok(None);
        };
        let bytes =
            self.bytes.get(self.at..self.at + n).ok_or_else(|| protocol("a truncated string".into()))?;
        self.at += n;
        Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
    }
    fn string(&mut self) -> Result<String, ConnectorError> {
        Ok(self.nullable_string()?.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_round_trip_and_a_truncated_response_is_an_error() {
        let mut w = Writer::default();
        w.string("group");
        w.nullable_string(None);
        w.i64(-1);
        let mut r = Reader { bytes: w.0, at: 0 };
        assert_eq!(r.string().ok(), Some("group".to_string()));
        assert_eq!(r.nullable_string().ok(), Some(None));
        assert_eq!(r.i64().ok(), Some(-1));
        assert!(r.i16().is_err(), "past the end");
        let mut short = Reader { bytes: vec![0, 9, b'a'], at: 0 };
        assert!(short.string().is_err(), "a string longer than the response");
    }
}
