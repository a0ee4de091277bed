//! A real S3-compatible server for tests: `moto`'s server mode (PyPI `moto[server]`),
//! which honours conditional creates and updates (`If-None-Match: *`, `If-Match`) as
//! AWS S3 does. `cargo xtask setup` (and `cargo xtask ci`) install it into
//! `~/.cache/etlantic-s3-venv`; `ETLANTIC_MOTO_SERVER` names another `moto_server`.

use etlantic_core::storage::StorageOptions;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where `cargo xtask setup` installs the server, under the home directory.
pub const VENV: &str = ".cache/etlantic-s3-venv";

/// A running `moto` server on 127.0.0.1, stopped when dropped.
pub struct S3TestServer {
    child: Child,
    port: u16,
}

fn server_program() -> PathBuf {
    if let Ok(p) = std::env::var("ETLANTIC_MOTO_SERVER") {
        return PathBuf::from(p);
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    PathBuf::from(home).join(VENV).join("bin/moto_server")
}

/// One HTTP/1.1 request without a body; the status code of the answer.
fn http(port: u16, method: &str, path: &str) -> std::io::Result<u16> {
    let mut c = TcpStream::connect(("127.0.0.1", port))?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        c,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    c.read_to_string(&mut answer)?;
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not HTTP: {answer:.80}")))
}

impl S3TestServer {
    /// Starts a server on a free port and waits until it answers. Panics with what to
    /// install when the server is missing: a test that needs S3 fails rather than skips.
    pub fn start() -> Self {
        let program = server_program();
        assert!(
            program.exists(),
            "the S3 test server `{}` is missing: run `cargo xtask setup` (it installs moto[server] into ~/{VENV}) or set ETLANTIC_MOTO_SERVER",
            program.display()
        );
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(&program)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the S3 test server starts");
        let server = S3TestServer { child, port };
        let t = Instant::now();
        while http(port, "GET", "/").is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the S3 test server did not answer on port {port} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// The endpoint, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates bucket `name` (moto accepts it unsigned).
    pub fn create_bucket(&self, name: &str) {
        let status = http(self.port, "PUT", &format!("/{name}")).expect("create the bucket");
        assert!(status == 200, "creating bucket {name}: HTTP {status}");
    }

    /// Storage options reaching this server with dummy credentials.
    pub fn options(&self) -> StorageOptions {
        StorageOptions::new(
            [
                ("endpoint", self.endpoint()),
                ("region", "us-east-1".into()),
                ("allow_http", "true".into()),
                ("access_key_id", "test".into()),
                ("secret_access_key", "test".into()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        )
    }

    /// The same options as `AWS_*` environment variables, for a child process.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ]
    }
}

impl Drop for S3TestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
