//! The object storage against a real S3-compatible server (moto, on 127.0.0.1).

use etlantic_core::storage::{put_bytes, Storage, StorageOptions, StorageProvider};
use etlantic_object_store::testing::S3TestServer;
use etlantic_object_store::{ObjectStorage, ObjectStoreProvider};
use std::sync::Arc;

fn url(text: &str) -> url::Url {
    url::Url::parse(text).unwrap()
}

#[test]
fn s3_keeps_the_storage_contract_on_whole_objects() {
    let server = S3TestServer::start();
    server.create_bucket("contract");
    let s = ObjectStorage::open(&url("s3://contract/some/prefix"), &server.options()).unwrap();
    assert!(!s.appends());
    // The conditional creates in it are the server's, not ours: real 412s.
    etlantic_core::storage::testing::whole_files(&s);
    put_bytes(&s, "a/x", b"two").unwrap();
    assert!(s.put_if_absent("a/y", b"first").unwrap());
    put_bytes(&s, "a/b/z", b"z").unwrap();
    // One listing tells each object's ETag, as a HEAD does.
    let files = s.list_files("a").unwrap();
    assert!(files.iter().all(|(_, m)| m.version.is_some()), "{files:?}");
    // Same size, other bytes: a new ETag.
    put_bytes(&s, "a/x", b"owt").unwrap();
    assert!(!s.stat("a/x").unwrap().unwrap().same_as(&files[0].1));
    s.rename("a/x", "a/w").unwrap();
    assert_eq!(s.read("a/x").unwrap(), None);
    s.delete_all(&["a/w".into(), "a/y".into(), "a/missing".into()])
        .unwrap();
    assert_eq!(s.list("a").unwrap(), vec!["b/"]);
    // One process holds the lease; a second taker is refused until it is released.
    let lease = s.lock(".lock").unwrap();
    assert_eq!(s.lock(".lock").unwrap_err().code(), "ETL803");
    drop(lease);
    s.lock(".lock").unwrap();
    assert_eq!(s.retries(), 0);
    // Two storages on the same prefix race for one create: one wins.
    let other: Arc<dyn Storage> = ObjectStoreProvider
        .open(&url("s3://contract/some/prefix"), &server.options())
        .unwrap();
    let wins = [
        s.put_if_absent("race", b"a").unwrap(),
        other.put_if_absent("race", b"b").unwrap(),
    ];
    assert_eq!(wins, [true, false]);
}

#[test]
fn bad_configurations_get_coded_diagnostics() {
    let server = S3TestServer::start();
    server.create_bucket("present");
    // A missing bucket.
    let e = ObjectStoreProvider
        .check(&url("s3://absent/x"), &server.options(), true)
        .unwrap_err();
    assert_eq!(e.code(), "ETL714", "{e}");
    assert!(e.to_string().contains("s3://absent/x"), "{e}");
    // A readable object in a missing bucket is an error, not "no such object".
    let s = ObjectStorage::open(&url("s3://absent/x"), &server.options()).unwrap();
    assert_eq!(s.read("f").unwrap_err().code(), "ETL714");
    // The bucket there: the check passes, conditional creates included.
    ObjectStoreProvider
        .check(&url("s3://present/x"), &server.options(), true)
        .unwrap();
    // An endpoint nobody answers on.
    let mut options = server.options().0;
    options.insert("endpoint".into(), "http://127.0.0.1:1".into());
    let e = ObjectStoreProvider
        .check(&url("s3://present/x"), &StorageOptions::new(options), true)
        .unwrap_err();
    assert_eq!(e.code(), "ETL716", "{e}");
}

/// An object larger than a part is written by a multipart upload, in bounded memory, and
/// reads back whole; a write that fails half-way leaves no object.
#[test]
fn a_large_object_is_uploaded_in_parts() {
    let server = S3TestServer::start();
    server.create_bucket("large");
    let s = ObjectStorage::open(&url("s3://large/p"), &server.options()).unwrap();
    let size = etlantic_object_store::PART_BYTES * 2 + 12_345;
    let bytes: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    s.put("big", &mut |out| {
        for chunk in bytes.chunks(100_000) {
            out.write_all(chunk).unwrap();
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(s.size("big").unwrap(), Some(size as u64));
    assert!(
        s.read("big").unwrap().unwrap() == bytes,
        "the object reads back whole"
    );
    // A fill that fails after a part went out: no object, and the upload is gone.
    let err = s
        .put("broken", &mut |out| {
            out.write_all(&bytes).unwrap();
            Err(etlantic_core::diagnostics::Error::new(
                &etlantic_core::diagnostics::codes::IO_ERROR,
                "the source went away",
            ))
        })
        .unwrap_err();
    assert!(err.to_string().contains("went away"), "{err}");
    assert_eq!(s.read("broken").unwrap(), None);
    assert_eq!(s.list("").unwrap(), vec!["big"]);
}
