//! Length-delimited frames of the binary codec over any byte stream: a little-endian `u32` length,
//! then the encoded message. Used by the control plane and the data plane alike.

use std::io::{self, Read, Write};

use serde::{Serialize, de::DeserializeOwned};

/// Frames larger than this are rejected as malformed rather than allocated.
pub const MAX_FRAME_BYTES: usize = 256 * 1024 * 1024;

/// Scratch buffers kept by a thread between frames up to this size (larger ones, e.g. a 256 KiB
/// state chunk, are freed after use).
const KEEP_SCRATCH_BYTES: usize = 1 << 20;

thread_local! {
    /// The encode buffer of this thread's frames: a frame is encoded straight behind room for its
    /// length, then written with one call, without a new allocation per frame.
    static ENCODE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The read buffer of this thread's frames.
    static DECODE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Writes one frame. The caller decides when to flush a buffered writer.
pub fn write_frame<W: Write, T: Serialize + ?Sized>(w: &mut W, msg: &T) -> io::Result<usize> {
    ENCODE.with_borrow_mut(|scratch| {
        let mut buf = std::mem::take(scratch);
        buf.clear();
        buf.extend_from_slice(&[0; 4]);
        let mut buf =
            postcard::to_extend(msg, buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let len = u32::try_from(buf.len() - 4)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "frame exceeds 4 GiB"))?;
        buf[..4].copy_from_slice(&len.to_le_bytes());
        let written = w.write_all(&buf).map(|()| buf.len());
        if buf.capacity() <= KEEP_SCRATCH_BYTES {
            *scratch = buf;
        }
        written
    })
}

/// Reads one frame. `Ok(None)` on a clean end of stream at a frame boundary; `InvalidData` for a
/// frame that does not decode or is larger than [`MAX_FRAME_BYTES`].
pub fn read_frame<R: Read, T: DeserializeOwned>(r: &mut R) -> io::Result<Option<T>> {
    Ok(read_frame_sized(r)?.map(|(message, _)| message))
}

/// [`read_frame`], also returning the frame's size on the wire (length prefix included), for
/// whoever accounts for bytes (the runtime's emulated link).
pub fn read_frame_sized<R: Read, T: DeserializeOwned>(r: &mut R) -> io::Result<Option<(T, usize)>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte limit"),
        ));
    }
    DECODE.with_borrow_mut(|scratch| {
        let mut buf = std::mem::take(scratch);
        buf.clear();
        buf.resize(len, 0);
        let read = r.read_exact(&mut buf).and_then(|()| {
            postcard::from_bytes(&buf)
                .map(|message| Some((message, len + 4)))
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("undecodable frame: {e}")))
        });
        if buf.capacity() <= KEEP_SCRATCH_BYTES {
            *scratch = buf;
        }
        read
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChannelMessage, Record};

    #[test]
    fn round_trip_and_clean_eof() {
        let msg = ChannelMessage::Batch(vec![Record {
            key: vec![1],
            value: vec![2, 3],
            time: 9,
            due_ms: 1_700_000_000_123,
        }]);
        let mut buf = Vec::new();
        write_frame(&mut buf, &msg).expect("write");
        write_frame(&mut buf, &ChannelMessage::EndOfStream).expect("write");
        let mut r = buf.as_slice();
        assert_eq!(read_frame::<_, ChannelMessage>(&mut r).expect("read"), Some(msg));
        assert_eq!(read_frame::<_, ChannelMessage>(&mut r).expect("read"), Some(ChannelMessage::EndOfStream));
        assert_eq!(read_frame::<_, ChannelMessage>(&mut r).expect("read"), None);
        let mut sized = Vec::new();
        let written = write_frame(&mut sized, &ChannelMessage::EndOfStream).expect("write");
        let read = read_frame_sized::<_, ChannelMessage>(&mut sized.as_slice()).expect("read");
        assert_eq!(read, Some((ChannelMessage::EndOfStream, written)));
    }

    #[test]
    fn garbage_is_invalid_data_not_a_panic() {
        let mut buf = 3u32.to_le_bytes().to_vec();
        buf.extend_from_slice(&[0xff, 0xff, 0xff]);
        let err = read_frame::<_, ChannelMessage>(&mut buf.as_slice()).expect_err("garbage");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let huge = u32::MAX.to_le_bytes();
        let err = read_frame::<_, ChannelMessage>(&mut huge.as_slice()).expect_err("huge");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
