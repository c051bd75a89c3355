//! The watch on an HTTP/2 connection's reads: it follows the frame headers
//! (RFC 9113 §4.1) after the connection preface to report since when a
//! header block (`HEADERS` and its `CONTINUATION`s) has been open, whose
//! deadline is the server's. It only reports: the stream is never changed
//! or held back, and nothing is copied but a frame header split across
//! reads.
//!
//! The server puts it on a connection only once it is known to be HTTP/2
//! (by ALPN, or by the preface sniffed for prior knowledge), so an HTTP/1
//! connection, whose heads `connection`'s engine alone reads, pays nothing
//! for it.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// The connection preface a client sends first (RFC 9113 §3.4); hyper
/// checks it, the watch only skips it.
const PREFACE_LEN: u8 = 24;

/// HTTP/2 frame types that carry a header block, and the flag ending one.
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;

/// One connection's report, shared by its stream and the server.
#[derive(Clone, Debug, Default)]
pub struct HeaderBlocks(Arc<Mutex<Option<Instant>>>);

impl HeaderBlocks {
    /// Since when a header block has been open, if one is.
    pub fn header_block_since(&self) -> Option<Instant> {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, since: Option<Instant>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = since;
    }
}

/// An HTTP/2 client stream whose reads are watched; reads and writes go
/// straight through to the inner stream. Its first bytes read must be the
/// connection preface.
pub struct Watched<IO> {
    io: IO,
    frames: Frames,
    blocks: HeaderBlocks,
}

impl<IO> Watched<IO> {
    pub fn new(io: IO) -> Watched<IO> {
        Watched {
            io,
            frames: Frames {
                preface: PREFACE_LEN,
                header: [0; 9],
                have: 0,
                left: 0,
                ends_block: false,
            },
            blocks: HeaderBlocks::default(),
        }
    }

    /// The handle the server reads.
    pub fn header_blocks(&self) -> HeaderBlocks {
        self.blocks.clone()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.frames.feed(&buf.filled()[before..], &this.blocks);
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Where the watch is in the frame stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Frames {
    /// Bytes of the preface still to skip.
    preface: u8,
    /// The frame header being read, and how much of it has arrived.
    header: [u8; 9],
    have: u8,
    /// Payload bytes of the current frame still to skip.
    left: u32,
    /// The current frame is the end of a header block (`HEADERS` or
    /// `CONTINUATION` with `END_HEADERS`).
    ends_block: bool,
}

impl Frames {
    fn feed(&mut self, mut bytes: &[u8], blocks: &HeaderBlocks) {
        while !bytes.is_empty() {
            let used = self.step(bytes, blocks);
            bytes = &bytes[used..];
        }
    }

    /// Consumes bytes (at least one), noting header blocks; returns how many.
    fn step(&mut self, bytes: &[u8], blocks: &HeaderBlocks) -> usize {
        if self.preface > 0 {
            let used = bytes.len().min(usize::from(self.preface));
            self.preface -= used as u8;
            return used;
        }
        if self.left > 0 {
            let used = bytes.len().min(self.left as usize);
            self.left -= used as u32;
            if self.left == 0 {
                self.frame_done(blocks);
            }
            return used;
        }
        let have = usize::from(self.have);
        let used = bytes.len().min(9 - have);
        self.header[have..have + used].copy_from_slice(&bytes[..used]);
        self.have += used as u8;
        if self.have == 9 {
            let [l0, l1, l2, kind, flags, ..] = self.header;
            self.have = 0;
            self.left = u32::from_be_bytes([0, l0, l1, l2]);
            let block = kind == HEADERS || kind == CONTINUATION;
            self.ends_block = block && flags & END_HEADERS != 0;
            if block && blocks.header_block_since().is_none() {
                blocks.set(Some(Instant::now()));
            }
            if self.left == 0 {
                self.frame_done(blocks);
            }
        }
        used
    }

    fn frame_done(&mut self, blocks: &HeaderBlocks) {
        if std::mem::take(&mut self.ends_block) {
            blocks.set(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    /// A watch fed these pieces, one read each.
    fn fed(pieces: &[&[u8]]) -> Watched<()> {
        let mut watched = Watched::new(());
        for piece in pieces {
            watched.frames.feed(piece, &watched.blocks);
        }
        watched
    }

    /// An HTTP/2 frame header: length, type, flags, stream 1.
    fn frame(len: u32, kind: u8, flags: u8) -> Vec<u8> {
        let [_, l0, l1, l2] = len.to_be_bytes();
        vec![l0, l1, l2, kind, flags, 0, 0, 0, 1]
    }

    #[test]
    fn http2_frames_are_followed_but_never_read_as_heads() {
        // After an empty SETTINGS, bytes that read as an HTTP/1 head are a
        // frame header like any other: `POS` its length, `T` its type.
        let head = b"POST /d HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n";
        let stream = [PREFACE, &frame(0, 0x4, 0), head].concat();
        let watched = fed(&[&stream[..5], &stream[5..]]);
        let length = u32::from_be_bytes([0, b'P', b'O', b'S']);
        assert_eq!(watched.frames.left, length - (head.len() as u32 - 9));
        assert_eq!(watched.frames.header[3], b'T');
        assert_eq!(watched.blocks.header_block_since(), None);
    }

    #[test]
    fn an_open_http2_header_block_is_reported_until_it_ends() {
        let settings = frame(0, 0x4, 0);
        // HEADERS without END_HEADERS, then CONTINUATION with it.
        let headers = [frame(3, HEADERS, 0), b"abc".to_vec()].concat();
        let continuation = [frame(2, CONTINUATION, END_HEADERS), b"de".to_vec()].concat();
        let data = [frame(4, 0x0, 0x1), b"body".to_vec()].concat();
        let stream = [
            PREFACE.to_vec(),
            settings,
            headers,
            continuation.clone(),
            data,
        ]
        .concat();
        let end_of_block = stream.len() - 13;
        let open_from = end_of_block - continuation.len() - 12 + 9;
        for at in 0..=stream.len() {
            let watched = fed(&[&stream[..at]]);
            let open = (open_from..end_of_block).contains(&at);
            let blocks = &watched.blocks;
            assert_eq!(blocks.header_block_since().is_some(), open, "split at {at}");
            let watched = fed(&[&stream[..at], &stream[at..]]);
            assert_eq!(watched.blocks.header_block_since(), None, "split at {at}");
            assert_eq!(watched.frames.left, 0, "split at {at}");
        }
    }

    #[tokio::test]
    async fn reads_through_the_wrapper_are_unchanged_and_watched() {
        let headers = [frame(3, HEADERS, 0), b"abc".to_vec()].concat();
        let stream = [PREFACE.to_vec(), frame(0, 0x4, 0), headers].concat();
        let (mut client, server) = tokio::io::duplex(7);
        let mut watched = Watched::new(server);
        let blocks = watched.header_blocks();
        let sent = stream.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&sent).await.unwrap();
            client.shutdown().await.unwrap();
            client
        });
        let mut got = b"prefix".to_vec();
        while watched.read_buf(&mut got).await.unwrap() > 0 {}
        let mut client = writer.await.unwrap();
        assert_eq!(&got[6..], &stream[..]);
        assert!(blocks.header_block_since().is_some(), "the block is open");
        watched.write_all(b"answer").await.unwrap();
        let mut answer = [0; 6];
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"answer");
    }
}
