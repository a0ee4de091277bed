//! A local Spark Connect server from the `pyspark` package, for tests and for trying a
//! pipeline on Spark without a cluster.
//!
//! `pip install pyspark` brings Spark's jars (with `spark-connect_2.13-*.jar`) and its
//! scripts; Java 17 runs them. [`LocalSparkConnect::start`] runs the Spark Connect server
//! in the foreground as a child process (`spark-submit --class
//! org.apache.spark.sql.connect.service.SparkConnectServer`), bound to 127.0.0.1 on a
//! free port, with `--master local[2]` and two shuffle partitions, and waits until it
//! accepts connections. Dropping the handle stops it.
//!
//! Spark is found, in this order, at `$SPARK_HOME`, through the Python interpreter in
//! `$ETLANTIC_SPARK_PYTHON`, or through the virtual environment that `cargo xtask setup`
//! creates (`~/.cache/etlantic-spark-venv`).

use etlantic_core::diagnostics::{codes, Error, Result};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The virtual environment `cargo xtask setup` installs pyspark into (under `$HOME`).
pub const SPARK_VENV: &str = ".cache/etlantic-spark-venv";

/// How long a starting server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(180);

fn unavailable(message: impl Into<String>) -> Error {
    Error::new(&codes::ENGINE_UNREACHABLE, message)
}

/// The Spark installation to run: `$SPARK_HOME`, else the `pyspark` package's directory.
pub fn spark_home() -> Result<PathBuf> {
    if let Some(home) = std::env::var_os("SPARK_HOME") {
        return Ok(PathBuf::from(home));
    }
    let python = match std::env::var_os("ETLANTIC_SPARK_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => {
            let home = std::env::var_os("HOME")
                .ok_or_else(|| unavailable("neither SPARK_HOME nor HOME is set"))?;
            Path::new(&home).join(SPARK_VENV).join("bin/python")
        }
    };
    let out = Command::new(&python)
        .args([
            "-c",
            "import os, pyspark; print(os.path.dirname(pyspark.__file__))",
        ])
        .output()
        .map_err(|e| {
            unavailable(format!(
                "cannot run {} to find pyspark: {e}; run `cargo xtask setup` or set SPARK_HOME",
                python.display()
            ))
        })?;
    if !out.status.success() {
        return Err(unavailable(format!(
            "{} has no pyspark ({}); run `cargo xtask setup` or set SPARK_HOME",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// A running local Spark Connect server; stopped when dropped.
pub struct LocalSparkConnect {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl LocalSparkConnect {
    /// Starts a server and waits until it accepts connections (up to three minutes:
    /// the JVM and Spark take 15-30 s to start).
    pub fn start() -> Result<Self> {
        let home = spark_home()?;
        let submit = home.join("bin/spark-submit");
        if !submit.exists() {
            return Err(unavailable(format!(
                "{} does not exist; is {} a Spark installation?",
                submit.display(),
                home.display()
            )));
        }
        let dir = tempfile::tempdir()
            .map_err(|e| unavailable(format!("cannot create a temporary directory: {e}")))?;
        let port = free_port()?;
        let log = dir.path().join("spark-connect.log");
        let log_file = std::fs::File::create(&log)
            .map_err(|e| unavailable(format!("cannot create {}: {e}", log.display())))?;
        let warehouse = dir.path().join("warehouse");
        let conf = [
            "spark.connect.grpc.binding.address=127.0.0.1".to_string(),
            format!("spark.connect.grpc.binding.port={port}"),
            "spark.sql.shuffle.partitions=2".into(),
            "spark.sql.session.timeZone=UTC".into(),
            "spark.ui.enabled=false".into(),
            format!("spark.sql.warehouse.dir={}", warehouse.display()),
            format!("spark.local.dir={}", dir.path().display()),
        ];
        let mut cmd = Command::new(&submit);
        cmd.args([
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name",
            "etlantic-spark-connect",
            "--master",
            "local[2]",
        ]);
        for c in &conf {
            cmd.args(["--conf", c]);
        }
        cmd.arg("spark-internal")
            .env("SPARK_HOME", &home)
            .env("SPARK_LOCAL_IP", "127.0.0.1")
            .env("SPARK_LOG_DIR", dir.path())
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(
                log_file
                    .try_clone()
                    .map_err(|e| unavailable(e.to_string()))?,
            )
            .stderr(log_file);
        let child = cmd
            .spawn()
            .map_err(|e| unavailable(format!("cannot start {}: {e}", submit.display())))?;
        let mut server = LocalSparkConnect {
            child,
            port,
            log,
            _dir: dir,
        };
        server.wait_ready()?;
        Ok(server)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(unavailable(format!(
                    "the Spark Connect server exited ({status}) before accepting connections:\n{}",
                    self.log_tail(20)
                )));
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(unavailable(format!(
                    "the Spark Connect server did not accept connections within {} s:\n{}",
                    START_TIMEOUT.as_secs(),
                    self.log_tail(20)
                )));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The server's address, `sc://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("sc://127.0.0.1:{}", self.port)
    }

    /// The last `lines` lines of the server's log (for error messages).
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for LocalSparkConnect {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP port nothing listens on now (the OS picks it).
fn free_port() -> Result<u16> {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| unavailable(format!("no free local port: {e}")))
}
