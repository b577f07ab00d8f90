//! The intake bench's load generator: HTTP/1.1 over one kept-alive connection a client, each
//! request's bytes built before the clock starts. pgbench, the reference, is a C client that
//! costs its machine little; a general HTTP client (reqwest: a header map, a pool checkout and a
//! response decoder a request) took about a seventh of the two cores the server and PostgreSQL
//! share. The requests are the same: every one is answered and its status and body are checked.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A request's bytes: a POST of `body` to `path` with `headers`.
pub fn post(host: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut req = format!("POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n");
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// One client's connection.
pub struct Conn {
    addr: String,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
}

impl Conn {
    pub fn new(addr: &str) -> Conn {
        Conn { addr: addr.to_string(), stream: None, buf: Vec::with_capacity(1024) }
    }

    /// Sends `request` and reads its answer: the status and the body. A connection the server
    /// closed between two requests is opened again once.
    pub async fn send(&mut self, request: &[u8]) -> std::io::Result<(u16, &[u8])> {
        let fresh = self.stream.is_none();
        let (status, at) = match self.exchange(request).await {
            Err(_) if !fresh => {
                self.stream = None;
                self.exchange(request).await?
            }
            answer => answer?,
        };
        Ok((status, &self.buf[at..]))
    }

    /// Returns the status and where the body starts in `buf`.
    async fn exchange(&mut self, request: &[u8]) -> std::io::Result<(u16, usize)> {
        if self.stream.is_none() {
            let s = TcpStream::connect(&self.addr).await?;
            s.set_nodelay(true)?;
            self.stream = Some(s);
        }
        let stream = self.stream.as_mut().expect("connected above");
        stream.write_all(request).await?;
        self.buf.clear();
        let (status, head_end, length) = loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                let (status, length) = head(&self.buf[..end])?;
                break (status, end + 4, length);
            }
            read_more(stream, &mut self.buf).await?;
        };
        while self.buf.len() < head_end + length {
            read_more(stream, &mut self.buf).await?;
        }
        if self.buf.len() != head_end + length {
            return Err(bad("more bytes than the answer's content-length"));
        }
        Ok((status, head_end))
    }
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<()> {
    if stream.read_buf(buf).await? == 0 {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the server closed the connection"));
    }
    Ok(())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// The status and content-length of an answer's head (an answer without a length is refused:
/// the intake's are JSON with one).
fn head(head: &[u8]) -> std::io::Result<(u16, usize)> {
    let text = std::str::from_utf8(head).map_err(|_| bad("a head that is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.strip_prefix("HTTP/1.1 "))
        .and_then(|l| l.get(..3))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no HTTP/1.1 status line"))?;
    let length = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .ok_or_else(|| bad("an answer without content-length"))?;
    Ok((status, length))
}
