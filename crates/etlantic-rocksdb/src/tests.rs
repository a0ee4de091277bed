use super::*;

struct Fixture {
    _dir: tempfile::TempDir,
    local: PathBuf,
    checkpoint: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Fixture {
            local: dir.path().join("local"),
            checkpoint: dir.path().join("checkpoint"),
            _dir: dir,
        }
    }

    /// A store on working copy `local` (a sub-directory: another "machine").
    fn open(&self, local: &str) -> DiskStore {
        DiskStore::open(StoreContext {
            operator: "t.0".into(),
            local_dir: self.local.join(local),
            checkpoint: etlantic_core::storage::open(&self.checkpoint),
            memory_limit_bytes: 16 << 20,
        })
        .unwrap()
    }

    /// The files of the checkpoint under `dir`.
    fn files(&self, dir: &str) -> BTreeSet<String> {
        match std::fs::read_dir(self.checkpoint.join(dir)) {
            Ok(d) => d
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => BTreeSet::new(),
        }
    }
}

fn key(i: u32) -> Vec<u8> {
    format!("k{i:08}").into_bytes()
}

fn put_range(store: &mut DiskStore, from: u32, to: u32, tag: &str) {
    let mut w = StoreWrites::default();
    for i in from..to {
        w.put(key(i), format!("{tag}{i}"));
    }
    store.write(w).unwrap();
}

fn all(store: &DiskStore) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    store
        .scan(b"", None, &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            Ok(true)
        })
        .unwrap();
    out
}

/// Writes are read back before any commit; scans are ordered and bounded; range deletes
/// remove exactly their range.
#[test]
fn reads_see_the_writes_of_the_micro_batch() {
    let fx = Fixture::new();
    let mut s = fx.open("a");
    put_range(&mut s, 0, 100, "v");
    assert_eq!(s.get(&key(7)).unwrap(), Some(b"v7".to_vec()));
    let mut w = StoreWrites::default();
    w.delete(key(7));
    w.delete_range(key(10), key(20));
    w.put(key(15), "again");
    s.write(w).unwrap();
    assert_eq!(s.get(&key(7)).unwrap(), None);
    assert_eq!(s.get(&key(12)).unwrap(), None);
    assert_eq!(s.get(&key(15)).unwrap(), Some(b"again".to_vec()));
    let mut seen = Vec::new();
    s.scan(&key(5), Some(&key(22)), &mut |k, _| {
        seen.push(String::from_utf8(k.to_vec()).unwrap());
        Ok(true)
    })
    .unwrap();
    assert_eq!(
        seen,
        [
            "k00000005",
            "k00000006",
            "k00000008",
            "k00000009",
            "k00000015",
            "k00000020",
            "k00000021"
        ]
    );
    assert_eq!(all(&s).len(), 100 - 1 - 10 + 1);
}

/// A commit uploads only the SSTs the previous version did not hold; every retained
/// version restores exactly, on the same working copy or on a new one.
#[test]
fn commits_are_incremental_and_every_version_restores() {
    let fx = Fixture::new();
    let mut s = fx.open("a");
    put_range(&mut s, 0, 1000, "a");
    let first = s.commit(1).unwrap();
    assert_eq!(first.files_uploaded, first.files_total);
    let v1 = all(&s);
    put_range(&mut s, 1000, 1100, "b");
    let second = s.commit(2).unwrap();
    let small = fx.files("small/2").len() as u64;
    // Two SSTs, of which the first version's is referenced, not uploaded again.
    assert_eq!(second.files_total - small, 2, "{second:?}");
    assert_eq!(second.files_uploaded - small, 1, "{second:?}");
    assert!(
        second.bytes_uploaded < first.bytes_uploaded,
        "{first:?} then {second:?}"
    );
    let v2 = all(&s);
    // Nothing committed after version 2 survives a restore of it.
    put_range(&mut s, 5000, 5010, "uncommitted");
    s.restore(Some(2)).unwrap();
    assert_eq!(all(&s), v2);
    s.restore(Some(1)).unwrap();
    assert_eq!(all(&s), v1);
    s.restore(None).unwrap();
    assert!(all(&s).is_empty());
    // Another machine: an empty working copy, the checkpoint alone.
    let mut other = fx.open("b");
    other.restore(Some(2)).unwrap();
    assert_eq!(all(&other), v2);
    assert_eq!(other.versions().unwrap(), vec![1, 2]);
}

/// A restore of an older version, then new commits: the versions written after it are
/// replaced, and their SSTs (whose file numbers the new ones reuse) are never mistaken
/// for the new ones.
#[test]
fn a_rolled_back_version_is_replaced_cleanly() {
    let fx = Fixture::new();
    let mut s = fx.open("a");
    put_range(&mut s, 0, 10, "a");
    s.commit(1).unwrap();
    put_range(&mut s, 10, 20, "lost");
    s.commit(2).unwrap();
    // A restart from version 1: micro-batch 2 runs again, with other rows.
    s.restore(Some(1)).unwrap();
    put_range(&mut s, 10, 20, "again");
    s.commit(2).unwrap();
    let mut fresh = fx.open("b");
    fresh.restore(Some(2)).unwrap();
    let values: Vec<String> = all(&fresh)
        .into_iter()
        .map(|(_, v)| String::from_utf8(v).unwrap())
        .collect();
    assert!(values.iter().all(|v| !v.starts_with("lost")), "{values:?}");
    assert_eq!(values.len(), 20);
}

/// Retention deletes the versions before the oldest kept and every file only they
/// named (and SSTs of commits that never wrote their manifest); what is kept restores.
#[test]
fn retention_deletes_only_what_no_kept_version_names() {
    let fx = Fixture::new();
    let mut s = fx.open("a");
    for v in 1..=5u32 {
        put_range(&mut s, v * 100, v * 100 + 50, "x");
        if v == 3 {
            // Half the keys go: compaction may rewrite SSTs.
            let mut w = StoreWrites::default();
            w.delete_range(key(0), key(250));
            s.write(w).unwrap();
        }
        s.commit(v as u64).unwrap();
    }
    let kept = all(&s);
    // An SST a crashed commit left behind.
    std::fs::write(fx.checkpoint.join("sst/999999-orphan.sst"), b"x").unwrap();
    s.retain(4).unwrap();
    assert_eq!(s.versions().unwrap(), vec![4, 5]);
    assert!(!fx.files("sst").contains("999999-orphan.sst"));
    assert!(fx.files("small/3").is_empty());
    let mut names = BTreeSet::new();
    for v in [4, 5] {
        names.extend(s.manifest(v).unwrap().ssts.into_iter().map(|f| f.stored));
    }
    let stored: BTreeSet<String> = fx
        .files("sst")
        .into_iter()
        .map(|n| format!("sst/{n}"))
        .collect();
    assert_eq!(stored, names);
    let mut other = fx.open("b");
    other.restore(Some(5)).unwrap();
    assert_eq!(all(&other), kept);
    assert!(other.restore(Some(2)).is_err_and(|e| e.code() == "ETL801"));
}

/// A version whose files are damaged or missing is refused with ETL801, not read.
#[test]
fn a_missing_file_is_reported() {
    let fx = Fixture::new();
    let mut s = fx.open("a");
    put_range(&mut s, 0, 10, "a");
    s.commit(1).unwrap();
    for f in fx.files("sst") {
        std::fs::remove_file(fx.checkpoint.join("sst").join(f)).unwrap();
    }
    let err = fx.open("b").restore(Some(1)).unwrap_err();
    assert_eq!(err.code(), "ETL801", "{err}");
}

/// A restart on the same machine restores the last commit from the working copy's local
/// copy of it (reading no SST from the checkpoint); a working copy without one, or whose
/// copy is of another commit, reads the checkpoint.
#[test]
fn the_last_commit_restores_from_the_working_copy() {
    let fx = Fixture::new();
    let mut s = fx.open("a");
    put_range(&mut s, 0, 100, "a");
    s.commit(1).unwrap();
    put_range(&mut s, 100, 200, "b");
    s.commit(2).unwrap();
    let v2 = all(&s);
    put_range(&mut s, 500, 600, "uncommitted");
    // Without the checkpoint's SSTs, only the local copy can give version 2.
    let ssts = fx.files("sst");
    let saved: Vec<(String, Vec<u8>)> = ssts
        .iter()
        .map(|n| {
            (
                n.clone(),
                std::fs::read(fx.checkpoint.join("sst").join(n)).unwrap(),
            )
        })
        .collect();
    for n in &ssts {
        std::fs::remove_file(fx.checkpoint.join("sst").join(n)).unwrap();
    }
    s.restore(Some(2)).unwrap();
    assert_eq!(all(&s), v2);
    // The local copy is of version 2 only: version 1 needs the checkpoint.
    assert!(s.restore(Some(1)).is_err_and(|e| e.code() == "ETL801"));
    let err = fx.open("b").restore(Some(2)).unwrap_err();
    assert_eq!(err.code(), "ETL801", "{err}");
    for (n, bytes) in saved {
        std::fs::write(fx.checkpoint.join("sst").join(n), bytes).unwrap();
    }
    // Version 2 committed again by another run: the local copy no longer matches.
    let mut other = fx.open("c");
    other.restore(Some(1)).unwrap();
    put_range(&mut other, 100, 200, "other");
    other.commit(2).unwrap();
    s.restore(Some(2)).unwrap();
    assert_eq!(all(&s), all(&other));
}
