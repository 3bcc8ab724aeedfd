//! Real servers on loopback ports for the remote-model tests: nginx serving a directory
//! (HTTP with ranges, ETags and If-Match), moto's S3 server, and a fault-injecting HTTP
//! proxy in front of nginx (errors, stalls, truncated or oversized bodies, ignored ranges,
//! redirect loops, rewritten ETags). Each stops when dropped.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A port free on 127.0.0.1 now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until something accepts connections on `port`.
fn wait_for(port: u16, child: &mut Child, what: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        if let Ok(Some(status)) = child.try_wait() {
            eprintln!("{what} exited: {status}");
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn nginx_binary() -> PathBuf {
    for p in ["/usr/sbin/nginx", "/usr/bin/nginx"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    panic!("nginx is not installed: the remote-model tests serve files with it (`apt-get install nginx`; .ci/run installs it)");
}

/// nginx serving the files of its own directory `root` on a loopback port, logging each
/// request's method, status, body bytes and Range header.
pub struct Nginx {
    pub port: u16,
    pub root: PathBuf,
    dir: tempfile::TempDir,
    child: Child,
}

impl Nginx {
    pub fn start() -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(dir.path().join("tmp")).unwrap();
        for _ in 0..5 {
            let port = free_port();
            let d = dir.path().display();
            let conf = format!(
                "daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log;
events {{ worker_connections 512; }}
http {{
  log_format ranges '$request_method $uri $status $body_bytes_sent \"$http_range\"';
  access_log {d}/access.log ranges;
  client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;
  uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;
  server {{ listen 127.0.0.1:{port}; root {}; }}
}}
",
                root.display()
            );
            let path = dir.path().join("nginx.conf");
            std::fs::write(&path, conf).unwrap();
            let mut child = Command::new(nginx_binary())
                .arg("-c")
                .arg(&path)
                .arg("-p")
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            if wait_for(port, &mut child, "nginx") {
                return Nginx {
                    port,
                    root,
                    dir,
                    child,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!(
            "nginx did not start: {}",
            self_log(&dir.path().join("error.log"))
        );
    }

    /// Serves `src` as `name`.
    pub fn add(&self, name: &str, src: &Path) {
        std::fs::copy(src, self.root.join(name)).unwrap();
    }

    pub fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/{name}", self.port)
    }

    /// The access log's lines so far: `METHOD /name STATUS BYTES "RANGE"`.
    pub fn log(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("access.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Empties the access log.
    pub fn clear_log(&self) {
        let _ = std::fs::write(self.dir.path().join("access.log"), "");
    }

    /// Requests of `name` in the log, and the body bytes they sent.
    pub fn served(&self, name: &str) -> (usize, u64) {
        let uri = format!(" /{name} ");
        let lines: Vec<_> = self
            .log()
            .into_iter()
            .filter(|l| l.contains(&uri))
            .collect();
        let bytes = lines
            .iter()
            .filter_map(|l| l.split(' ').nth(3)?.parse::<u64>().ok())
            .sum();
        (lines.len(), bytes)
    }
}

fn self_log(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// moto's S3 server on a loopback port, with the environment that points ptefs at it.
pub struct S3 {
    pub port: u16,
    child: Child,
}

/// The secret key the tests give the S3 client: it must show nowhere.
pub const S3_SECRET: &str = "ptefsTestSecretKey0123456789abcdefSECRET";

impl S3 {
    pub fn start() -> S3 {
        let python = super::mount::python();
        for _ in 0..5 {
            let port = free_port();
            let mut child = Command::new(python)
                .args(["-m", "moto.server", "-H", "127.0.0.1", "-p"])
                .arg(port.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("{python} -m moto.server: {e}"));
            if wait_for(port, &mut child, "moto.server") {
                return S3 { port, child };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("moto's S3 server did not start: the remote-model tests need `pip install 'moto[server]'` (.ci/run installs it)");
    }

    fn request(&self, method: &str, path: &str, body: &[u8]) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.port,
            body.len()
        )
        .unwrap();
        s.write_all(body).unwrap();
        let mut out = String::new();
        let _ = BufReader::new(s).read_to_string(&mut out);
        let status = out.lines().next().unwrap_or_default().to_string();
        assert!(status.contains(" 200"), "{method} {path}: {status}");
        status
    }

    /// Creates `bucket` (path-style, unsigned: moto accepts it).
    pub fn bucket(&self, bucket: &str) {
        self.request("PUT", &format!("/{bucket}"), b"");
    }

    pub fn put(&self, bucket: &str, key: &str, bytes: &[u8]) {
        self.request("PUT", &format!("/{bucket}/{key}"), bytes);
    }

    /// The environment that makes ptefs read this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", self.port),
            ),
            ("AWS_ACCESS_KEY_ID", "AKIDPTEFSTEST".to_string()),
            ("AWS_SECRET_ACCESS_KEY", S3_SECRET.to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
        ]
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the proxy does to the requests it forwards.
#[derive(Debug, Default, Clone)]
pub struct Faults {
    /// The next N requests are answered 503.
    pub fail_next: u32,
    /// Every request is answered 503.
    pub fail_all: bool,
    /// GETs whose range starts inside this range wait this long before being answered.
    pub stall: Option<(std::ops::Range<u64>, Duration)>,
    /// The next N ranged GETs send their headers and half their body, then close.
    pub truncate_next: u32,
    /// Every ranged GET is truncated so.
    pub truncate_all: bool,
    /// Ranges are dropped: the server answers 200 with the whole object.
    pub ignore_range: bool,
    /// Every request is redirected to itself.
    pub redirect_loop: bool,
    /// Answers claim a Content-Length of this many bytes (and send the real body).
    pub content_length: Option<u64>,
    /// Answers carry this many bytes more than their Content-Range says.
    pub extra_bytes: usize,
    /// Answers carry this ETag instead of the server's (a server that ignores If-Match).
    pub etag: Option<String>,
}

/// An HTTP proxy in front of `upstream` (a loopback port) that injects `faults`, counting
/// the requests it answered and the body bytes it sent.
pub struct Proxy {
    pub port: u16,
    pub faults: Arc<Mutex<Faults>>,
    pub requests: Arc<AtomicU64>,
    pub bytes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let p = Proxy {
            port,
            faults: Arc::default(),
            requests: Arc::default(),
            bytes: Arc::default(),
            stop: Arc::default(),
        };
        let (faults, requests, bytes, stop) = (
            p.faults.clone(),
            p.requests.clone(),
            p.bytes.clone(),
            p.stop.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (faults, requests, bytes, stop) = (
                            faults.clone(),
                            requests.clone(),
                            bytes.clone(),
                            stop.clone(),
                        );
                        std::thread::spawn(move || {
                            let _ = conn.set_nonblocking(false);
                            let _ = serve(conn, upstream, port, &faults, &requests, &bytes, &stop);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        p
    }

    pub fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/{name}", self.port)
    }

    pub fn set(&self, f: Faults) {
        *self.faults.lock().unwrap() = f;
    }

    pub fn counts(&self) -> (u64, u64) {
        (
            self.requests.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The head of an HTTP message: its first line and its headers.
fn read_head(r: &mut impl BufRead) -> Option<(String, Vec<(String, String)>)> {
    let mut first = String::new();
    if r.read_line(&mut first).ok()? == 0 {
        return None;
    }
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':')?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    Some((first.trim_end().to_string(), headers))
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

#[allow(clippy::too_many_arguments)]
fn serve(
    conn: TcpStream, upstream: u16, port: u16, faults: &Mutex<Faults>, requests: &AtomicU64,
    bytes: &AtomicU64, stop: &AtomicBool,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut conn = conn;
    let Some((first, headers)) = read_head(&mut reader) else {
        return Ok(());
    };
    requests.fetch_add(1, Ordering::Relaxed);
    let mut parts = first.split(' ');
    let (method, target) = (
        parts.next().unwrap_or("GET").to_string(),
        parts.next().unwrap_or("/").to_string(),
    );
    let range = header(&headers, "Range").map(str::to_string);
    let range_start = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split('-').next())
        .and_then(|s| s.parse::<u64>().ok());
    let f = {
        let mut f = faults.lock().unwrap();
        let now = f.clone();
        if f.fail_next > 0 {
            f.fail_next -= 1;
        }
        if range.is_some() && f.truncate_next > 0 {
            f.truncate_next -= 1;
        }
        now
    };
    if f.fail_all || f.fail_next > 0 {
        write!(
            conn,
            "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbusy"
        )?;
        return Ok(());
    }
    if f.redirect_loop {
        write!(
            conn,
            "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{port}{target}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )?;
        return Ok(());
    }
    if let (Some((stalled, wait)), Some(start)) = (&f.stall, range_start) {
        if stalled.contains(&start) {
            let until = Instant::now() + *wait;
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    // Forward the request (one per connection).
    let mut up = TcpStream::connect(("127.0.0.1", upstream))?;
    let mut req = format!(
        "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{upstream}\r\nConnection: close\r\n"
    );
    for (k, v) in &headers {
        let forwarded = [
            "If-Match",
            "If-None-Match",
            "If-Modified-Since",
            "If-Unmodified-Since",
        ];
        if (k.eq_ignore_ascii_case("Range") && !f.ignore_range)
            || forwarded.iter().any(|h| k.eq_ignore_ascii_case(h))
        {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    req.push_str("\r\n");
    up.write_all(req.as_bytes())?;
    let mut up = BufReader::new(up);
    let Some((status, mut rheaders)) = read_head(&mut up) else {
        return Ok(());
    };
    let mut body = Vec::new();
    if method != "HEAD" {
        up.read_to_end(&mut body)?;
    }
    if let Some(etag) = &f.etag {
        for (k, v) in rheaders.iter_mut() {
            if k.eq_ignore_ascii_case("ETag") {
                *v = etag.clone();
            }
        }
    }
    let ranged = status.contains(" 206 ");
    let truncate = ranged && (f.truncate_all || f.truncate_next > 0);
    if ranged && f.extra_bytes > 0 {
        body.extend(std::iter::repeat_n(0xAB, f.extra_bytes));
    }
    let declared = match f.content_length {
        Some(n) if method != "HEAD" => n,
        _ => header(&rheaders, "Content-Length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(body.len() as u64)
            .max(if f.extra_bytes > 0 {
                body.len() as u64
            } else {
                0
            }),
    };
    let mut head = format!("{status}\r\n");
    for (k, v) in &rheaders {
        if k.eq_ignore_ascii_case("Content-Length") || k.eq_ignore_ascii_case("Connection") {
            continue;
        }
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {declared}\r\nConnection: close\r\n\r\n"
    ));
    conn.write_all(head.as_bytes())?;
    let send = if truncate {
        &body[..body.len() / 2]
    } else {
        &body[..]
    };
    conn.write_all(send)?;
    bytes.fetch_add(send.len() as u64, Ordering::Relaxed);
    conn.flush()?;
    let _ = conn.shutdown(std::net::Shutdown::Both);
    Ok(())
}
