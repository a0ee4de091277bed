//! Leases: [`Storage::lock`](etlantic_core::storage::Storage::lock) on an object store.
//!
//! An object store has no lock that dies with its holder, so the lock is a lease: an
//! object naming its holder (a random owner id, the host, the boot id and the process)
//! and an expiry [`TTL`] ahead, created with a conditional create and pushed forward
//! every [`RENEW`] with a conditional update on its ETag. Another process takes it when:
//!
//! - the holder ran on this machine in this boot and its process is gone (a crash or a
//!   kill: the restart takes over at once), or
//! - its expiry passed (a holder on another machine that stopped renewing).
//!
//! Taking over is a conditional update on the ETag read, so of two processes taking a
//! stale lease one wins. A holder whose renewal finds the ETag changed has lost the lease
//! and logs it; what keeps two writers from committing the same micro-batch is not the
//! lease but the conditional creates of the checkpoint's log records.

use crate::ObjectStorage;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::storage::{Lock, Storage};
use object_store::{PutMode, UpdateVersion};
use serde::{Deserialize, Serialize};
use std::sync::mpsc;
use std::time::Duration;

/// How long a lease lasts without renewal.
pub const TTL: Duration = Duration::from_secs(30);
/// How often its holder renews it.
pub const RENEW: Duration = Duration::from_secs(10);

/// Who holds a lease, as stored in its object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// Random, one per lease taken.
    pub owner: String,
    /// The host name.
    pub host: String,
    /// The kernel's boot id (a process id means nothing across boots).
    pub boot: String,
    /// The holding process.
    pub pid: u32,
    /// Until when it holds it, in milliseconds since the epoch.
    pub expires_ms: i64,
}

fn proc_text(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Holder {
    fn this_process() -> Self {
        Holder {
            owner: uuid::Uuid::new_v4().to_string(),
            host: proc_text("/proc/sys/kernel/hostname"),
            boot: proc_text("/proc/sys/kernel/random/boot_id"),
            pid: std::process::id(),
            expires_ms: now_ms() + TTL.as_millis() as i64,
        }
    }

    /// Whether the holder may still be alive.
    fn alive(&self) -> bool {
        let here = !self.boot.is_empty()
            && self.boot == proc_text("/proc/sys/kernel/random/boot_id")
            && self.host == proc_text("/proc/sys/kernel/hostname");
        if here {
            std::path::Path::new(&format!("/proc/{}", self.pid)).exists()
        } else {
            self.expires_ms > now_ms()
        }
    }

    fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a holder serializes")
    }
}

/// The current lease object at `path` and its ETag, if there is one.
fn current(storage: &ObjectStorage, path: &str) -> Result<Option<(Vec<u8>, Option<String>)>> {
    storage.read_with_etag(path)
}

/// Writes `holder` at `path` in `mode`; `Ok(Some(etag))` when it did, `Ok(None)` when
/// the condition failed.
fn write(
    storage: &ObjectStorage,
    path: &str,
    holder: &Holder,
    mode: PutMode,
) -> Result<Option<Option<String>>> {
    storage.put_conditional(path, holder.bytes(), mode)
}

fn locked(storage: &ObjectStorage, path: &str, by: Option<&Holder>) -> Error {
    let who = by.map_or("another process".to_string(), |h| {
        format!(
            "process {} on host `{}` (its lease runs until {})",
            h.pid,
            h.host,
            chrono::DateTime::from_timestamp_millis(h.expires_ms)
                .map_or_else(|| h.expires_ms.to_string(), |t| t.to_rfc3339())
        )
    });
    Error::new(
        &codes::CHECKPOINT_LOCKED,
        format!("`{}` is held by {who}", storage.display(path)),
    )
}

/// Takes the lease at `path` (see the [module docs](self)).
pub fn take(storage: ObjectStorage, path: &str) -> Result<Lock> {
    let mut me = Holder::this_process();
    // Three rounds: a lease that changes under us between the read and the take-over is
    // someone else's win.
    for _ in 0..3 {
        if let Some(etag) = write(&storage, path, &me, PutMode::Create)? {
            return Ok(Lock::new(Renewal::start(storage, path, me, etag)));
        }
        let Some((bytes, etag)) = current(&storage, path)? else {
            continue;
        };
        let held: Option<Holder> = serde_json::from_slice(&bytes).ok();
        if let Some(h) = &held {
            if h.alive() {
                return Err(locked(&storage, path, held.as_ref()));
            }
        }
        tracing::info!(
            "taking over the stale lease {} of {held:?}",
            storage.display(path)
        );
        me.expires_ms = now_ms() + TTL.as_millis() as i64;
        let update = PutMode::Update(UpdateVersion {
            e_tag: etag,
            version: None,
        });
        if let Some(etag) = write(&storage, path, &me, update)? {
            return Ok(Lock::new(Renewal::start(storage, path, me, etag)));
        }
    }
    Err(locked(&storage, path, None))
}

/// The thread renewing a held lease; dropping it releases the lease.
struct Renewal {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Renewal {
    fn start(storage: ObjectStorage, path: &str, me: Holder, etag: Option<String>) -> Self {
        let (stop, stopped) = mpsc::channel::<()>();
        let path = path.to_string();
        let thread = std::thread::Builder::new()
            .name("etlantic-lease".into())
            .spawn(move || renew(storage, path, me, etag, stopped))
            .expect("the lease thread starts");
        Renewal {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

fn renew(
    storage: ObjectStorage,
    path: String,
    mut me: Holder,
    mut etag: Option<String>,
    stopped: mpsc::Receiver<()>,
) {
    loop {
        match stopped.recv_timeout(RENEW) {
            Err(mpsc::RecvTimeoutError::Timeout) => {
                me.expires_ms = now_ms() + TTL.as_millis() as i64;
                let update = PutMode::Update(UpdateVersion {
                    e_tag: etag.clone(),
                    version: None,
                });
                match write(&storage, &path, &me, update) {
                    Ok(Some(next)) => etag = next,
                    Ok(None) => {
                        tracing::error!(
                            "lost the lease {}: another process took it over",
                            storage.display(&path)
                        );
                        return;
                    }
                    // Renewed on the next round, well before the lease runs out.
                    Err(e) => tracing::warn!("cannot renew the lease: {e}"),
                }
            }
            // Released (or the guard is gone): delete it if it is still ours.
            _ => {
                if let Ok(Some((bytes, _))) = current(&storage, &path) {
                    if serde_json::from_slice::<Holder>(&bytes).is_ok_and(|h| h.owner == me.owner) {
                        let _ = storage.delete(&path);
                    }
                }
                return;
            }
        }
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_process_on_this_machine_holds_nothing() {
        let mut h = Holder::this_process();
        assert!(h.alive());
        // No process has this id (above the kernel's pid_max default).
        h.pid = 4_194_304 + 7;
        assert!(!h.alive());
        // On another machine only the expiry counts.
        h.host = "elsewhere".into();
        assert!(h.alive());
        h.expires_ms = now_ms() - 1;
        assert!(!h.alive());
    }
}
