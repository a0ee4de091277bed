//! Directory streams: the seen-files log, maxFilesPerTrigger, restarts and replays.

mod common;

use common::*;
use etlantic_core::data::Offset;
use etlantic_core::plugin::{source_provider, ReadLimit, Source};
use etlantic_core::streaming::ExecutionMode;
use serde_json::json;
use std::path::Path;

// Links the crate so that its providers register themselves.
use etlantic_sources as _;

fn event_file(dir: &Path, name: &str, ids: &[i64]) {
    let text: String = ids
        .iter()
        .map(|i| format!("{{\"id\":{i},\"note\":\"{name}\"}}\n"))
        .collect();
    write(&dir.join(name), &text);
}

fn streaming(root: &Path, uri: &str, state: &Path) -> Box<dyn Source> {
    let c = contract(EVENTS);
    source_provider("file")
        .unwrap()
        .create(ctx(
            root,
            "events",
            uri,
            &c,
            ExecutionMode::Streaming,
            Some(state.to_path_buf()),
        ))
        .unwrap()
}

fn index(n: u64) -> Offset {
    Offset(json!({ "index": n }))
}

#[tokio::test]
async fn new_files_are_assigned_to_batches_at_most_max_files_at_a_time() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let input = root.join("in");
    let state = root.join("checkpoint/sources/0");
    event_file(&input, "a.jsonl", &[1, 2]);
    event_file(&input, "c.jsonl", &[5]);
    event_file(&input, "b.jsonl", &[3, 4]);
    // Ignored: hidden, underscore-prefixed, other extensions.
    event_file(&input, "_staging.jsonl", &[100]);
    event_file(&input, ".hidden.jsonl", &[101]);
    write(&input.join("notes.txt"), "not data");
    std::fs::create_dir_all(input.join("subdir.jsonl")).unwrap();

    let mut src = streaming(root, "file://in", &state);
    let two = ReadLimit {
        max_files: Some(2),
        max_records: None,
    };
    let o0 = src.latest_offset(None, &two).await.unwrap().unwrap();
    assert_eq!(o0, index(0));
    // The assignment is durable before the offset is handed out.
    let entry: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("0")).unwrap()).unwrap();
    let files: Vec<&str> = entry["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(files, vec!["a.jsonl", "b.jsonl"]);
    assert_eq!(entry["index"], 0);
    // Asking again from the same start does not assign more files.
    assert_eq!(src.latest_offset(None, &two).await.unwrap(), Some(index(0)));
    assert_eq!(ids(&src.read(None, &o0).await.unwrap()), vec![1, 2, 3, 4]);

    let o1 = src.latest_offset(Some(&o0), &two).await.unwrap().unwrap();
    assert_eq!(o1, index(1));
    assert_eq!(ids(&src.read(Some(&o0), &o1).await.unwrap()), vec![5]);
    // Nothing new: the start comes back.
    assert_eq!(
        src.latest_offset(Some(&o1), &two).await.unwrap(),
        Some(o1.clone())
    );

    // A changed file that was already seen is not read again; a new one is.
    event_file(&input, "a.jsonl", &[9, 9, 9]);
    event_file(&input, "d.jsonl", &[6]);
    let o2 = src.latest_offset(Some(&o1), &two).await.unwrap().unwrap();
    assert_eq!(o2, index(2));
    assert_eq!(ids(&src.read(Some(&o1), &o2).await.unwrap()), vec![6]);
    // Ranges spanning several indexes read all of them, in order.
    assert_eq!(ids(&src.read(Some(&o0), &o2).await.unwrap()), vec![5, 6]);
    let mut names: Vec<String> = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec!["0", "1", "2"],
        "no temporary files are left behind"
    );
}

#[tokio::test]
async fn a_restarted_source_replays_the_same_files_for_the_same_offsets() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let input = root.join("in");
    let state = root.join("state");
    event_file(&input, "1.jsonl", &[10]);
    event_file(&input, "2.jsonl", &[20]);
    event_file(&input, "3.jsonl", &[30]);
    let one = ReadLimit {
        max_files: Some(1),
        max_records: None,
    };
    let (o0, o1, first_read) = {
        let mut src = streaming(root, "file://in", &state);
        let o0 = src.latest_offset(None, &one).await.unwrap().unwrap();
        let o1 = src.latest_offset(Some(&o0), &one).await.unwrap().unwrap();
        let r = src.read(Some(&o0), &o1).await.unwrap();
        (o0, o1, ids(&r))
    };
    assert_eq!(first_read, vec![20]);
    // Files arriving while the query is down.
    event_file(&input, "0.jsonl", &[0]);

    let mut src = streaming(root, "file://in", &state);
    assert_eq!(ids(&src.read(None, &o0).await.unwrap()), vec![10]);
    assert_eq!(ids(&src.read(Some(&o0), &o1).await.unwrap()), first_read);
    assert_eq!(ids(&src.read(None, &o1).await.unwrap()), vec![10, 20]);
    // The runtime crashed after `latest_offset(o0)` persisted index 1 but before its WAL
    // recorded it: resuming from o0 hands out the logged index 1, not new files.
    assert_eq!(
        src.latest_offset(Some(&o0), &one).await.unwrap(),
        Some(o1.clone())
    );
    // Then new files, in name order, one at a time; seen files are never reassigned.
    let o2 = src.latest_offset(Some(&o1), &one).await.unwrap().unwrap();
    assert_eq!(ids(&src.read(Some(&o1), &o2).await.unwrap()), vec![0]);
    let o3 = src.latest_offset(Some(&o2), &one).await.unwrap().unwrap();
    assert_eq!(ids(&src.read(Some(&o2), &o3).await.unwrap()), vec![30]);
    assert_eq!(src.latest_offset(Some(&o3), &one).await.unwrap(), Some(o3));
}

#[tokio::test]
async fn offsets_from_elsewhere_are_refused_with_checkpoint_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    event_file(&root.join("in"), "a.jsonl", &[1]);
    let mut src = streaming(root, "file://in", &root.join("state"));
    let unlimited = ReadLimit::unlimited();
    let e = src
        .latest_offset(Some(&index(4)), &unlimited)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "ETL801");
    let e = src.read(None, &index(0)).await.unwrap_err();
    assert_eq!(e.code(), "ETL801");
    let e = src.read(None, &Offset(json!("garbage"))).await.unwrap_err();
    assert_eq!(e.code(), "ETL801");
}

#[tokio::test]
async fn a_missing_directory_streams_once_it_appears() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let mut src = streaming(root, "file://later", &root.join("state"));
    let unlimited = ReadLimit::unlimited();
    assert_eq!(src.latest_offset(None, &unlimited).await.unwrap(), None);
    event_file(&root.join("later"), "x.jsonl", &[7]);
    let o = src.latest_offset(None, &unlimited).await.unwrap().unwrap();
    assert_eq!(ids(&src.read(None, &o).await.unwrap()), vec![7]);
}

#[tokio::test]
async fn batch_mode_offsets_list_the_files_and_respect_the_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let input = root.join("in");
    event_file(&input, "b.jsonl", &[2]);
    event_file(&input, "a.jsonl", &[1]);
    event_file(&input, "c.jsonl", &[3]);
    write(&input.join("d"), "{\"id\":4}\n");
    let c = contract(EVENTS);
    let mut src = source_provider("file")
        .unwrap()
        .create(ctx(
            root,
            "events",
            "file://in",
            &c,
            ExecutionMode::Batch,
            None,
        ))
        .unwrap();
    let all = src
        .latest_offset(None, &ReadLimit::unlimited())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        all,
        Offset(json!({"files": ["a.jsonl", "b.jsonl", "c.jsonl"]}))
    );
    assert_eq!(ids(&src.read(None, &all).await.unwrap()), vec![1, 2, 3]);

    // With an explicit format, files without an extension are read as well; the
    // URI's max_files_per_trigger applies.
    let mut src = source_provider("file")
        .unwrap()
        .create(ctx(
            root,
            "events",
            "file://in?format=jsonl&max_files_per_trigger=2",
            &c,
            ExecutionMode::Batch,
            None,
        ))
        .unwrap();
    let unlimited = ReadLimit::unlimited();
    let first = src.latest_offset(None, &unlimited).await.unwrap().unwrap();
    assert_eq!(first, Offset(json!({"files": ["a.jsonl", "b.jsonl"]})));
    let second = src
        .latest_offset(Some(&first), &unlimited)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        second,
        Offset(json!({"files": ["a.jsonl", "b.jsonl", "c.jsonl", "d"]}))
    );
    assert_eq!(
        src.latest_offset(Some(&second), &unlimited).await.unwrap(),
        Some(second.clone())
    );
    assert_eq!(
        ids(&src.read(Some(&first), &second).await.unwrap()),
        vec![3, 4]
    );

    // An empty directory has no offset.
    std::fs::create_dir_all(root.join("empty")).unwrap();
    let mut src = source_provider("file")
        .unwrap()
        .create(ctx(
            root,
            "events",
            "file://empty",
            &c,
            ExecutionMode::Batch,
            None,
        ))
        .unwrap();
    assert_eq!(src.latest_offset(None, &unlimited).await.unwrap(), None);
}

#[tokio::test]
async fn a_directory_can_mix_formats_by_extension() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let input = root.join("mixed");
    event_file(&input, "a.jsonl", &[1]);
    write(&input.join("b.csv"), "id,note\n2,csv\n");
    let c = contract(EVENTS);
    let mut src = source_provider("file")
        .unwrap()
        .create(ctx(
            root,
            "events",
            "file://mixed",
            &c,
            ExecutionMode::Batch,
            None,
        ))
        .unwrap();
    assert_eq!(ids(&read_all(&mut src).await), vec![1, 2]);
}

/// The next micro-batch's files are decoded ahead. A read ahead is used only when the
/// next read asks for exactly those files: a file that arrives between and sorts first
/// changes the next batch, and the read then returns what that batch holds. Without
/// reading ahead (the default) the reads are the same.
#[tokio::test]
async fn read_ahead_never_changes_what_a_batch_reads() {
    for uri in ["file://in?read_ahead=true", "file://in"] {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let input = root.join("in");
        let state = root.join("checkpoint/sources/0");
        event_file(&input, "b.jsonl", &[1, 2]);
        event_file(&input, "d.jsonl", &[3]);
        event_file(&input, "f.jsonl", &[4, 5]);
        let one = ReadLimit {
            max_files: Some(1),
            max_records: None,
        };
        let mut src = streaming(root, uri, &state);
        let o0 = src.latest_offset(None, &one).await.unwrap().unwrap();
        assert_eq!(
            ids(&src.read(None, &o0).await.unwrap()),
            vec![1, 2],
            "{uri}"
        );
        // `d.jsonl` is being read ahead; the next batch gets it.
        let o1 = src.latest_offset(Some(&o0), &one).await.unwrap().unwrap();
        assert_eq!(
            ids(&src.read(Some(&o0), &o1).await.unwrap()),
            vec![3],
            "{uri}"
        );
        // `f.jsonl` is being read ahead, but `e.jsonl` arrives and sorts first.
        event_file(&input, "e.jsonl", &[6]);
        let o2 = src.latest_offset(Some(&o1), &one).await.unwrap().unwrap();
        assert_eq!(
            ids(&src.read(Some(&o1), &o2).await.unwrap()),
            vec![6],
            "{uri}"
        );
        let o3 = src.latest_offset(Some(&o2), &one).await.unwrap().unwrap();
        assert_eq!(
            ids(&src.read(Some(&o2), &o3).await.unwrap()),
            vec![4, 5],
            "{uri}"
        );
        // A replay of an earlier batch reads its own files.
        assert_eq!(
            ids(&src.read(Some(&o0), &o1).await.unwrap()),
            vec![3],
            "{uri}"
        );
        assert_eq!(src.latest_offset(Some(&o3), &one).await.unwrap(), Some(o3));
    }
}

/// A file that changes after the stream picked it up — appended, truncated, rewritten
/// with the same size, deleted — is never read with other bytes than the first read: the
/// read returns it as one ETL713 record naming the file, with none of its rows; the other
/// files of the batch are read. The check runs on replays and on reads ahead too.
#[tokio::test]
async fn a_file_changed_after_it_was_picked_up_is_rejected_not_reread() {
    type Change = fn(&Path);
    let changes: [(&str, Change, &str); 4] = [
        (
            "appended",
            |p| {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
                f.write_all(b"{\"id\":99,\"note\":\"late\"}\n").unwrap();
            },
            "grew from",
        ),
        (
            "truncated",
            |p| {
                let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
                f.set_len(5).unwrap();
            },
            "shrank from",
        ),
        (
            "rewritten",
            |p| {
                let len = std::fs::metadata(p).unwrap().len() as usize;
                let text = format!("{{\"id\":7,\"note\":\"{}\"}}\n", "z".repeat(len - 19));
                assert_eq!(text.len(), len);
                std::fs::write(p, text).unwrap();
                let f = std::fs::File::options().write(true).open(p).unwrap();
                f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
                    .unwrap();
            },
            "was rewritten",
        ),
        (
            "deleted",
            |p| std::fs::remove_file(p).unwrap(),
            "was deleted",
        ),
    ];
    for read_ahead in [false, true] {
        for (label, change, reason) in changes {
            let label = format!("{label}, read_ahead={read_ahead}");
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path();
            let input = root.join("in");
            let state = root.join("checkpoint/sources/0");
            event_file(&input, "a.jsonl", &[1, 2]);
            event_file(&input, "b.jsonl", &[3, 4]);
            event_file(&input, "c.jsonl", &[5]);
            let uri = format!("file://in?read_ahead={read_ahead}");
            let mut src = streaming(root, &uri, &state);
            let one = ReadLimit {
                max_files: Some(2),
                max_records: None,
            };
            let o0 = src.latest_offset(None, &one).await.unwrap().unwrap();
            let first = src.read(None, &o0).await.unwrap();
            assert_eq!(ids(&first), vec![1, 2, 3, 4], "{label}");
            // b.jsonl changes after its batch read it; c.jsonl after it was assigned (and,
            // with read_ahead, while it is being read ahead).
            let o1 = src.latest_offset(Some(&o0), &one).await.unwrap().unwrap();
            change(&input.join("b.jsonl"));
            change(&input.join("c.jsonl"));
            let next = src.read(Some(&o0), &o1).await.unwrap();
            assert!(ids(&next).is_empty(), "{label}: {:?}", ids(&next));
            assert_eq!(next.rejected.len(), 1, "{label}");
            let r = &next.rejected[0];
            assert_eq!(r.code, "ETL713", "{label}");
            assert_eq!(r.position.file.as_deref(), Some("in/c.jsonl"), "{label}");
            assert!(r.reason.contains(reason), "{label}: {}", r.reason);
            assert!(r.raw.is_empty());
            // A replay of the first batch after a restart: a.jsonl as before, b.jsonl
            // rejected.
            drop(src);
            let mut src = streaming(root, &uri, &state);
            let replay = src.read(None, &o0).await.unwrap();
            assert_eq!(ids(&replay), vec![1, 2], "{label}");
            assert_eq!(replay.rejected.len(), 1, "{label}");
            assert_eq!(
                replay.rejected[0].position.file.as_deref(),
                Some("in/b.jsonl")
            );
        }
    }
}
