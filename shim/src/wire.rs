//! One gRPC unary call over HTTP/2 (RFC 9113) on a connected stream: the client side of
//! exactly what `TokenService/GetToken` needs, written out by hand so the shim links no
//! async runtime and no HTTP stack (its size and start-up are the point of it; the broker
//! keeps tonic).
//!
//! The call is one stream (id 1) on a fresh connection: the preface, this client's
//! SETTINGS, the connection's receive window raised to [`RECEIVE_WINDOW`], the request's
//! HEADERS and its DATA, all in one write when the request fits HTTP/2's initial windows.
//! Then frames are read until the answer's trailers end the stream. The broker's first frame
//! must be its SETTINGS (RFC 9113 §3.4); its SETTINGS are acknowledged and its PINGs answered
//! (at most [`MAX_PINGS`] of them); its WINDOW_UPDATEs release the rest of a large request,
//! and one of 0 or one that pushes a window past 2^31-1 ends the call (§6.9, §6.9.1). The
//! answer's DATA is counted against this client's receive windows, which WINDOW_UPDATEs
//! reopen as the answer is read, up to what the largest answer needs: a peer that sends past
//! them ignores flow control and is refused (§6.9.1). Everything the peer sends is bounded
//! before it is kept: frames at [`FRAME_SIZE`], header blocks at [`hpack::MAX_HEADER_LIST`]
//! (plus a frame), the message at [`MAX_ANSWER_BYTES`]. A peer that stops talking is the
//! caller's deadline to handle.
//!
//! [`unary`] is generic over the stream so the fuzz target (`fuzz/fuzz_targets/shim_answer.rs`)
//! can feed it any bytes.

use std::io::{self, Read, Write};

use crate::hpack;

/// The largest gRPC message accepted: tonic's default `max_decoding_message_size`, what
/// the shim accepted while it used tonic. An ExecCredential with a client certificate and
/// key is a few KB.
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// The largest frame the broker may send: HTTP/2's default `SETTINGS_MAX_FRAME_SIZE`
/// (RFC 9113 §6.5.2), which this client never raises.
pub const FRAME_SIZE: usize = 16_384;

/// Every window starts at this size (RFC 9113 §6.9.2).
const INITIAL_WINDOW: i64 = 65_535;

/// The largest a flow-control window may be (RFC 9113 §6.9.1).
const MAX_WINDOW: i64 = 0x7fff_ffff;

/// The receive window this client opens for the answer, on the stream (SETTINGS) and on the
/// connection (WINDOW_UPDATE), and keeps open as it reads: 1 MiB, so an ExecCredential (a few
/// KB) arrives without waiting on this client, and the largest answer ([`MAX_ANSWER_BYTES`])
/// after a few WINDOW_UPDATEs.
pub const RECEIVE_WINDOW: u32 = 1 << 20;

/// All the DATA this client lets the broker send in one call (the windows are reopened up to
/// this and no further): the largest answer with its 5-byte prefix, and one frame for
/// padding. A peer sending more has ignored the windows.
const RECEIVE_BUDGET: i64 = (MAX_ANSWER_BYTES + 5 + FRAME_SIZE) as i64;

/// PINGs answered in one call. The broker pings a quiet connection once a minute (its
/// keepalive, `KEEPALIVE_INTERVAL` in broker/src/grpc/server.rs), so 128 is over two hours of
/// waiting on a slow upstream, far past the default 30 s `--timeout`; a peer past it is
/// flooding the call, which would otherwise last until the deadline.
pub const MAX_PINGS: usize = 128;

/// `:authority` of the request. It only fills HTTP/2's pseudo-header: "localhost" is what
/// every gRPC server accepts (h2 rejects a socket path there).
const AUTHORITY: &str = "localhost";

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const STREAM: u32 = 1;

// Frame types (RFC 9113 §6).
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;

// Flags.
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

// SETTINGS identifiers (RFC 9113 §6.5.2).
const SETTINGS_ENABLE_PUSH: u16 = 0x2;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// The end of a call: gRPC's status, and on `OK` the one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// `grpc-status`.
    pub code: i32,
    /// `grpc-message`, percent-decoded.
    pub message: String,
    /// `grpc-status-details-bin`, base64-decoded (an encoded `google.rpc.Status`); empty
    /// when absent or not base64.
    pub details: Vec<u8>,
    /// The response message when `code` is 0 (the gRPC length prefix removed).
    pub body: Vec<u8>,
}

/// Why a call got no gRPC status.
#[derive(Debug)]
pub enum WireError {
    /// Reading or writing the socket failed.
    Io(io::Error),
    /// The peer closed the connection before the answer was complete.
    Closed,
    /// The peer ended the call at the HTTP/2 level: `RST_STREAM` or `GOAWAY`, with its code.
    Reset(&'static str, u32),
    /// What the peer sent is not a gRPC answer over HTTP/2.
    Protocol(String),
    /// The peer broke HTTP/2 itself (RFC 9113 §5.4.1): the error code this client reports
    /// (`PROTOCOL_ERROR`, `FLOW_CONTROL_ERROR`, …) and why.
    Connection(u32, String),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Io(e) => e.fmt(f),
            WireError::Closed => f.write_str("the connection closed before the answer"),
            WireError::Reset(frame, code) => {
                write!(
                    f,
                    "the peer ended the call with {frame} ({})",
                    h2_code(*code)
                )
            }
            WireError::Protocol(why) => write!(f, "not a gRPC answer: {why}"),
            WireError::Connection(code, why) => {
                write!(f, "the peer broke HTTP/2 ({}): {why}", h2_code(*code))
            }
        }
    }
}

impl From<io::Error> for WireError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            WireError::Closed
        } else {
            WireError::Io(e)
        }
    }
}

fn protocol(why: impl Into<String>) -> WireError {
    WireError::Protocol(why.into())
}

// The error codes this client reports (RFC 9113 §7).
const PROTOCOL_ERROR: u32 = 0x1;
const FLOW_CONTROL_ERROR: u32 = 0x3;
const FRAME_SIZE_ERROR: u32 = 0x6;

fn h2_error(code: u32, why: impl Into<String>) -> WireError {
    WireError::Connection(code, why.into())
}

/// RFC 9113 §7's error code names.
fn h2_code(code: u32) -> String {
    const NAMES: [&str; 14] = [
        "NO_ERROR",
        "PROTOCOL_ERROR",
        "INTERNAL_ERROR",
        "FLOW_CONTROL_ERROR",
        "SETTINGS_TIMEOUT",
        "STREAM_CLOSED",
        "FRAME_SIZE_ERROR",
        "REFUSED_STREAM",
        "CANCEL",
        "COMPRESSION_ERROR",
        "CONNECT_ERROR",
        "ENHANCE_YOUR_CALM",
        "INADEQUATE_SECURITY",
        "HTTP_1_1_REQUIRED",
    ];
    match NAMES.get(code as usize) {
        Some(name) => (*name).to_owned(),
        None => format!("error code {code}"),
    }
}

/// The one method the shim calls: `credbroker.v1.TokenService/GetToken` as an HTTP/2 path.
pub const GET_TOKEN: &str = "/credbroker.v1.TokenService/GetToken";

/// Makes the call `path` (`/package.Service/Method`) with the encoded `message` on `stream`
/// and reads its answer.
pub fn unary<S: Read + Write>(
    stream: &mut S,
    path: &str,
    message: &[u8],
) -> Result<Answer, WireError> {
    let mut call = Call::new(stream, message);
    call.start(path)?;
    call.finish()
}

struct Call<'s, S> {
    stream: &'s mut S,
    /// The request as gRPC frames it: flag, length, message.
    request: Vec<u8>,
    sent: usize,
    conn_window: i64,
    stream_window: i64,
    peer_frame: usize,
    /// What the peer may still send on the connection and on the stream (they move
    /// together: the call is the connection's one stream), and all it was ever allowed.
    recv_window: i64,
    recv_granted: i64,
    /// Whether the peer's SETTINGS, its first frame, has come.
    settings_seen: bool,
    pings: usize,
    out: Vec<u8>,
    input: Vec<u8>,
    /// Start of the unread part of `input`.
    at: usize,
    decoder: hpack::Decoder,
    /// A header block waiting for its CONTINUATIONs, and whether it ends the stream.
    block: Option<(Vec<u8>, bool)>,
    headers_seen: bool,
    body: Vec<u8>,
}

impl<'s, S: Read + Write> Call<'s, S> {
    fn new(stream: &'s mut S, message: &[u8]) -> Self {
        let mut request = Vec::with_capacity(5 + message.len());
        request.push(0);
        request.extend_from_slice(&(message.len() as u32).to_be_bytes());
        request.extend_from_slice(message);
        Call {
            stream,
            request,
            sent: 0,
            conn_window: INITIAL_WINDOW,
            stream_window: INITIAL_WINDOW,
            peer_frame: FRAME_SIZE,
            recv_window: i64::from(RECEIVE_WINDOW),
            recv_granted: i64::from(RECEIVE_WINDOW),
            settings_seen: false,
            pings: 0,
            out: Vec::with_capacity(512),
            input: Vec::new(),
            at: 0,
            decoder: hpack::Decoder::default(),
            block: None,
            headers_seen: false,
            body: Vec::new(),
        }
    }

    /// The preface, SETTINGS, the connection window, HEADERS and as much DATA as the
    /// initial windows allow, in one write.
    fn start(&mut self, path: &str) -> Result<(), WireError> {
        self.out.extend_from_slice(PREFACE);
        let mut settings = Vec::with_capacity(18);
        for (id, value) in [
            (SETTINGS_ENABLE_PUSH, 0),
            (SETTINGS_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW),
            (SETTINGS_MAX_HEADER_LIST_SIZE, hpack::MAX_HEADER_LIST as u32),
        ] {
            settings.extend_from_slice(&id.to_be_bytes());
            settings.extend_from_slice(&value.to_be_bytes());
        }
        self.frame(SETTINGS, 0, 0, &settings);
        let increment = RECEIVE_WINDOW - INITIAL_WINDOW as u32;
        self.frame(WINDOW_UPDATE, 0, 0, &increment.to_be_bytes());
        let mut block = Vec::with_capacity(128);
        hpack::encode(
            &[
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", AUTHORITY),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
            &mut block,
        );
        if block.len() > FRAME_SIZE {
            return Err(protocol("the request's path is too long for one frame"));
        }
        self.frame(HEADERS, END_HEADERS, STREAM, &block);
        self.send_data()
    }

    /// Appends one frame to the output.
    fn frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let len = payload.len() as u32;
        self.out.extend_from_slice(&len.to_be_bytes()[1..]);
        self.out.push(kind);
        self.out.push(flags);
        self.out.extend_from_slice(&stream.to_be_bytes());
        self.out.extend_from_slice(payload);
    }

    /// Frames as much of the request as the windows allow and writes all pending output.
    fn send_data(&mut self) -> Result<(), WireError> {
        while self.sent < self.request.len() {
            let window = self.conn_window.min(self.stream_window);
            if window <= 0 {
                break;
            }
            let n = (self.request.len() - self.sent)
                .min(self.peer_frame)
                .min(window as usize);
            let end = self.sent + n;
            let flags = if end == self.request.len() {
                END_STREAM
            } else {
                0
            };
            let chunk = self.request[self.sent..end].to_vec();
            self.frame(DATA, flags, STREAM, &chunk);
            self.sent = end;
            self.conn_window -= n as i64;
            self.stream_window -= n as i64;
        }
        self.flush()
    }

    fn flush(&mut self) -> Result<(), WireError> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    /// Ensures `n` unread bytes are buffered.
    fn fill(&mut self, n: usize) -> Result<(), WireError> {
        if self.at > 0 && self.input.len() - self.at < n {
            self.input.drain(..self.at);
            self.at = 0;
        }
        while self.input.len() - self.at < n {
            let have = self.input.len();
            let want = (n - (have - self.at)).max(FRAME_SIZE + 9);
            self.input.resize(have + want, 0);
            let read = loop {
                match self.stream.read(&mut self.input[have..]) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    other => break other,
                }
            };
            self.input.truncate(have + read.as_ref().map_or(0, |r| *r));
            match read {
                Ok(0) => return Err(WireError::Closed),
                Ok(_) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The next frame: type, flags, stream id and payload.
    fn next_frame(&mut self) -> Result<(u8, u8, u32, Vec<u8>), WireError> {
        self.fill(9)?;
        let h = &self.input[self.at..self.at + 9];
        let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
        let (kind, flags) = (h[3], h[4]);
        let id = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        if len > FRAME_SIZE {
            return Err(protocol(format!(
                "a frame of {len} bytes, over the {FRAME_SIZE} this client allows"
            )));
        }
        self.fill(9 + len)?;
        let payload = self.input[self.at + 9..self.at + 9 + len].to_vec();
        self.at += 9 + len;
        Ok((kind, flags, id, payload))
    }

    /// Reads frames until the answer is complete.
    fn finish(&mut self) -> Result<Answer, WireError> {
        loop {
            let (kind, flags, id, payload) = self.next_frame()?;
            if !self.settings_seen {
                if kind != SETTINGS || flags & ACK != 0 {
                    return Err(h2_error(
                        PROTOCOL_ERROR,
                        format!(
                            "its first frame is {}, not SETTINGS (RFC 9113 §3.4)",
                            frame_name(kind, flags)
                        ),
                    ));
                }
                self.settings_seen = true;
            }
            if let Some((mut block, ends)) = self.block.take() {
                if kind != CONTINUATION || id != STREAM {
                    return Err(protocol("a header block without its CONTINUATION"));
                }
                block.extend_from_slice(&payload);
                check_block(&block)?;
                if flags & END_HEADERS == 0 {
                    self.block = Some((block, ends));
                    continue;
                }
                if let Some(answer) = self.header_block(&block, ends)? {
                    return Ok(answer);
                }
                continue;
            }
            match kind {
                DATA => {
                    self.on_stream(id, "DATA")?;
                    if !self.headers_seen {
                        return Err(protocol("DATA before the response headers"));
                    }
                    self.received(payload.len())?;
                    let data = unpad(&payload, flags)?;
                    if self.body.len() + data.len() > MAX_ANSWER_BYTES + 5 {
                        return Err(protocol(format!("an answer over {MAX_ANSWER_BYTES} bytes")));
                    }
                    self.body.extend_from_slice(data);
                    if flags & END_STREAM != 0 {
                        return Err(protocol("the answer ended without a grpc-status"));
                    }
                    self.reopen_window()?;
                }
                HEADERS => {
                    self.on_stream(id, "HEADERS")?;
                    let mut block = unpad(&payload, flags)?;
                    if flags & PRIORITY != 0 {
                        block = block
                            .get(5..)
                            .ok_or_else(|| protocol("a HEADERS frame too short"))?;
                    }
                    let ends = flags & END_STREAM != 0;
                    if flags & END_HEADERS == 0 {
                        self.block = Some((block.to_vec(), ends));
                        continue;
                    }
                    if let Some(answer) = self.header_block(block, ends)? {
                        return Ok(answer);
                    }
                }
                RST_STREAM if id == STREAM => {
                    return Err(WireError::Reset("RST_STREAM", be32(&payload)?));
                }
                SETTINGS => self.settings(flags, id, &payload)?,
                PUSH_PROMISE => return Err(protocol("PUSH_PROMISE, which this client disabled")),
                PING if flags & ACK == 0 => {
                    if payload.len() != 8 {
                        return Err(protocol("a PING that is not 8 bytes"));
                    }
                    self.pings += 1;
                    if self.pings > MAX_PINGS {
                        return Err(h2_error(
                            PROTOCOL_ERROR,
                            format!("more than {MAX_PINGS} PINGs in one call"),
                        ));
                    }
                    self.frame(PING, ACK, 0, &payload);
                    self.flush()?;
                }
                GOAWAY => {
                    let last = be32(&payload)? & 0x7fff_ffff;
                    if last < STREAM {
                        let code = payload.get(4..8).map_or(Ok(0), be32)?;
                        return Err(WireError::Reset("GOAWAY", code));
                    }
                }
                WINDOW_UPDATE => {
                    if payload.len() != 4 {
                        return Err(h2_error(
                            FRAME_SIZE_ERROR,
                            "a WINDOW_UPDATE that is not 4 bytes (RFC 9113 §6.9)",
                        ));
                    }
                    let increment = i64::from(be32(&payload)? & 0x7fff_ffff);
                    let window = match id {
                        0 => &mut self.conn_window,
                        STREAM => &mut self.stream_window,
                        _ => continue,
                    };
                    if increment == 0 {
                        return Err(h2_error(
                            PROTOCOL_ERROR,
                            "a WINDOW_UPDATE of 0 (RFC 9113 §6.9)",
                        ));
                    }
                    *window += increment;
                    if *window > MAX_WINDOW {
                        return Err(h2_error(
                            FLOW_CONTROL_ERROR,
                            format!(
                                "a WINDOW_UPDATE that opens the {} window past 2^31-1 (RFC 9113 §6.9.1)",
                                if id == 0 { "connection" } else { "stream" }
                            ),
                        ));
                    }
                    self.send_data()?;
                }
                CONTINUATION => return Err(protocol("a CONTINUATION without HEADERS")),
                // PRIORITY, an RST_STREAM for another stream, a PING ACK and frame types
                // this client does not know are ignored (RFC 9113 §5.5).
                _ => {}
            }
        }
    }

    /// Counts a DATA frame (its whole payload, padding included: RFC 9113 §6.9.1) against
    /// the receive windows.
    fn received(&mut self, len: usize) -> Result<(), WireError> {
        self.recv_window -= len as i64;
        if self.recv_window < 0 {
            return Err(h2_error(
                FLOW_CONTROL_ERROR,
                format!(
                    "DATA past the receive window this client gave ({} bytes in all; RFC 9113 §6.9.1)",
                    self.recv_granted
                ),
            ));
        }
        Ok(())
    }

    /// Once half the receive window is used, WINDOW_UPDATEs on the connection and the stream
    /// open it again, as far as [`RECEIVE_BUDGET`] allows.
    fn reopen_window(&mut self) -> Result<(), WireError> {
        let full = i64::from(RECEIVE_WINDOW);
        if self.recv_window > full / 2 {
            return Ok(());
        }
        let increment = (full - self.recv_window).min(RECEIVE_BUDGET - self.recv_granted);
        if increment <= 0 {
            return Ok(());
        }
        self.recv_window += increment;
        self.recv_granted += increment;
        let increment = (increment as u32).to_be_bytes();
        self.frame(WINDOW_UPDATE, 0, 0, &increment);
        self.frame(WINDOW_UPDATE, 0, STREAM, &increment);
        self.flush()
    }

    fn on_stream(&self, id: u32, frame: &str) -> Result<(), WireError> {
        if id == STREAM {
            Ok(())
        } else {
            Err(protocol(format!(
                "{frame} on stream {id}, which this client never opened"
            )))
        }
    }

    fn settings(&mut self, flags: u8, id: u32, payload: &[u8]) -> Result<(), WireError> {
        if id != 0 || !payload.len().is_multiple_of(6) {
            return Err(protocol("a malformed SETTINGS frame"));
        }
        if flags & ACK != 0 {
            return Ok(());
        }
        for entry in payload.chunks_exact(6) {
            let value = u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]);
            match u16::from_be_bytes([entry[0], entry[1]]) {
                SETTINGS_INITIAL_WINDOW_SIZE => {
                    if value > 0x7fff_ffff {
                        return Err(protocol("SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1"));
                    }
                    // §6.9.2: the change applies to the open stream's window, and one that
                    // pushes it past 2^31-1 is a FLOW_CONTROL_ERROR.
                    self.stream_window += i64::from(value) - INITIAL_WINDOW;
                    if self.stream_window > MAX_WINDOW {
                        return Err(h2_error(
                            FLOW_CONTROL_ERROR,
                            "SETTINGS_INITIAL_WINDOW_SIZE opens the stream window past 2^31-1 (RFC 9113 §6.9.2)",
                        ));
                    }
                }
                SETTINGS_MAX_FRAME_SIZE => {
                    if !(FRAME_SIZE as u32..=0xff_ffff).contains(&value) {
                        return Err(protocol("SETTINGS_MAX_FRAME_SIZE out of range"));
                    }
                    self.peer_frame = value as usize;
                }
                _ => {}
            }
        }
        self.frame(SETTINGS, ACK, 0, &[]);
        self.send_data()
    }

    /// A complete header block on the stream: the response headers, or the trailers.
    /// Returns the answer once the stream has ended.
    fn header_block(&mut self, block: &[u8], ends: bool) -> Result<Option<Answer>, WireError> {
        let fields = self
            .decoder
            .decode(block)
            .map_err(|e| protocol(e.to_string()))?;
        let get = |name: &str| {
            fields
                .iter()
                .find(|(n, _)| n == name.as_bytes())
                .map(|(_, v)| v.as_slice())
        };
        if !self.headers_seen {
            self.headers_seen = true;
            let status = get(":status").unwrap_or_default();
            if status != b"200" {
                return Err(protocol(format!(
                    "HTTP status {}",
                    String::from_utf8_lossy(status)
                )));
            }
            let content_type = get("content-type").unwrap_or_default();
            if !content_type.starts_with(b"application/grpc") {
                return Err(protocol(format!(
                    "content-type {:?}",
                    String::from_utf8_lossy(content_type)
                )));
            }
        } else if !ends {
            return Err(protocol(
                "a second header block that does not end the stream",
            ));
        }
        let Some(code) = get("grpc-status") else {
            return if ends {
                Err(protocol("the answer ended without a grpc-status"))
            } else {
                Ok(None)
            };
        };
        let code = std::str::from_utf8(code)
            .ok()
            .and_then(|c| c.parse::<i32>().ok())
            .ok_or_else(|| {
                protocol(format!(
                    "grpc-status {:?} is not a number",
                    String::from_utf8_lossy(code)
                ))
            })?;
        let message = percent_decode(get("grpc-message").unwrap_or_default());
        let details = get("grpc-status-details-bin")
            .and_then(base64_decode)
            .unwrap_or_default();
        let body = if code == 0 {
            message_of(&self.body)?
        } else {
            Vec::new()
        };
        Ok(Some(Answer {
            code,
            message,
            details,
            body,
        }))
    }
}

/// A frame as an error message names it.
fn frame_name(kind: u8, flags: u8) -> String {
    const NAMES: [&str; 10] = [
        "DATA",
        "HEADERS",
        "PRIORITY",
        "RST_STREAM",
        "SETTINGS",
        "PUSH_PROMISE",
        "PING",
        "GOAWAY",
        "WINDOW_UPDATE",
        "CONTINUATION",
    ];
    match NAMES.get(usize::from(kind)) {
        Some(&"SETTINGS") if flags & ACK != 0 => "a SETTINGS ACK".to_owned(),
        Some(name) => (*name).to_owned(),
        None => format!("a frame of type {kind:#x}"),
    }
}

fn check_block(block: &[u8]) -> Result<(), WireError> {
    if block.len() > hpack::MAX_HEADER_LIST + FRAME_SIZE {
        return Err(protocol("a header block over 80 KiB"));
    }
    Ok(())
}

/// The payload without its padding (§6.1), when the frame says it is padded.
fn unpad(payload: &[u8], flags: u8) -> Result<&[u8], WireError> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let (&pad, rest) = payload
        .split_first()
        .ok_or_else(|| protocol("a padded frame with no pad length"))?;
    rest.len()
        .checked_sub(usize::from(pad))
        .map(|end| &rest[..end])
        .ok_or_else(|| protocol("padding longer than the frame"))
}

fn be32(payload: &[u8]) -> Result<u32, WireError> {
    payload
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| protocol("a frame too short for its fields"))
}

/// The one message of a successful answer: a 5-byte prefix (uncompressed), then exactly
/// the length it says.
fn message_of(body: &[u8]) -> Result<Vec<u8>, WireError> {
    let Some((prefix, message)) = body.split_first_chunk::<5>() else {
        return Err(protocol("an OK answer without a message"));
    };
    if prefix[0] != 0 {
        return Err(protocol(
            "a compressed message, which this client did not ask for",
        ));
    }
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if len != message.len() {
        return Err(protocol(format!(
            "a message of {} bytes where the prefix says {len}",
            message.len()
        )));
    }
    Ok(message.to_vec())
}

/// `grpc-message` is percent-encoded (gRPC's HTTP/2 protocol spec); a malformed escape is
/// kept as it is, as gRPC's own clients do.
fn percent_decode(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            raw[i],
            raw.get(i + 1).copied().and_then(hex),
            raw.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Binary headers (`-bin`) are base64, padded or not.
fn base64_decode(raw: &[u8]) -> Option<Vec<u8>> {
    use base64::Engine as _;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const ENGINE: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    ENGINE.decode(raw).ok()
}

/// `google.rpc.Status`, as far as the shim reads it.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(message, repeated, tag = "3")]
    details: Vec<prost_types::Any>,
}

/// `google.rpc.ErrorInfo`, as far as the shim reads it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ErrorInfo {
    #[prost(string, tag = "1")]
    pub reason: String,
    #[prost(string, tag = "2")]
    pub domain: String,
}

const ERROR_INFO_TYPE: &str = "type.googleapis.com/google.rpc.ErrorInfo";

/// The first `ErrorInfo` among the details of an [`Answer`], if they decode.
pub fn error_info(details: &[u8]) -> Option<ErrorInfo> {
    use prost::Message as _;
    RpcStatus::decode(details)
        .ok()?
        .details
        .into_iter()
        .find(|any| any.type_url == ERROR_INFO_TYPE)
        .and_then(|any| ErrorInfo::decode(any.value.as_slice()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that has already said everything it will say: `input` is read, writes are kept.
    struct Scripted {
        input: io::Cursor<Vec<u8>>,
        written: Vec<u8>,
    }

    impl Read for Scripted {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Scripted {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.written.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn frame(kind: u8, flags: u8, id: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&id.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn block(fields: &[(&str, &str)]) -> Vec<u8> {
        let mut b = Vec::new();
        hpack::encode(fields, &mut b);
        b
    }

    fn ok_headers() -> Vec<u8> {
        frame(
            HEADERS,
            END_HEADERS,
            1,
            &block(&[(":status", "200"), ("content-type", "application/grpc")]),
        )
    }

    fn message(m: &[u8]) -> Vec<u8> {
        let mut d = vec![0];
        d.extend_from_slice(&(m.len() as u32).to_be_bytes());
        d.extend_from_slice(m);
        d
    }

    fn trailers(code: &str) -> Vec<u8> {
        frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &block(&[("grpc-status", code)]),
        )
    }

    /// The peer's script after its connection preface (an empty SETTINGS frame), unless the
    /// script starts with SETTINGS itself.
    fn call(frames: &[Vec<u8>]) -> (Result<Answer, WireError>, Vec<u8>) {
        if frames.first().is_some_and(|f| f[3] == SETTINGS) {
            call_raw(frames)
        } else {
            call_raw(&[&[frame(SETTINGS, 0, 0, &[])], frames].concat())
        }
    }

    /// The peer's script as it is.
    fn call_raw(frames: &[Vec<u8>]) -> (Result<Answer, WireError>, Vec<u8>) {
        let mut peer = Scripted {
            input: io::Cursor::new(frames.concat()),
            written: Vec::new(),
        };
        let r = unary(&mut peer, "/p.S/M", b"hello");
        (r, peer.written)
    }

    /// The frames a client wrote: (type, flags, stream, payload), after the preface.
    fn frames_of(written: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        assert!(written.starts_with(PREFACE));
        let mut rest = &written[PREFACE.len()..];
        let mut out = Vec::new();
        while !rest.is_empty() {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            let id = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
            out.push((rest[3], rest[4], id, rest[9..9 + len].to_vec()));
            rest = &rest[9 + len..];
        }
        out
    }

    #[test]
    fn an_ok_answer_with_settings_ping_and_split_headers() {
        let b = block(&[
            (":status", "200"),
            ("content-type", "application/grpc+proto"),
        ]);
        let (a, rest) = b.split_at(3);
        let (r, written) = call(&[
            frame(SETTINGS, 0, 0, &[0, 5, 0, 0, 0x80, 0]),
            frame(PING, 0, 0, b"12345678"),
            frame(HEADERS, PADDED, 1, &[&[2u8][..], a, &[0, 0]].concat()),
            frame(CONTINUATION, END_HEADERS, 1, rest),
            frame(DATA, 0, 1, &message(b"world")[..3]),
            frame(0x42, 0, 0, b"an unknown frame type is ignored"),
            frame(DATA, 0, 1, &message(b"world")[3..]),
            trailers("0"),
        ]);
        let r = r.unwrap();
        assert_eq!((r.code, r.body.as_slice()), (0, &b"world"[..]));
        let sent = frames_of(&written);
        let kinds: Vec<(u8, u8, u32)> = sent.iter().map(|f| (f.0, f.1, f.2)).collect();
        assert_eq!(
            kinds,
            [
                (SETTINGS, 0, 0),
                (WINDOW_UPDATE, 0, 0),
                (HEADERS, END_HEADERS, 1),
                (DATA, END_STREAM, 1),
                (SETTINGS, ACK, 0),
                (PING, ACK, 0),
            ]
        );
        assert_eq!(sent[3].3, message(b"hello"));
        assert_eq!(sent[5].3, b"12345678");
        let fields = hpack::Decoder::default().decode(&sent[2].3).unwrap();
        assert!(fields.contains(&(b":path".to_vec(), b"/p.S/M".to_vec())));
    }

    #[test]
    fn an_error_status_trailers_only_with_message_and_details() {
        let details = "CAUSEg==";
        let (r, _) = call(&[frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &block(&[
                (":status", "200"),
                ("content-type", "application/grpc"),
                ("grpc-status", "5"),
                ("grpc-message", "no %22eks%22%0a100%25 %zz"),
                ("grpc-status-details-bin", details),
            ]),
        )]);
        let r = r.unwrap();
        assert_eq!(r.code, 5);
        assert_eq!(r.message, "no \"eks\"\n100% %zz");
        assert_eq!(r.details, [0x08, 0x05, 0x12, 0x12]);
        assert!(r.body.is_empty());
    }

    #[test]
    fn what_is_not_a_grpc_answer_says_why() {
        let cases: Vec<(Vec<Vec<u8>>, &str)> = vec![
            (vec![], "closed"),
            (
                vec![frame(
                    HEADERS,
                    END_HEADERS,
                    1,
                    &block(&[(":status", "404")]),
                )],
                "HTTP status 404",
            ),
            (
                vec![frame(
                    HEADERS,
                    END_HEADERS,
                    1,
                    &block(&[(":status", "200"), ("content-type", "text/html")]),
                )],
                "content-type \"text/html\"",
            ),
            (
                vec![ok_headers(), frame(DATA, END_STREAM, 1, &message(b"x"))],
                "without a grpc-status",
            ),
            (
                vec![frame(DATA, 0, 1, b"x")],
                "DATA before the response headers",
            ),
            (vec![ok_headers(), frame(DATA, 0, 3, b"x")], "stream 3"),
            (
                vec![frame(0, 0, 1, &vec![0; FRAME_SIZE + 1])],
                "over the 16384",
            ),
            (vec![ok_headers(), trailers("abc")], "not a number"),
            (
                vec![
                    ok_headers(),
                    frame(DATA, 0, 1, &[1, 0, 0, 0, 1, 0]),
                    trailers("0"),
                ],
                "compressed",
            ),
            (
                vec![
                    ok_headers(),
                    frame(DATA, 0, 1, &[0, 0, 0, 0, 9, 0]),
                    trailers("0"),
                ],
                "prefix says 9",
            ),
            (vec![ok_headers(), trailers("0")], "without a message"),
            (
                vec![frame(PUSH_PROMISE, 0, 1, &[0, 0, 0, 2])],
                "PUSH_PROMISE",
            ),
            (
                vec![frame(CONTINUATION, END_HEADERS, 1, b"")],
                "CONTINUATION without HEADERS",
            ),
            (
                vec![frame(HEADERS, 0, 1, b""), frame(DATA, 0, 1, b"")],
                "without its CONTINUATION",
            ),
            (
                vec![frame(SETTINGS, 0, 0, &[0, 5, 0, 0, 0, 1])],
                "MAX_FRAME_SIZE",
            ),
            (
                vec![frame(HEADERS, PADDED | END_HEADERS, 1, &[9, 1])],
                "padding longer",
            ),
            (
                vec![frame(RST_STREAM, 0, 1, &[0, 0, 0, 8])],
                "RST_STREAM (CANCEL)",
            ),
            (
                vec![frame(GOAWAY, 0, 0, &[0, 0, 0, 0, 0, 0, 0, 11])],
                "GOAWAY (ENHANCE_YOUR_CALM)",
            ),
        ];
        for (frames, want) in cases {
            let (r, _) = call(&frames);
            let e = r.unwrap_err().to_string();
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
    }

    #[test]
    fn a_goaway_that_keeps_the_call_lets_it_finish() {
        let (r, _) = call(&[
            ok_headers(),
            frame(GOAWAY, 0, 0, &[0, 0, 0, 1, 0, 0, 0, 0]),
            frame(DATA, 0, 1, &message(b"m")),
            trailers("0"),
        ]);
        assert_eq!(r.unwrap().body, b"m");
    }

    #[test]
    fn answers_are_bounded() {
        // Over MAX_ANSWER_BYTES of DATA in frames of the allowed size.
        let chunk = frame(DATA, 0, 1, &vec![0; FRAME_SIZE]);
        let mut frames = vec![ok_headers()];
        frames.extend(std::iter::repeat_n(
            chunk,
            MAX_ANSWER_BYTES / FRAME_SIZE + 1,
        ));
        let (r, _) = call(&frames);
        assert!(r.unwrap_err().to_string().contains("an answer over"));
        // A header block that never ends, in CONTINUATIONs.
        let mut frames = vec![frame(HEADERS, 0, 1, b"")];
        frames.extend(std::iter::repeat_n(
            frame(CONTINUATION, 0, 1, &vec![0x82; FRAME_SIZE]),
            10,
        ));
        let (r, _) = call(&frames);
        assert!(r.unwrap_err().to_string().contains("header block over"));
    }

    /// A request larger than HTTP/2's initial window waits for WINDOW_UPDATEs and is sent
    /// in frames no larger than the peer allows.
    #[test]
    fn a_large_request_follows_flow_control() {
        let big = vec![7u8; 100_000];
        let mut peer = Scripted {
            input: io::Cursor::new(
                [
                    frame(SETTINGS, 0, 0, &[]),
                    frame(WINDOW_UPDATE, 0, 0, &40_000u32.to_be_bytes()),
                    frame(SETTINGS, 0, 0, &[0, 4, 0, 2, 0, 0]),
                    ok_headers(),
                    frame(DATA, 0, 1, &message(b"ok")),
                    trailers("0"),
                ]
                .concat(),
            ),
            written: Vec::new(),
        };
        let r = unary(&mut peer, "/p.S/M", &big).unwrap();
        assert_eq!(r.body, b"ok");
        let data: Vec<(u8, Vec<u8>)> = frames_of(&peer.written)
            .into_iter()
            .filter(|f| f.0 == DATA)
            .map(|f| (f.1, f.3))
            .collect();
        assert!(data.iter().all(|(_, d)| d.len() <= FRAME_SIZE));
        assert_eq!(data.iter().filter(|(f, _)| f & END_STREAM != 0).count(), 1);
        assert_eq!(data.concat_payload(), message(&big));
    }

    trait Concat {
        fn concat_payload(&self) -> Vec<u8>;
    }
    impl Concat for Vec<(u8, Vec<u8>)> {
        fn concat_payload(&self) -> Vec<u8> {
            self.iter().flat_map(|(_, d)| d.iter().copied()).collect()
        }
    }

    /// RFC 9113's connection errors, each refused with its code (they ran to an answer, or
    /// to the end of the script, before).
    #[test]
    fn what_http2_forbids_is_refused_with_its_error_code() {
        let window_update =
            |id: u32, increment: u32| frame(WINDOW_UPDATE, 0, id, &increment.to_be_bytes());
        let cases: Vec<(Vec<Vec<u8>>, &str)> = vec![
            // §3.4: the server's preface is a SETTINGS frame.
            (
                vec![
                    ok_headers(),
                    frame(DATA, 0, 1, &message(b"m")),
                    trailers("0"),
                ],
                "(PROTOCOL_ERROR): its first frame is HEADERS, not SETTINGS",
            ),
            (
                vec![frame(PING, 0, 0, b"12345678"), ok_headers(), trailers("0")],
                "its first frame is PING",
            ),
            (
                vec![frame(SETTINGS, ACK, 0, &[]), ok_headers(), trailers("0")],
                "its first frame is a SETTINGS ACK",
            ),
            // §6.9: an increment of 0, on the connection or the stream.
            (
                vec![
                    frame(SETTINGS, 0, 0, &[]),
                    window_update(0, 0),
                    ok_headers(),
                    trailers("0"),
                ],
                "(PROTOCOL_ERROR): a WINDOW_UPDATE of 0",
            ),
            (
                vec![
                    frame(SETTINGS, 0, 0, &[]),
                    window_update(1, 0),
                    ok_headers(),
                    trailers("0"),
                ],
                "(PROTOCOL_ERROR): a WINDOW_UPDATE of 0",
            ),
            (
                vec![
                    frame(SETTINGS, 0, 0, &[]),
                    frame(WINDOW_UPDATE, 0, 0, &[0, 0, 1]),
                ],
                "(FRAME_SIZE_ERROR): a WINDOW_UPDATE that is not 4 bytes",
            ),
            // §6.9.1: a window past 2^31-1 (65 535 + 2^31-1, or two steps to it).
            (
                vec![
                    frame(SETTINGS, 0, 0, &[]),
                    window_update(0, 0x7fff_ffff),
                    ok_headers(),
                    trailers("0"),
                ],
                "(FLOW_CONTROL_ERROR): a WINDOW_UPDATE that opens the connection window past 2^31-1",
            ),
            (
                vec![
                    frame(SETTINGS, 0, 0, &[]),
                    window_update(1, 0x7fff_0000),
                    window_update(1, 0x7fff_0000),
                ],
                "opens the stream window past 2^31-1",
            ),
            // §6.9.2: SETTINGS_INITIAL_WINDOW_SIZE pushing the open stream's window over.
            (
                vec![
                    frame(SETTINGS, 0, 0, &[]),
                    window_update(1, 0x7fff_0000),
                    frame(SETTINGS, 0, 0, &[0, 4, 0x7f, 0xff, 0xff, 0xff]),
                ],
                "(FLOW_CONTROL_ERROR): SETTINGS_INITIAL_WINDOW_SIZE opens the stream window",
            ),
        ];
        for (frames, want) in cases {
            let (r, _) = call_raw(&frames);
            let e = r.unwrap_err();
            assert!(matches!(e, WireError::Connection(..)), "{want:?}: {e:?}");
            let e = e.to_string();
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
    }

    /// A peer answering PINGs forever is stopped after [`MAX_PINGS`], not at the deadline.
    #[test]
    fn pings_answered_are_bounded() {
        let mut frames = vec![frame(SETTINGS, 0, 0, &[])];
        frames.extend(std::iter::repeat_n(
            frame(PING, 0, 0, b"12345678"),
            MAX_PINGS,
        ));
        frames.extend([
            ok_headers(),
            frame(DATA, 0, 1, &message(b"m")),
            trailers("0"),
        ]);
        let (r, written) = call_raw(&frames);
        assert_eq!(r.unwrap().body, b"m", "{MAX_PINGS} PINGs are answered");
        let acks = frames_of(&written)
            .iter()
            .filter(|f| (f.0, f.1) == (PING, ACK))
            .count();
        assert_eq!(acks, MAX_PINGS);
        frames.insert(1, frame(PING, 0, 0, b"one more"));
        let (r, written) = call_raw(&frames);
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains("(PROTOCOL_ERROR): more than 128 PINGs in one call"),
            "{e}"
        );
        let acks = frames_of(&written)
            .iter()
            .filter(|f| (f.0, f.1) == (PING, ACK))
            .count();
        assert_eq!(acks, MAX_PINGS);
    }

    /// The answer's DATA is counted against the receive windows, which are reopened as it
    /// is read; a peer sending past them is refused (RFC 9113 §6.9.1).
    #[test]
    fn received_data_follows_flow_control() {
        // A 3 MiB answer: WINDOW_UPDATEs on the connection and the stream reopen the 1 MiB
        // windows as it is read.
        let big = vec![b'x'; 3 << 20];
        let framed = message(&big);
        let mut frames = vec![ok_headers()];
        frames.extend(framed.chunks(FRAME_SIZE).map(|c| frame(DATA, 0, 1, c)));
        frames.push(trailers("0"));
        let (r, written) = call(&frames);
        assert_eq!(r.unwrap().body.len(), big.len());
        let updates: Vec<(u32, u32)> = frames_of(&written)
            .into_iter()
            .filter(|f| f.0 == WINDOW_UPDATE)
            .map(|f| (f.2, be32(&f.3).unwrap()))
            .collect();
        // The first opens the connection's window to RECEIVE_WINDOW with the preface.
        assert_eq!(updates[0], (0, RECEIVE_WINDOW - INITIAL_WINDOW as u32));
        let on = |id: u32| -> u64 {
            updates[1..]
                .iter()
                .filter(|u| u.0 == id)
                .map(|u| u64::from(u.1))
                .sum()
        };
        let granted = u64::from(RECEIVE_WINDOW) + on(0);
        assert!(granted >= framed.len() as u64, "{granted}");
        assert_eq!(on(0), on(1), "the connection and the stream move together");
        assert!(
            granted <= RECEIVE_BUDGET as u64,
            "{granted} > {RECEIVE_BUDGET}"
        );

        // Padding counts too: DATA of nothing but padding, past everything this client
        // ever grants, is a FLOW_CONTROL_ERROR (it ran to the end of the script before).
        let mut padded = vec![255u8];
        padded.resize(FRAME_SIZE, 0);
        let mut frames = vec![ok_headers()];
        frames.extend(std::iter::repeat_n(
            frame(DATA, PADDED, 1, &padded[..256]),
            RECEIVE_BUDGET as usize / 256 + 1,
        ));
        frames.push(trailers("0"));
        let (r, _) = call(&frames);
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains("(FLOW_CONTROL_ERROR): DATA past the receive window"),
            "{e}"
        );
    }

    #[test]
    fn error_info_is_read_from_the_details() {
        use prost::Message as _;
        let info = ErrorInfo {
            reason: "UNKNOWN_PROVIDER".into(),
            domain: "credbroker.dev".into(),
        };
        let status = RpcStatus {
            details: vec![
                prost_types::Any {
                    type_url: "type.googleapis.com/google.rpc.DebugInfo".into(),
                    value: vec![1, 2, 3],
                },
                prost_types::Any {
                    type_url: ERROR_INFO_TYPE.into(),
                    value: info.encode_to_vec(),
                },
            ],
        };
        assert_eq!(error_info(&status.encode_to_vec()), Some(info));
        assert_eq!(error_info(b"\xff\xff"), None);
        assert_eq!(error_info(b""), None);
    }
}
