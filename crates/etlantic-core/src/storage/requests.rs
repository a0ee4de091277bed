//! How many requests this process sent to object stores, by the kinds they bill by.
//!
//! Object-store providers count every request they send here (retries included), so the
//! runtime can report what each micro-batch cost (`storageRequests` in the progress
//! records) whichever connector or table format sent it.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

/// The kinds of request an object store bills by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// `GET` of an object or a range of it.
    Get,
    /// `HEAD` of an object.
    Head,
    /// `PUT` of an object (conditional or not; a multipart upload counts once).
    Put,
    /// `LIST` of a prefix (a listing counts once, however many pages it takes).
    List,
    /// `DELETE` of an object, or a bulk delete of many.
    Delete,
    /// A server-side copy.
    Copy,
}

static COUNTS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

/// Counts one request of `kind`.
pub fn count(kind: Request) {
    COUNTS[kind as usize].fetch_add(1, Ordering::Relaxed);
}

/// Requests sent so far, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub struct RequestCounts {
    /// `GET` requests.
    pub get: u64,
    /// `HEAD` requests.
    pub head: u64,
    /// `PUT` requests.
    pub put: u64,
    /// `LIST` requests.
    pub list: u64,
    /// `DELETE` requests.
    pub delete: u64,
    /// `COPY` requests.
    pub copy: u64,
}

impl RequestCounts {
    /// The requests of `self` not in `earlier` (counts only grow).
    pub fn since(&self, earlier: &RequestCounts) -> RequestCounts {
        RequestCounts {
            get: self.get - earlier.get,
            head: self.head - earlier.head,
            put: self.put - earlier.put,
            list: self.list - earlier.list,
            delete: self.delete - earlier.delete,
            copy: self.copy - earlier.copy,
        }
    }

    /// All requests.
    pub fn total(&self) -> u64 {
        self.get + self.head + self.put + self.list + self.delete + self.copy
    }
}

/// How many requests of each kind this process has sent to object stores so far.
pub fn request_counts() -> RequestCounts {
    let n = |k: Request| COUNTS[k as usize].load(Ordering::Relaxed);
    RequestCounts {
        get: n(Request::Get),
        head: n(Request::Head),
        put: n(Request::Put),
        list: n(Request::List),
        delete: n(Request::Delete),
        copy: n(Request::Copy),
    }
}
