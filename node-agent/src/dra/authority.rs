//! The kubelet's plugin watcher dials a registration socket by its bare path (no `unix:`
//! scheme, no `WithAuthority`), so grpc-go sends the path as the HTTP/2 `:authority`
//! (kubernetes/kubernetes#108254; the kubelet's own DRA client dials `unix:` and sends
//! `localhost`). The h2 server under tonic refuses such a request as malformed
//! (`PROTOCOL_ERROR`), so no Rust plugin could register. This relay sits between each
//! connection to the registration socket and the registration server: bytes from the server
//! pass untouched, and of the kubelet's only the request header blocks change, decoded with
//! the connection's HPACK state and encoded again with `:authority: localhost`.

use fluke_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The HTTP/2 client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The authority written instead: what grpc-go itself sends over `unix:` targets.
pub const AUTHORITY: &[u8] = b"localhost";

fn invalid(why: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why.into())
}

/// A request header block being gathered from a HEADERS frame and its CONTINUATIONs.
struct Pending {
    stream: u32,
    end_stream: bool,
    block: Vec<u8>,
}

/// Copies the kubelet's side of one connection to the server, with every request's
/// `:authority` replaced; returns at the kubelet's end of stream.
pub async fn rewrite<R, W>(mut from: R, mut to: W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(invalid("not an HTTP/2 connection"));
    }
    to.write_all(&preface).await?;
    let mut decoder = Decoder::new();
    let mut encoder = Encoder::new();
    let mut pending: Option<Pending> = None;
    loop {
        let mut header = [0u8; 9];
        match from.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                to.shutdown().await?;
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        let length =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let (kind, flags) = (header[3], header[4]);
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; length];
        from.read_exact(&mut payload).await?;
        match kind {
            HEADERS => {
                let mut fragment = payload.as_slice();
                let padding = if flags & PADDED != 0 {
                    let (&pad, rest) = fragment
                        .split_first()
                        .ok_or_else(|| invalid("empty padded HEADERS"))?;
                    fragment = rest;
                    usize::from(pad)
                } else {
                    0
                };
                if flags & PRIORITY != 0 {
                    fragment = fragment
                        .get(5..)
                        .ok_or_else(|| invalid("short HEADERS priority"))?;
                }
                let end = fragment
                    .len()
                    .checked_sub(padding)
                    .ok_or_else(|| invalid("HEADERS padding past its end"))?;
                pending = Some(Pending {
                    stream,
                    end_stream: flags & END_STREAM != 0,
                    block: fragment[..end].to_vec(),
                });
            }
            CONTINUATION => match pending.as_mut() {
                Some(open) if open.stream == stream => open.block.extend_from_slice(&payload),
                _ => return Err(invalid("CONTINUATION without its HEADERS")),
            },
            _ => {
                to.write_all(&header).await?;
                to.write_all(&payload).await?;
                continue;
            }
        }
        if flags & END_HEADERS == 0 {
            continue;
        }
        let Some(done) = pending.take() else {
            continue;
        };
        let fields = decoder
            .decode(&done.block)
            .map_err(|e| invalid(format!("request headers: {e:?}")))?;
        let block = encoder.encode(fields.iter().map(|(name, value)| {
            let value: &[u8] = if name.as_slice() == b":authority" {
                AUTHORITY
            } else {
                value
            };
            (name.as_slice(), value)
        }));
        let length = u32::try_from(block.len()).map_err(|_| invalid("header block too large"))?;
        let mut frame = Vec::with_capacity(9 + block.len());
        frame.extend_from_slice(&length.to_be_bytes()[1..]);
        frame.push(HEADERS);
        frame.push(END_HEADERS | if done.end_stream { END_STREAM } else { 0 });
        frame.extend_from_slice(&done.stream.to_be_bytes());
        frame.extend_from_slice(&block);
        to.write_all(&frame).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = u32::try_from(payload.len()).expect("len").to_be_bytes()[1..].to_vec();
        out.extend([kind, flags]);
        out.extend(stream.to_be_bytes());
        out.extend(payload);
        out
    }

    /// A frame as written: type, flags, stream, its decoded header fields and its payload.
    type Frame = (u8, u8, u32, Vec<(Vec<u8>, Vec<u8>)>, Vec<u8>);

    /// Reads the frames a rewrite wrote, decoding header blocks as the server would.
    fn frames(mut bytes: &[u8]) -> Vec<Frame> {
        assert_eq!(&bytes[..24], PREFACE);
        bytes = &bytes[24..];
        let mut decoder = Decoder::new();
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let length =
                usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            let (kind, flags) = (bytes[3], bytes[4]);
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            let payload = bytes[9..9 + length].to_vec();
            let fields = if kind == HEADERS {
                decoder.decode(&payload).expect("decodes")
            } else {
                Vec::new()
            };
            out.push((kind, flags, stream, fields, payload));
            bytes = &bytes[9 + length..];
        }
        out
    }

    #[tokio::test]
    async fn only_the_authority_changes_across_frames_and_streams() {
        let path: &[u8] = b"var/lib/kubelet/plugins_registry/gpu.runtimekit.aliyun.com-reg.sock";
        let request = |encoder: &mut Encoder<'_>, method: &[u8]| {
            encoder.encode([
                (&b":method"[..], &b"POST"[..]),
                (b":scheme", b"http"),
                (b":path", method),
                (b":authority", path),
                (b"content-type", b"application/grpc"),
            ])
        };
        // As grpc-go sends it: the same encoder (dynamic table) for both requests.
        let mut client = Encoder::new();
        let first = request(&mut client, b"/pluginregistration.Registration/GetInfo");
        let second = request(
            &mut client,
            b"/pluginregistration.Registration/NotifyRegistrationStatus",
        );
        let (head, tail) = first.split_at(first.len() / 2);
        let mut padded = vec![3u8];
        padded.extend(&second);
        padded.extend([0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        input.extend(frame(HEADERS, 0, 1, head));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, tail));
        input.extend(frame(0x0, END_STREAM, 1, b"data")); // DATA
        input.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM | PADDED,
            3,
            &padded,
        ));
        let mut output = Vec::new();
        rewrite(input.as_slice(), &mut output)
            .await
            .expect("rewrites");
        let frames = frames(&output);
        let kinds: Vec<(u8, u8, u32)> = frames.iter().map(|f| (f.0, f.1, f.2)).collect();
        assert_eq!(
            kinds,
            [
                (0x4, 0, 0),
                (HEADERS, END_HEADERS, 1),
                (0x0, END_STREAM, 1),
                (HEADERS, END_HEADERS | END_STREAM, 3)
            ]
        );
        assert_eq!(frames[2].4, b"data");
        for (_, _, _, fields, _) in frames.iter().filter(|f| f.0 == HEADERS) {
            let authority: Vec<&[u8]> = fields
                .iter()
                .filter(|(n, _)| n == b":authority")
                .map(|(_, v)| v.as_slice())
                .collect();
            assert_eq!(authority, [AUTHORITY]);
            assert!(
                fields
                    .iter()
                    .any(|(n, v)| n == b"content-type" && v == b"application/grpc")
            );
        }
        assert!(
            frames[3]
                .3
                .iter()
                .any(|(n, v)| n == b":path" && v.ends_with(b"NotifyRegistrationStatus"))
        );
    }

    #[tokio::test]
    async fn what_is_not_http2_is_refused() {
        let mut output = Vec::new();
        let refused = rewrite(&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..], &mut output).await;
        assert!(refused.is_err());
        let mut input = PREFACE.to_vec();
        input.extend(frame(CONTINUATION, END_HEADERS, 1, b"x"));
        assert!(rewrite(input.as_slice(), &mut output).await.is_err());
    }
}
