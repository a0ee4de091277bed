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

    /// A store on working copy `local` (a sub-directory: another "machine"), taking no
    /// snapshot unless asked.
    fn open(&self, local: &str) -> DiskStore {
        self.open_with(local, 1_000_000)
    }

    /// A store that takes a snapshot every `every` versions.
    fn open_with(&self, local: &str, every: u64) -> DiskStore {
        DiskStore::open_with(
            StoreContext {
                operator: "t.0".into(),
                local_dir: self.local.join(local),
                checkpoint: etlantic_core::storage::open(&self.checkpoint),
                memory_limit_bytes: 16 << 20,
                snapshot_every: None,
            },
            SnapshotPolicy {
                max_versions: every,
                changelog_share: f64::INFINITY,
                min_changelog_bytes: u64::MAX,
            },
        )
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

/// Commits `version` and waits for the snapshot it may have started.
fn commit(store: &mut DiskStore, version: u64) -> CommitStats {
    let stats = store.commit(version).unwrap();
    store.take_finished_snapshot(true).unwrap();
    stats
}

/// A commit uploads one changelog, sized by what the micro-batch wrote; every version
/// restores exactly, on the same working copy or on a new one, from the changelogs alone.
#[test]
fn a_commit_uploads_the_changelog_and_every_version_restores() {
    let fx = Fixture::new();
    let mut s = fx.open("a");
    put_range(&mut s, 0, 10_000, "a");
    let first = commit(&mut s, 1);
    assert_eq!(
        (first.files_uploaded, first.snapshot_files_uploaded),
        (1, 0)
    );
    let v1 = all(&s);
    put_range(&mut s, 10_000, 10_100, "b");
    let mut w = StoreWrites::default();
    w.delete(key(3));
    w.delete_range(key(100), key(200));
    s.write(w).unwrap();
    let second = commit(&mut s, 2);
    assert_eq!(second.files_uploaded, 1);
    assert!(
        second.bytes_uploaded * 20 < first.bytes_uploaded,
        "a hundredth of the writes: {first:?} then {second:?}"
    );
    assert_eq!(second.files_total, 2, "{second:?}");
    assert_eq!(
        fx.files("changelog"),
        ["1.log", "2.log"].map(String::from).into()
    );
    assert!(fx.files("sst").is_empty(), "no snapshot taken");
    let v2 = all(&s);
    // Nothing written after version 2 survives a restore of it.
    put_range(&mut s, 50_000, 50_010, "uncommitted");
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
    // Commits go on from a restored version.
    put_range(&mut other, 0, 5, "c");
    commit(&mut other, 3);
    let v3 = all(&other);
    let mut third = fx.open("c");
    third.restore(Some(3)).unwrap();
    assert_eq!(all(&third), v3);
}

/// Snapshots copy only the SSTs the previous snapshot did not hold; a restore loads the
/// newest snapshot at or before the version and replays the changelogs after it.
#[test]
fn snapshots_are_incremental_and_restores_replay_only_what_follows_them() {
    let fx = Fixture::new();
    let mut s = fx.open_with("a", 2);
    let mut states = vec![Vec::new()];
    let mut snapshots = Vec::new();
    for v in 1..=6u32 {
        put_range(&mut s, v * 1000, v * 1000 + 500, "x");
        let stats = commit(&mut s, v as u64);
        snapshots.push(stats);
        states.push(all(&s));
    }
    // Versions 2, 4 and 6 were snapshotted; each snapshot is reported by the next
    // commit, so version 6's is not yet.
    assert_eq!(
        fx.files("snapshot"),
        ["2.json", "4.json", "6.json"].map(String::from).into()
    );
    assert_eq!(
        snapshots[1].snapshot_files_uploaded, 0,
        "{:?}",
        snapshots[1]
    );
    assert!(
        snapshots[2].snapshot_bytes_uploaded > 0,
        "{:?}",
        snapshots[2]
    );
    assert!(
        snapshots[4].snapshot_bytes_uploaded > 0,
        "{:?}",
        snapshots[4]
    );
    // The second snapshot references the first one's SSTs instead of copying them.
    let second = snapshot::read_manifest(s.storage(), "snapshot/4.json")
        .unwrap()
        .unwrap();
    let first = snapshot::read_manifest(s.storage(), "snapshot/2.json")
        .unwrap()
        .unwrap();
    let shared = second
        .ssts
        .iter()
        .filter(|f| first.ssts.contains(f))
        .count();
    assert!(shared > 0, "{first:?} / {second:?}");
    assert!(
        snapshots[4].snapshot_bytes_uploaded < second.bytes(),
        "{:?}",
        snapshots[4]
    );
    // Version 5 restores from snapshot 4 and changelog 5: without changelogs 1 to 4.
    for v in 1..=4 {
        std::fs::rename(
            fx.checkpoint.join(format!("changelog/{v}.log")),
            fx.local.join(format!("{v}.log")),
        )
        .unwrap();
    }
    let mut other = fx.open("b");
    other.restore(Some(5)).unwrap();
    assert_eq!(all(&other), states[5]);
    other.restore(Some(4)).unwrap();
    assert_eq!(all(&other), states[4]);
    assert!(other.restore(Some(3)).is_err_and(|e| e.code() == "ETL801"));
    for v in 1..=4 {
        std::fs::rename(
            fx.local.join(format!("{v}.log")),
            fx.checkpoint.join(format!("changelog/{v}.log")),
        )
        .unwrap();
    }
    for v in 0..=6u64 {
        let mut fresh = fx.open(&format!("v{v}"));
        fresh.restore((v > 0).then_some(v)).unwrap();
        assert_eq!(all(&fresh), states[v as usize], "version {v}");
    }
}

/// A restore of an older version, then new commits: the changelogs and snapshots written
/// after it are replaced, and their SSTs (whose file numbers the new ones reuse) are
/// never mistaken for the new ones.
#[test]
fn a_rolled_back_version_is_replaced_cleanly() {
    let fx = Fixture::new();
    let mut s = fx.open_with("a", 1);
    put_range(&mut s, 0, 10, "a");
    commit(&mut s, 1);
    put_range(&mut s, 10, 20, "lost");
    commit(&mut s, 2);
    put_range(&mut s, 20, 30, "lost");
    commit(&mut s, 3);
    // A restart from version 1: micro-batch 2 runs again, with other rows.
    s.restore(Some(1)).unwrap();
    put_range(&mut s, 10, 20, "again");
    commit(&mut s, 2);
    assert!(
        !fx.files("changelog").contains("3.log"),
        "version 3 is gone"
    );
    let mut fresh = fx.open("b");
    fresh.restore(Some(2)).unwrap();
    let values: Vec<String> = all(&fresh)
        .into_iter()
        .map(|(_, v)| String::from_utf8(v).unwrap())
        .collect();
    assert!(values.iter().all(|v| !v.starts_with("lost")), "{values:?}");
    assert_eq!(values.len(), 20);
    assert!(fresh.restore(Some(3)).is_err_and(|e| e.code() == "ETL801"));
    // Neither does a rolled-back snapshot survive when only changelogs follow.
    let mut t = fx.open("c");
    t.restore(Some(1)).unwrap();
    put_range(&mut t, 10, 20, "third");
    t.commit(2).unwrap();
    let mut fresh = fx.open("d");
    fresh.restore(Some(2)).unwrap();
    assert!(all(&fresh).iter().all(|(_, v)| !v.starts_with(b"again")));
}

/// Retention keeps the newest snapshot at or before the oldest kept version and what
/// follows it, deletes the rest — SSTs only older snapshots named, and those of uploads
/// that never wrote their manifest — and what it keeps restores.
#[test]
fn retention_deletes_only_what_no_kept_version_needs() {
    let fx = Fixture::new();
    let mut s = fx.open_with("a", 2);
    for v in 1..=7u32 {
        put_range(&mut s, v * 100, v * 100 + 50, "x");
        if v == 3 {
            // Half the keys go: compaction may rewrite SSTs.
            let mut w = StoreWrites::default();
            w.delete_range(key(0), key(250));
            s.write(w).unwrap();
        }
        commit(&mut s, v as u64);
    }
    let kept = all(&s);
    // What an upload cut short left behind.
    std::fs::write(fx.checkpoint.join("sst/999999-orphan.sst"), b"x").unwrap();
    std::fs::create_dir_all(fx.checkpoint.join("small/99")).unwrap();
    std::fs::write(fx.checkpoint.join("small/99/CURRENT"), b"x").unwrap();
    s.retain(5).unwrap();
    // Snapshot 4 is the newest at or before 5: versions 5 to 7 build on it.
    assert_eq!(s.versions().unwrap(), vec![4, 5, 6, 7]);
    assert_eq!(
        fx.files("snapshot"),
        ["4.json", "6.json"].map(String::from).into()
    );
    assert_eq!(
        fx.files("changelog"),
        ["5.log", "6.log", "7.log"].map(String::from).into()
    );
    assert!(fx.files("small/2").is_empty() && fx.files("small/99").is_empty());
    let mut names = BTreeSet::new();
    for v in [4, 6] {
        let m = snapshot::read_manifest(s.storage(), &format!("snapshot/{v}.json"))
            .unwrap()
            .unwrap();
        names.extend(m.ssts.into_iter().map(|f| f.stored));
    }
    let stored: BTreeSet<String> = fx
        .files("sst")
        .into_iter()
        .map(|n| format!("sst/{n}"))
        .collect();
    assert_eq!(stored, names);
    let mut other = fx.open("b");
    other.restore(Some(7)).unwrap();
    assert_eq!(all(&other), kept);
    assert!(other.restore(Some(3)).is_err_and(|e| e.code() == "ETL801"));
}

/// A version whose files are missing or damaged is refused with ETL801, not read.
#[test]
fn a_missing_or_damaged_file_is_reported() {
    let fx = Fixture::new();
    let mut s = fx.open_with("a", 1);
    put_range(&mut s, 0, 10, "a");
    commit(&mut s, 1);
    drop(s);
    // Version 2 as a changelog only.
    let mut s = fx.open("a");
    s.restore(Some(1)).unwrap();
    put_range(&mut s, 10, 20, "b");
    s.commit(2).unwrap();
    drop(s);
    // A damaged changelog: one byte of its compressed records flipped.
    let log = fx.checkpoint.join("changelog/2.log");
    let mut bytes = std::fs::read(&log).unwrap();
    let at = bytes.len() - 6;
    bytes[at] ^= 0x40;
    std::fs::write(&log, &bytes).unwrap();
    let mut b = fx.open("b");
    let err = b.restore(Some(2)).unwrap_err();
    assert_eq!(err.code(), "ETL801", "{err}");
    assert!(
        all(&b).is_empty(),
        "a failed restore leaves the empty state"
    );
    // A header naming a base that is not older than the changelog's own version.
    let mut looping = std::fs::read(&log).unwrap();
    looping[8..16].copy_from_slice(&3u64.to_le_bytes());
    std::fs::write(&log, &looping).unwrap();
    let err = fx.open("b2").restore(Some(2)).unwrap_err();
    assert_eq!(err.code(), "ETL801", "{err}");
    // A cut-short one.
    std::fs::write(&log, &bytes[..bytes.len() / 2]).unwrap();
    let err = fx.open("c").restore(Some(2)).unwrap_err();
    assert_eq!(err.code(), "ETL801", "{err}");
    // A snapshot whose SSTs are gone.
    for f in fx.files("sst") {
        std::fs::remove_file(fx.checkpoint.join("sst").join(f)).unwrap();
    }
    let err = fx.open("d").restore(Some(1)).unwrap_err();
    assert_eq!(err.code(), "ETL801", "{err}");
}

/// A restart on the same machine loads the last snapshot from the working copy's local
/// copy of it (reading no SST from the checkpoint); a working copy without one, or whose
/// copy is of another snapshot, reads the checkpoint.
#[test]
fn the_last_snapshot_restores_from_the_working_copy() {
    let fx = Fixture::new();
    let mut s = fx.open_with("a", 2);
    put_range(&mut s, 0, 100, "a");
    commit(&mut s, 1);
    put_range(&mut s, 100, 200, "b");
    commit(&mut s, 2);
    put_range(&mut s, 200, 300, "c");
    commit(&mut s, 3);
    let v3 = all(&s);
    put_range(&mut s, 500, 600, "uncommitted");
    // Without the checkpoint's SSTs, only the local copy can give snapshot 2.
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
    s.restore(Some(3)).unwrap();
    assert_eq!(all(&s), v3);
    let err = fx.open("b").restore(Some(3)).unwrap_err();
    assert_eq!(err.code(), "ETL801", "{err}");
    for (n, bytes) in saved {
        std::fs::write(fx.checkpoint.join("sst").join(n), bytes).unwrap();
    }
    // Snapshot 2 taken again by another run: the local copy no longer matches.
    let mut other = fx.open_with("c", 2);
    other.restore(Some(1)).unwrap();
    put_range(&mut other, 100, 200, "other");
    commit(&mut other, 2);
    s.restore(Some(2)).unwrap();
    assert_eq!(all(&s), all(&other));
}

/// Checkpoints of the earlier layout (a snapshot at every commit, under `versions/`)
/// restore.
#[test]
fn snapshots_of_the_earlier_layout_restore() {
    let fx = Fixture::new();
    let mut s = fx.open_with("a", 1);
    put_range(&mut s, 0, 100, "a");
    commit(&mut s, 1);
    let v1 = all(&s);
    drop(s);
    std::fs::create_dir_all(fx.checkpoint.join("versions")).unwrap();
    std::fs::rename(
        fx.checkpoint.join("snapshot/1.json"),
        fx.checkpoint.join("versions/1.json"),
    )
    .unwrap();
    std::fs::remove_file(fx.checkpoint.join("changelog/1.log")).unwrap();
    let mut b = fx.open("b");
    b.restore(Some(1)).unwrap();
    assert_eq!(all(&b), v1);
    put_range(&mut b, 100, 110, "b");
    commit(&mut b, 2);
    let mut c = fx.open("c");
    c.restore(Some(2)).unwrap();
    assert_eq!(all(&c).len(), 110);
}

/// A snapshot is due once the changelogs since the last one hold the policy's share of
/// its bytes: what snapshots upload stays proportional to what the changelogs did.
#[test]
fn a_snapshot_is_due_when_the_changelogs_hold_half_of_the_last_one() {
    let fx = Fixture::new();
    let mut s = DiskStore::open_with(
        StoreContext {
            operator: "t.0".into(),
            local_dir: fx.local.join("a"),
            checkpoint: etlantic_core::storage::open(&fx.checkpoint),
            memory_limit_bytes: 16 << 20,
            snapshot_every: None,
        },
        SnapshotPolicy {
            max_versions: 1_000_000,
            changelog_share: 0.5,
            min_changelog_bytes: 0,
        },
    )
    .unwrap();
    put_range(&mut s, 0, 5000, "first");
    commit(&mut s, 1);
    assert_eq!(fx.files("snapshot"), ["1.json".to_string()].into());
    let first = snapshot::read_manifest(s.storage(), "snapshot/1.json")
        .unwrap()
        .unwrap()
        .bytes();
    let mut since = 0;
    for v in 2..10_000u64 {
        let from = 5000 + v as u32 * 20;
        put_range(&mut s, from, from + 20, "more");
        let stats = commit(&mut s, v);
        since += stats.bytes_uploaded;
        if fx.files("snapshot").len() > 1 {
            assert!(since * 2 >= first, "{since} of {first}");
            assert!(
                (since - stats.bytes_uploaded) * 2 < first,
                "{since} of {first}"
            );
            assert_eq!(fx.files("snapshot").len(), 2);
            return;
        }
    }
    panic!("no second snapshot");
}

/// A commit after a rollback that skips versions (as under a state checkpoint interval)
/// deletes every later version of the rolled-back run, not only those from its own
/// version on: retention then never picks one of them.
#[test]
fn a_rollback_that_skips_versions_leaves_nothing_of_the_old_run() {
    let fx = Fixture::new();
    let mut s = fx.open_with("a", 1);
    for v in 1..=3u32 {
        put_range(&mut s, v * 10, v * 10 + 10, "old");
        commit(&mut s, v as u64);
    }
    s.restore(Some(1)).unwrap();
    put_range(&mut s, 100, 110, "new");
    commit(&mut s, 5);
    assert_eq!(s.versions().unwrap(), vec![1, 5]);
    assert_eq!(
        fx.files("snapshot"),
        ["1.json", "5.json"].map(String::from).into()
    );
    assert_eq!(
        fx.files("changelog"),
        ["1.log", "5.log"].map(String::from).into()
    );
    s.retain(4).unwrap();
    let mut fresh = fx.open("b");
    fresh.restore(Some(5)).unwrap();
    let values: Vec<Vec<u8>> = all(&fresh).into_iter().map(|(_, v)| v).collect();
    assert_eq!(values.len(), 20);
    assert_eq!(values.iter().filter(|v| v.starts_with(b"old")).count(), 10);
}
