use super::*;
use etlantic_core::storage::{put_bytes, Sub};
use object_store::memory::InMemory;

fn in_memory(prefix: &str) -> ObjectStorage {
    ObjectStorage::new(Arc::new(InMemory::new()), "memory://test", prefix)
}

/// The storage contract on whole objects: what the checkpoint relies on.
pub(crate) fn object_contract(s: &dyn Storage) {
    assert!(!s.appends());
    etlantic_core::storage::testing::whole_files(s);
    put_bytes(s, "a/x", b"two").unwrap();
    assert_eq!(s.read_range("a/x", 2, 5).unwrap_err().code(), "ETL706");
    assert!(s.put_if_absent("a/y", b"first").unwrap());
    // Appends are emulated: durable at sync, whole objects.
    let mut f = s.append("a/log").unwrap();
    assert_eq!(f.len(), 0);
    f.write(b"hello ").unwrap();
    f.write(b"world").unwrap();
    f.write_at(0, b"J").unwrap();
    assert!(f.write_at(10, b"xx").is_err());
    // Nothing reaches the store before the first sync.
    assert_eq!(s.read("a/log").unwrap(), None);
    f.sync().unwrap();
    assert_eq!(s.read("a/log").unwrap().unwrap(), b"Jello world");
    f.truncate(5).unwrap();
    assert_eq!(s.read("a/log").unwrap().unwrap(), b"Jello");
    drop(f);
    let mut f = s.append("a/log").unwrap();
    assert_eq!(f.len(), 5);
    // A second writer of the same file is refused at its sync.
    let mut g = s.append("a/log").unwrap();
    f.write(b"!").unwrap();
    f.sync().unwrap();
    g.write(b"?").unwrap();
    assert_eq!(g.sync().unwrap_err().code(), "ETL803");
    assert_eq!(s.read("a/log").unwrap().unwrap(), b"Jello!");
    drop((f, g));
    s.delete("a/log").unwrap();
    put_bytes(s, "a/b/z", b"z").unwrap();
    assert_eq!(s.list("a").unwrap(), vec!["b/", "x", "y"]);
    s.rename("a/x", "a/w").unwrap();
    assert_eq!(s.read("a/x").unwrap(), None);
    assert_eq!(s.read("a/w").unwrap().unwrap(), b"two");
    s.delete("a/w").unwrap();
    s.delete("a/w").unwrap();
    assert_eq!(s.list("a").unwrap(), vec!["b/", "y"]);
    put_bytes(s, "c/1", b"1").unwrap();
    put_bytes(s, "c/2", b"2").unwrap();
    s.delete_all(&["c/1".into(), "c/2".into(), "c/3".into()])
        .unwrap();
    assert_eq!(s.list("c").unwrap(), Vec::<String>::new());
    let lock = s.lock("lock").unwrap();
    assert_eq!(
        s.lock("lock").err().map(|e| e.code().to_string()),
        Some("ETL803".into())
    );
    drop(lock);
    s.lock("lock").unwrap();
}

#[test]
fn an_object_store_keeps_the_contract_on_whole_objects() {
    object_contract(&in_memory(""));
    object_contract(&in_memory("deep/prefix"));
    let s = Arc::new(in_memory("p"));
    object_contract(&Sub::new(s.clone(), "sub"));
    assert_eq!(s.list("").unwrap(), vec!["sub/"]);
    assert_eq!(s.display("x/y"), "memory://test/x/y");
}

#[test]
fn a_lease_of_a_dead_holder_is_taken_over_at_once() {
    let s = in_memory("chk");
    let dead = lease::Holder {
        owner: "gone".into(),
        host: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap()
            .trim()
            .into(),
        boot: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .unwrap()
            .trim()
            .into(),
        pid: 4_194_304 + 11,
        expires_ms: i64::MAX,
    };
    put_bytes(&s, ".lock", &serde_json::to_vec(&dead).unwrap()).unwrap();
    let held = s.lock(".lock").unwrap();
    let now: lease::Holder = serde_json::from_slice(&s.read(".lock").unwrap().unwrap()).unwrap();
    assert_eq!(now.pid, std::process::id());
    drop(held);
    // Released: the object is gone.
    assert_eq!(s.read(".lock").unwrap(), None);
    // A live holder elsewhere is respected until its lease runs out.
    let elsewhere = lease::Holder {
        host: "other-host".into(),
        expires_ms: chrono::Utc::now().timestamp_millis() + 60_000,
        ..dead
    };
    put_bytes(&s, ".lock", &serde_json::to_vec(&elsewhere).unwrap()).unwrap();
    let e = s.lock(".lock").unwrap_err();
    assert_eq!(e.code(), "ETL803");
    assert!(e.to_string().contains("other-host"), "{e}");
}

#[test]
fn check_proves_conditional_creates() {
    let s = in_memory("x");
    s.check(true).unwrap();
    // The probe object is gone again.
    assert_eq!(s.list(".etlantic-check").unwrap(), Vec::<String>::new());
}

/// Options of an S3 endpoint nothing listens on (port 1).
fn nobody_listens() -> StorageOptions {
    StorageOptions::new(
        [
            ("endpoint", "http://127.0.0.1:1"),
            ("region", "us-east-1"),
            ("allow_http", "true"),
            ("access_key_id", "k"),
            ("secret_access_key", "s"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    )
}

#[test]
fn options_are_checked_offline() {
    let url = url::Url::parse("s3://bucket/prefix").unwrap();
    let bad = StorageOptions::new([("no_such_option".into(), "1".into())].into());
    let e = ObjectStorage::open(&url, &bad).unwrap_err();
    assert_eq!(e.code(), "ETL007");
    assert!(e.to_string().contains("no_such_option"), "{e}");
    let s = ObjectStorage::open(&url, &nobody_listens()).unwrap();
    assert_eq!(s.display("a"), "s3://bucket/prefix/a");
}

#[test]
fn an_unreachable_endpoint_is_a_diagnostic_after_bounded_retries() {
    // Nothing listens on port 1.
    let url = url::Url::parse("s3://bucket/prefix").unwrap();
    let e = ObjectStoreProvider
        .check(&url, &nobody_listens(), true)
        .unwrap_err();
    assert_eq!(e.code(), "ETL716", "{e}");
    assert!(e.to_string().contains("s3://bucket/prefix"), "{e}");
}

#[test]
fn refused_credentials_and_missing_buckets_have_their_codes() {
    let s = in_memory("x");
    let denied = object_store::Error::PermissionDenied {
        path: "x/f".into(),
        source: "AccessDenied".into(),
    };
    assert_eq!(s.error("read", "f", denied).code(), "ETL715");
    let unauthenticated = object_store::Error::Unauthenticated {
        path: "x/f".into(),
        source: "InvalidAccessKeyId".into(),
    };
    assert_eq!(s.error("read", "f", unauthenticated).code(), "ETL715");
    let no_bucket = object_store::Error::NotFound {
        path: "x/f".into(),
        source: "NoSuchBucket: The specified bucket does not exist".into(),
    };
    let e = s.error("read", "f", no_bucket);
    assert_eq!(e.code(), "ETL714");
    assert!(e.to_string().contains("memory://test/f"), "{e}");
}
