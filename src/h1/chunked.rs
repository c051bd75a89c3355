//! The chunked transfer coding (RFC 9112 §7.1): a decoder as strict as
//! hyper's on chunk sizes, extensions, line ends and trailer fields, and
//! the encoder of a request body.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::{Error, MAX_HEADERS};

/// Bytes of chunk extensions a body may carry in all (hyper's limit).
const EXTENSIONS_LIMIT: u64 = 1024 * 16;

/// Bytes of trailer section a body may carry (hyper's limit).
const TRAILERS_LIMIT: usize = 1024 * 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Start,
    Size,
    SizeLws,
    Extension,
    SizeLf,
    Body,
    BodyCr,
    BodyLf,
    Trailer,
    TrailerLf,
    EndCr,
    EndLf,
    End,
}

/// What decoding the buffered bytes gave.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Body bytes.
    Data(Bytes),
    /// The trailer fields after the last chunk: the body has ended.
    Trailers(HeaderMap),
    /// The body has ended.
    End,
    /// More bytes are needed.
    More,
}

/// A chunked body's decoder, fed from a read buffer.
#[derive(Debug)]
pub struct Decoder {
    state: State,
    /// What is left of the current chunk, or its size being read.
    size: u64,
    extensions: u64,
    trailers: Option<BytesMut>,
    trailer_lines: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new()
    }
}

fn hex(byte: u8) -> Option<u64> {
    (byte as char).to_digit(16).map(u64::from)
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder {
            state: State::Start,
            size: 0,
            extensions: 0,
            trailers: None,
            trailer_lines: 0,
        }
    }

    /// Whether the last chunk and the trailer section were read.
    pub fn ended(&self) -> bool {
        self.state == State::End
    }

    /// Decodes from the start of `buf`, taking what it reads out of it.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Step, Error> {
        loop {
            match self.state {
                State::End => return Ok(Step::End),
                State::Body => {
                    if buf.is_empty() {
                        return Ok(Step::More);
                    }
                    let n = usize::try_from(self.size)
                        .unwrap_or(usize::MAX)
                        .min(buf.len());
                    self.size -= n as u64;
                    if self.size == 0 {
                        self.state = State::BodyCr;
                    }
                    return Ok(Step::Data(buf.split_to(n).freeze()));
                }
                _ => {}
            }
            let mut used = 0;
            for &byte in buf.iter() {
                used += 1;
                self.state = self.step(byte)?;
                if matches!(self.state, State::Body | State::End) {
                    break;
                }
            }
            buf.advance(used);
            match self.state {
                State::End => {
                    return match self.trailers.take() {
                        Some(trailers) => {
                            Ok(Step::Trailers(trailers_of(&trailers, self.trailer_lines)?))
                        }
                        None => Ok(Step::End),
                    }
                }
                State::Body => {}
                _ => return Ok(Step::More),
            }
        }
    }

    /// The state after `byte`.
    fn step(&mut self, byte: u8) -> Result<State, Error> {
        use State::*;
        Ok(match (self.state, byte) {
            (Start | Size, b) if hex(b).is_some() => {
                let digit = hex(b).unwrap_or(0);
                self.size = self
                    .size
                    .checked_mul(16)
                    .and_then(|s| s.checked_add(digit))
                    .ok_or(Error::Chunk("size overflow"))?;
                Size
            }
            (Start, _) => return Err(Error::Chunk("missing size digit")),
            (Size | SizeLws, b'\t' | b' ') => SizeLws,
            (Size | SizeLws, b';') => Extension,
            (Size | SizeLws, b'\r') => SizeLf,
            (Size | SizeLws, _) => return Err(Error::Chunk("invalid size")),
            (Extension, b'\r') => SizeLf,
            (Extension, b'\n') => return Err(Error::Chunk("newline in extension")),
            (Extension, _) => {
                self.extensions += 1;
                if self.extensions >= EXTENSIONS_LIMIT {
                    return Err(Error::Chunk("extensions over limit"));
                }
                Extension
            }
            (SizeLf, b'\n') if self.size == 0 => EndCr,
            (SizeLf, b'\n') => Body,
            (SizeLf, _) => return Err(Error::Chunk("invalid size line end")),
            (BodyCr, b'\r') => BodyLf,
            (BodyCr, _) => return Err(Error::Chunk("invalid chunk end CR")),
            (BodyLf, b'\n') => Start,
            (BodyLf, _) => return Err(Error::Chunk("invalid chunk end LF")),
            (Trailer, b) => {
                self.trailer_byte(b)?;
                if b == b'\r' {
                    TrailerLf
                } else {
                    Trailer
                }
            }
            (TrailerLf, b'\n') => {
                if self.trailer_lines >= MAX_HEADERS {
                    return Err(Error::Chunk("too many trailer fields"));
                }
                self.trailer_lines += 1;
                self.trailer_byte(b'\n')?;
                EndCr
            }
            (TrailerLf, _) => return Err(Error::Chunk("invalid trailer line end")),
            (EndCr, b'\r') => {
                if self.trailers.is_some() {
                    self.trailer_byte(b'\r')?;
                }
                EndLf
            }
            (EndCr, b) => {
                match &mut self.trailers {
                    None => {
                        let mut trailers = BytesMut::with_capacity(64);
                        trailers.put_u8(b);
                        self.trailers = Some(trailers);
                    }
                    Some(_) => self.trailer_byte(b)?,
                }
                Trailer
            }
            (EndLf, b'\n') => {
                if self.trailers.is_some() {
                    self.trailer_byte(b'\n')?;
                }
                End
            }
            (EndLf, _) => return Err(Error::Chunk("invalid end LF")),
            (Body | End, _) => self.state,
        })
    }

    fn trailer_byte(&mut self, byte: u8) -> Result<(), Error> {
        let trailers = self.trailers.get_or_insert_with(BytesMut::new);
        trailers.put_u8(byte);
        if trailers.len() >= TRAILERS_LIMIT {
            return Err(Error::Chunk("trailers over limit"));
        }
        Ok(())
    }
}

/// The trailer section read, as fields.
fn trailers_of(buf: &[u8], lines: usize) -> Result<HeaderMap, Error> {
    let mut fields = vec![httparse::EMPTY_HEADER; lines];
    let mut trailers = HeaderMap::new();
    match httparse::parse_headers(buf, &mut fields) {
        Ok(httparse::Status::Complete((_, fields))) => {
            for field in fields {
                let name =
                    HeaderName::from_bytes(field.name.as_bytes()).map_err(|_| Error::Trailers)?;
                let value = HeaderValue::from_bytes(field.value).map_err(|_| Error::Trailers)?;
                trailers.append(name, value);
            }
            Ok(trailers)
        }
        _ => Err(Error::Trailers),
    }
}

/// Writes `data` as one chunk (a size in upper-case hex, as hyper writes it).
pub fn chunk(dst: &mut BytesMut, data: &[u8]) {
    let mut size = [0u8; 16];
    let mut at = size.len();
    let mut n = data.len();
    loop {
        at -= 1;
        size[at] = b"0123456789ABCDEF"[n % 16];
        n /= 16;
        if n == 0 {
            break;
        }
    }
    dst.reserve(size.len() - at + data.len() + 4);
    dst.put_slice(&size[at..]);
    dst.put_slice(b"\r\n");
    dst.put_slice(data);
    dst.put_slice(b"\r\n");
}

/// The last chunk, without trailer fields.
pub const LAST: &[u8] = b"0\r\n\r\n";

/// Fields never sent as trailers (hyper's list).
fn trailer_allowed(name: &HeaderName) -> bool {
    !matches!(
        *name,
        header::AUTHORIZATION
            | header::CACHE_CONTROL
            | header::CONTENT_ENCODING
            | header::CONTENT_LENGTH
            | header::CONTENT_RANGE
            | header::CONTENT_TYPE
            | header::HOST
            | header::MAX_FORWARDS
            | header::SET_COOKIE
            | header::TRAILER
            | header::TRANSFER_ENCODING
            | header::TE
    )
}

/// Writes the last chunk with the fields of `trailers` that `declared`
/// (the request's `Trailer` field) names and that may be trailers; `false`
/// (nothing written) when there are none, as hyper then ends the body
/// with [`LAST`].
pub fn last_with_trailers(
    dst: &mut BytesMut,
    trailers: &HeaderMap,
    declared: &[HeaderName],
) -> bool {
    let start = dst.len();
    dst.put_slice(b"0\r\n");
    let mut any = false;
    for (name, value) in trailers {
        if declared.contains(name) && trailer_allowed(name) {
            any = true;
            dst.put_slice(name.as_str().as_bytes());
            dst.put_slice(b": ");
            dst.put_slice(value.as_bytes());
            dst.put_slice(b"\r\n");
        }
    }
    if !any {
        dst.truncate(start);
        return false;
    }
    dst.put_slice(b"\r\n");
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` fed in pieces of `size` bytes: the body, the
    /// trailers, or the error.
    fn decode(input: &[u8], size: usize) -> Result<(Vec<u8>, Option<HeaderMap>, bool), Error> {
        let mut decoder = Decoder::new();
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        let mut pieces = input.chunks(size.max(1));
        loop {
            match decoder.decode(&mut buf)? {
                Step::Data(data) => body.extend_from_slice(&data),
                Step::Trailers(t) => return Ok((body, Some(t), buf.is_empty())),
                Step::End => return Ok((body, None, buf.is_empty())),
                Step::More => match pieces.next() {
                    Some(piece) => buf.extend_from_slice(piece),
                    None => return Err(Error::Chunk("eof")),
                },
            }
        }
    }

    #[test]
    fn a_body_with_trailers_split_at_every_byte() {
        let input = b"5;ext=1\r\nhello\r\na \t\r\n, world!!!\r\n0\r\nX-Sum: 12\r\nX-Two: a\r\n\r\n";
        for size in 1..=input.len() {
            let (body, trailers, rest) = decode(input, size).unwrap();
            assert_eq!(body, b"hello, world!!!");
            let trailers = trailers.unwrap();
            assert_eq!(trailers["x-sum"], "12");
            assert_eq!(trailers["x-two"], "a");
            assert!(rest);
        }
    }

    #[test]
    fn a_body_without_trailers_ends_at_its_last_chunk() {
        let input = b"3\r\nabc\r\n0\r\n\r\nHTTP/1.1";
        for split in 0..=input.len() {
            let mut decoder = Decoder::new();
            let mut buf = BytesMut::from(&input[..split]);
            let mut rest = &input[split..];
            let mut body = Vec::new();
            loop {
                match decoder.decode(&mut buf).unwrap() {
                    Step::Data(d) => body.extend_from_slice(&d),
                    Step::End => break,
                    Step::More if !rest.is_empty() => {
                        buf.extend_from_slice(rest);
                        rest = &[];
                    }
                    other => panic!("{other:?} at {split}"),
                }
            }
            buf.extend_from_slice(rest);
            assert_eq!(body, b"abc");
            assert_eq!(
                &buf[..],
                b"HTTP/1.1",
                "what follows the body stays, split at {split}"
            );
        }
    }

    #[test]
    fn bad_sizes_and_line_ends_are_refused() {
        for bad in [
            &b"x\r\n"[..],
            b"\r\n",
            b" 5\r\nhello\r\n0\r\n\r\n",
            b"5 5\r\nhello\r\n",
            b"5\nhello\r\n",
            b"5\r\nhelloX\r\n",
            b"5\r\nhello\rX",
            b"5;a\nb\r\n",
            b"-5\r\n",
            b"+5\r\n",
            b"0x5\r\n",
            b"0\r\nX: y\rZ",
            b"0\r\n\rX",
        ] {
            for size in 1..=bad.len() {
                assert!(
                    matches!(decode(bad, size), Err(Error::Chunk(m)) if m != "eof"),
                    "{:?} in pieces of {size}",
                    String::from_utf8_lossy(bad)
                );
            }
        }
    }

    #[test]
    fn sizes_that_overflow_are_refused() {
        assert_eq!(
            decode(b"FFFFFFFFFFFFFFFF\r\n", 3).unwrap_err(),
            Error::Chunk("eof")
        );
        assert_eq!(
            decode(b"10000000000000000\r\n", 3).unwrap_err(),
            Error::Chunk("size overflow")
        );
        assert_eq!(
            decode(b"0000000000000000000000001\r\nA\r\n0\r\n\r\n", 2)
                .unwrap()
                .0,
            b"A"
        );
    }

    #[test]
    fn too_many_trailers_or_bad_ones_are_refused() {
        let mut many = b"0\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            many.extend_from_slice(format!("x-{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert!(decode(&many, 7).is_err());
        assert_eq!(
            decode(b"0\r\nbad name: v\r\n\r\n", 4).unwrap_err(),
            Error::Trailers
        );
        let long = format!("0\r\nx: {}\r\n\r\n", "a".repeat(TRAILERS_LIMIT));
        assert!(decode(long.as_bytes(), 100).is_err());
    }

    #[test]
    fn chunks_are_written_with_upper_case_sizes() {
        let mut dst = BytesMut::new();
        chunk(&mut dst, &[b'a'; 0x2AF]);
        assert!(dst.starts_with(b"2AF\r\naaa"));
        assert!(dst.ends_with(b"a\r\n"));
        let mut trailers = HeaderMap::new();
        trailers.insert("x-sum", HeaderValue::from_static("1"));
        trailers.insert("content-type", HeaderValue::from_static("x"));
        let mut dst = BytesMut::new();
        let declared = [HeaderName::from_static("x-sum"), header::CONTENT_TYPE];
        assert!(last_with_trailers(&mut dst, &trailers, &declared));
        assert_eq!(&dst[..], b"0\r\nx-sum: 1\r\n\r\n");
        let mut dst = BytesMut::new();
        assert!(!last_with_trailers(
            &mut dst,
            &trailers,
            &[header::CONTENT_TYPE]
        ));
        assert!(dst.is_empty());
    }
}
