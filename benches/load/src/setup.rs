//! Blocking connection setup per protocol, before the measured event loop takes over: connect,
//! handshake, subscribe or register. Every wait has a deadline; every failure is a message.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::{nats, resp, ws};

/// How long one connection's setup may take.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A connected, set-up socket and any bytes read past the setup replies.
pub struct Ready {
    pub stream: TcpStream,
    pub leftover: Vec<u8>,
    /// axhost receivers: the registered service id.
    pub service_id: Option<String>,
}

struct Blocking {
    stream: TcpStream,
    buf: Vec<u8>,
    deadline: Instant,
    what: String,
}

impl Blocking {
    fn connect(addr: SocketAddr, what: String) -> Result<Blocking, String> {
        let stream = TcpStream::connect_timeout(&addr, SETUP_TIMEOUT)
            .map_err(|e| format!("{what}: cannot connect to {addr}: {e}"))?;
        stream
            .set_nodelay(true)
            .map_err(|e| format!("{what}: set TCP_NODELAY: {e}"))?;
        Ok(Blocking {
            stream,
            buf: Vec::with_capacity(8192),
            deadline: Instant::now() + SETUP_TIMEOUT,
            what,
        })
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.stream
            .write_all(bytes)
            .map_err(|e| format!("{}: write: {e}", self.what))
    }

    /// Reads at least one more byte into `buf`, or fails at the deadline or on close.
    fn read_more(&mut self) -> Result<(), String> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("{}: timed out during setup", self.what));
        }
        self.stream
            .set_read_timeout(Some(left))
            .map_err(|e| format!("{}: {e}", self.what))?;
        if self.buf.len() > 1 << 20 {
            return Err(format!(
                "{}: over 1 MiB of unexpected setup data",
                self.what
            ));
        }
        let mut chunk = [0u8; 8192];
        match self.stream.read(&mut chunk) {
            Ok(0) => Err(format!(
                "{}: server closed the connection during setup",
                self.what
            )),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                Err(format!("{}: timed out during setup", self.what))
            }
            Err(e) => Err(format!("{}: read: {e}", self.what)),
        }
    }

    fn done(self, service_id: Option<String>) -> Result<Ready, String> {
        self.stream
            .set_read_timeout(None)
            .map_err(|e| format!("{}: {e}", self.what))?;
        Ok(Ready {
            stream: self.stream,
            leftover: self.buf,
            service_id,
        })
    }
}

fn short(text: &[u8]) -> String {
    let s = String::from_utf8_lossy(text);
    s.chars().take(300).collect()
}

/// An upgraded, initialized axhost connection still in blocking setup: requests go one at a
/// time, each waiting for its reply.
pub struct Ahp {
    c: Blocking,
    /// The text of the `initialize` response.
    init: String,
}

impl Ahp {
    /// Upgrades with the bearer `token` and sends `initialize` as `client_id` (request id 1,
    /// no initial subscriptions).
    pub fn connect(
        addr: SocketAddr,
        path: &str,
        token: &str,
        what: String,
        client_id: &str,
        rng: &mut ws::Rng,
    ) -> Result<Ahp, String> {
        let mut c = Blocking::connect(addr, what)?;
        c.send(ws::upgrade_request(&addr.to_string(), path, token).as_bytes())?;
        loop {
            match ws::upgrade_response(&c.buf) {
                Ok(Some(n)) => {
                    c.buf.drain(..n);
                    break;
                }
                Ok(None) => c.read_more()?,
                Err(e) => return Err(format!("{}: {e}", c.what)),
            }
        }
        let init = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{{\"channel\":\"ahp-root://\",\
             \"protocolVersions\":[\"0.9.0\"],\"clientId\":\"{client_id}\",\"initialSubscriptions\":[]}}}}"
        );
        let init = ws_call(&mut c, rng, &init, 1)?;
        Ok(Ahp { c, init })
    }

    /// The text of the `initialize` response (its `result` holds the host's `_meta`).
    pub fn initialize_reply(&self) -> &str {
        &self.init
    }

    /// Sends the request `text`, whose id is `id`, and returns the text of its successful
    /// response; an error response is an error. Other frames in between are skipped.
    pub fn call(&mut self, rng: &mut ws::Rng, text: &str, id: u32) -> Result<String, String> {
        ws_call(&mut self.c, rng, text, id)
    }

    /// `client/registerService` (request id `id`) with `{"name": name}` as metadata; returns
    /// the new service id.
    pub fn register_service(
        &mut self,
        rng: &mut ws::Rng,
        name: &str,
        id: u32,
    ) -> Result<String, String> {
        let reg = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"client/registerService\",\"params\":{{\
             \"channel\":\"x-client-services://\",\"metadata\":{{\"name\":\"{name}\"}}}}}}"
        );
        let reply = self.call(rng, &reg, id)?;
        let key = "\"serviceId\":\"";
        reply
            .find(key)
            .map(|at| &reply[at + key.len()..])
            .and_then(|rest| rest.find('"').map(|end| rest[..end].to_owned()))
            .ok_or_else(|| {
                format!(
                    "{}: registerService reply without serviceId: {reply}",
                    self.c.what
                )
            })
    }

    /// Ends setup: the socket (read timeout cleared) and whatever was read past the last reply.
    pub fn done(self, service_id: Option<String>) -> Result<Ready, String> {
        self.c.done(service_id)
    }
}

/// axhost: upgrade, `initialize`, and for a receiver `client/registerService`.
pub fn axhost(
    addr: SocketAddr,
    path: &str,
    token: &str,
    what: String,
    client_id: &str,
    register: bool,
    rng: &mut ws::Rng,
) -> Result<Ready, String> {
    let mut c = Ahp::connect(addr, path, token, what, client_id, rng)?;
    let service_id = if register {
        Some(c.register_service(rng, client_id, 2)?)
    } else {
        None
    };
    c.done(service_id)
}

/// Sends one request and returns the text of the response with `id` (other frames skipped).
fn ws_call(c: &mut Blocking, rng: &mut ws::Rng, text: &str, id: u32) -> Result<String, String> {
    let mut out = Vec::new();
    ws::encode(
        &mut out,
        ws::OP_TEXT,
        text.as_bytes(),
        rng.next_u32().to_ne_bytes(),
    );
    c.send(&out)?;
    let want = format!("\"id\":{id},");
    let want_end = format!("\"id\":{id}}}");
    loop {
        let frame = ws::parse(&mut c.buf).map_err(|e| format!("{}: {e}", c.what))?;
        let Some(f) = frame else {
            c.read_more()?;
            continue;
        };
        let body = c.buf[f.start..f.end].to_vec();
        c.buf.drain(..f.end);
        match f.opcode {
            ws::OP_TEXT => {
                let s = String::from_utf8_lossy(&body).into_owned();
                let is_reply = (s.contains(&want) || s.contains(&want_end))
                    && (s.contains("\"result\"") || s.contains("\"error\""));
                if !is_reply {
                    continue;
                }
                if s.contains("\"error\"") {
                    return Err(format!("{}: request {id} failed: {}", c.what, short(&body)));
                }
                return Ok(s);
            }
            ws::OP_PING => {
                let mut pong = Vec::new();
                ws::encode(&mut pong, ws::OP_PONG, &body, rng.next_u32().to_ne_bytes());
                c.send(&pong)?;
            }
            ws::OP_CLOSE => {
                let code = body.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]]));
                return Err(format!(
                    "{}: server closed the WebSocket during setup (code {code:?}, reason {:?})",
                    c.what,
                    short(body.get(2..).unwrap_or(&[]))
                ));
            }
            _ => {}
        }
    }
}

/// Redis: receivers SUBSCRIBE to their channel, senders PING; both wait for the reply.
pub fn redis(addr: SocketAddr, what: String, subscribe: Option<&str>) -> Result<Ready, String> {
    let mut c = Blocking::connect(addr, what)?;
    match subscribe {
        Some(ch) => {
            c.send(format!("*2\r\n$9\r\nSUBSCRIBE\r\n${}\r\n{ch}\r\n", ch.len()).as_bytes())?
        }
        None => c.send(b"*1\r\n$4\r\nPING\r\n")?,
    }
    loop {
        match resp::parse(&c.buf).map_err(|e| format!("{}: {e}", c.what))? {
            None => c.read_more()?,
            Some((resp::Item::Error(s, e), _)) => {
                return Err(format!("{}: redis error: {}", c.what, short(&c.buf[s..e])));
            }
            Some((item, used)) => {
                c.buf.drain(..used);
                let done = matches!(
                    (subscribe.is_some(), item),
                    (true, resp::Item::Subscribed) | (false, resp::Item::Simple)
                );
                if done {
                    return c.done(None);
                }
            }
        }
    }
}

/// NATS: wait for INFO, CONNECT (+ SUB for receivers), PING, wait for PONG.
pub fn nats(addr: SocketAddr, what: String, subscribe: Option<&str>) -> Result<Ready, String> {
    let mut c = Blocking::connect(addr, what)?;
    let mut connected = false;
    loop {
        match nats::parse(&c.buf).map_err(|e| format!("{}: {e}", c.what))? {
            None => c.read_more()?,
            Some((nats::Item::Err(s, e), _)) => {
                return Err(format!("{}: nats error: {}", c.what, short(&c.buf[s..e])));
            }
            Some((item, used)) => {
                c.buf.drain(..used);
                match item {
                    nats::Item::Info if !connected => {
                        connected = true;
                        let mut hello = String::from(
                            "CONNECT {\"verbose\":false,\"pedantic\":false,\"name\":\"axhost-load\"}\r\n",
                        );
                        if let Some(s) = subscribe {
                            hello.push_str(&format!("SUB {s} 1\r\n"));
                        }
                        hello.push_str("PING\r\n");
                        c.send(hello.as_bytes())?;
                    }
                    nats::Item::Ping => c.send(b"PONG\r\n")?,
                    nats::Item::Pong if connected => return c.done(None),
                    _ => {}
                }
            }
        }
    }
}
