//! Length-delimited frames of the binary codec over any byte stream: a little-endian `u32` length,
//! then the encoded message. Used by the control plane and the data plane alike.

use std::io::{self, Read, Write};

use serde::{Serialize, de::DeserializeOwned};

/// Frames larger than this are rejected as malformed rather than allocated.
pub const MAX_FRAME_BYTES: usize = 256 * 1024 * 1024;

/// Scratch buffers kept by a thread between frames up to this size (larger ones, e.g. a 256 KiB
/// state chunk, are freed after use).
const KEEP_SCRATCH_BYTES: usize = 1 << 20;

/// The most a frame's body buffer grows by before any of the body has arrived: beyond it, the
/// buffer grows only as bytes do.
const FIRST_RESERVE_BYTES: usize = 64 * 1024;

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
        let read = read_body(r, len, &mut buf).and_then(|()| {
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

/// Reads a body of `len` bytes into `buf` (cleared first). A body that fits the buffer's
/// capacity is read in one `read_exact`, as every frame of a steady stream is once the thread's
/// buffer has grown; a longer one grows the buffer as its bytes arrive, from at most
/// [`FIRST_RESERVE_BYTES`], so a length prefix alone (a broken or hostile peer's claim of up to
/// [`MAX_FRAME_BYTES`]) reserves no more than that. A body cut short is `UnexpectedEof`.
fn read_body<R: Read>(r: &mut R, len: usize, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.clear();
    if len <= buf.capacity() {
        buf.resize(len, 0);
        return r.read_exact(buf);
    }
    buf.reserve_exact(len.min(FIRST_RESERVE_BYTES));
    let read = Read::take(&mut *r, len as u64).read_to_end(buf)?;
    if read < len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the stream ended {read} bytes into a frame of {len} bytes"),
        ));
    }
    Ok(())
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

    /// A prefix claiming 200 MiB followed by ten bytes: an error once the stream ends, with the
    /// buffer grown no further than the first reserve, not to the claim.
    #[test]
    fn a_huge_claim_with_a_short_body_does_not_allocate_the_claim() {
        let claim = 200 * 1024 * 1024;
        let mut buf = Vec::new();
        let err = read_body(&mut [7u8; 10].as_slice(), claim, &mut buf).expect_err("short body");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(err.to_string().contains("10 bytes into a frame of 209715200 bytes"), "{err}");
        assert!(buf.capacity() <= FIRST_RESERVE_BYTES, "reserved {} bytes", buf.capacity());
        // Through `read_frame` too: the same error, and the thread's buffer stays small enough to keep.
        let mut framed = u32::try_from(claim).expect("fits").to_le_bytes().to_vec();
        framed.extend_from_slice(&[7; 10]);
        let err = read_frame::<_, ChannelMessage>(&mut framed.as_slice()).expect_err("short body");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(DECODE.with_borrow(|b| b.capacity()) <= FIRST_RESERVE_BYTES);
    }

    /// A body larger than the first reserve, arriving a few bytes per read, is read whole; a body
    /// that fits the buffer's capacity reuses it.
    #[test]
    fn a_long_body_in_small_pieces_is_read_whole() {
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                let n = out.len().min(self.0.len()).min(7);
                out[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let body: Vec<u8> = (0..3 * FIRST_RESERVE_BYTES + 5).map(|i| (i % 251) as u8).collect();
        let mut buf = Vec::new();
        read_body(&mut Trickle(&body), body.len(), &mut buf).expect("whole body");
        assert_eq!(buf, body);
        let capacity = buf.capacity();
        read_body(&mut Trickle(&body[..100]), 100, &mut buf).expect("short body");
        assert_eq!((buf.as_slice(), buf.capacity()), (&body[..100], capacity));
    }
}
