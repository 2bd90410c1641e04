//! Headless Chromium driven over the DevTools protocol: a minimal WebSocket client (RFC 6455:
//! masked text frames out, unmasked frames in), `Runtime.evaluate` and `Page.captureScreenshot`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A Chromium process showing one page, and a DevTools connection to that page.
pub struct Browser {
    child: Child,
    socket: TcpStream,
    next_id: u64,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Chromium binary, if installed.
pub fn chromium() -> Option<String> {
    ["chromium", "chromium-browser"].into_iter().find_map(|name| {
        let out = Command::new("sh").arg("-c").arg(format!("command -v {name}")).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    })
}

/// A GET to the DevTools HTTP server, which keeps connections open: the body is read by its
/// Content-Length.
fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to DevTools");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").expect("request");
    let mut reader = BufReader::new(s);
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).expect("DevTools answer");
    String::from_utf8_lossy(&body).into_owned()
}

impl Browser {
    /// Starts headless Chromium on `url` with its profile in `profile`.
    pub fn open(binary: &str, url: &str, profile: &Path) -> Browser {
        let mut child = Command::new(binary)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--window-size=1400,1100",
                "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start chromium");
        let stderr = child.stderr.take().expect("chromium stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(ws) = line.strip_prefix("DevTools listening on ") {
                    let _ = tx.send(ws.to_string());
                }
            }
        });
        let ws = rx.recv_timeout(Duration::from_secs(20)).expect("chromium prints its DevTools address");
        let addr = ws.trim_start_matches("ws://").split('/').next().expect("host:port").to_string();
        // The page target of the URL given on the command line.
        let deadline = Instant::now() + Duration::from_secs(10);
        let page_ws = loop {
            let list: Value = serde_json::from_str(&http_get(&addr, "/json/list")).unwrap_or(Value::Null);
            let page = list.as_array().into_iter().flatten().find(|t| t["type"] == "page");
            if let Some(ws) = page.and_then(|p| p["webSocketDebuggerUrl"].as_str()) {
                break ws.to_string();
            }
            assert!(Instant::now() < deadline, "chromium shows no page target: {list}");
            std::thread::sleep(Duration::from_millis(100));
        };
        let path = format!("/{}", page_ws.trim_start_matches("ws://").split_once('/').expect("path").1);
        let mut socket = TcpStream::connect(&addr).expect("connect to the page target");
        socket.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
        write!(
            socket,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .expect("handshake");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            socket.read_exact(&mut byte).expect("handshake answer");
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "no WebSocket upgrade: {head}");
        Browser { child, socket, next_id: 1 }
    }

    fn send_text(&mut self, text: &str) {
        let payload = text.as_bytes();
        let mut frame = vec![0x81u8];
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n <= 0xffff => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask = [0x37u8, 0xfa, 0x21, 0x3d];
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.socket.write_all(&frame).expect("send to chromium");
    }

    fn read_message(&mut self) -> String {
        let mut message = Vec::new();
        loop {
            let mut head = [0u8; 2];
            self.socket.read_exact(&mut head).expect("frame from chromium");
            let len = match head[1] & 0x7f {
                126 => {
                    let mut b = [0u8; 2];
                    self.socket.read_exact(&mut b).expect("length");
                    u64::from(u16::from_be_bytes(b))
                }
                127 => {
                    let mut b = [0u8; 8];
                    self.socket.read_exact(&mut b).expect("length");
                    u64::from_be_bytes(b)
                }
                n => u64::from(n),
            };
            let mut payload = vec![0u8; len as usize];
            self.socket.read_exact(&mut payload).expect("payload");
            if head[0] & 0x0f == 0x8 {
                panic!("chromium closed the DevTools connection");
            }
            message.extend_from_slice(&payload);
            if head[0] & 0x80 != 0 {
                return String::from_utf8_lossy(&message).into_owned();
            }
        }
    }

    /// Sends a command and returns its `result`, skipping the events in between.
    pub fn command(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send_text(&json!({ "id": id, "method": method, "params": params }).to_string());
        loop {
            let message: Value = serde_json::from_str(&self.read_message()).expect("DevTools JSON");
            if message["id"] == id {
                assert!(message.get("error").is_none(), "{method} failed: {message}");
                return message["result"].clone();
            }
        }
    }

    /// Evaluates `expression` in the page (awaiting a promise) and returns its value.
    pub fn eval(&mut self, expression: &str) -> Value {
        let result = self.command(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        );
        assert!(result.get("exceptionDetails").is_none(), "{expression} threw: {result}");
        result["result"]["value"].clone()
    }

    /// Evaluates `expression` until it is true, at most `limit`; returns whether it became true.
    pub fn wait_for(&mut self, expression: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.eval(expression) == Value::Bool(true) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    }

    /// A PNG of the page as it is.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let result = self.command("Page.captureScreenshot", json!({ "format": "png" }));
        base64(result["data"].as_str().expect("screenshot data"))
    }
}

/// Decodes standard base64 (what DevTools sends binary data as).
fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = text.bytes().filter(|c| *c != b'=').map(value).collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, v)| acc | u32::from(*v) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

#[test]
fn base64_decodes_padded_and_unpadded_ends() {
    assert_eq!(base64("aGVsbG8="), b"hello");
    assert_eq!(base64("aGk="), b"hi");
    assert_eq!(base64("YWJj"), b"abc");
}
