//! Checks a [`Storage`] implementation runs in its own tests: the part of the
//! [durability contract](super) every storage keeps alike, disks and object stores.

use super::{put_bytes, Storage};

/// Whole-file reads and writes under directory `w/` of `s` (which must not exist yet):
/// replacing puts, sizes, ranged reads, conditional creates, listings with their
/// [`super::FileMeta`], renames and deletes. Panics on the first broken promise.
pub fn whole_files(s: &dyn Storage) {
    assert_eq!(s.read("w/x").unwrap(), None);
    assert_eq!(s.size("w/x").unwrap(), None);
    assert_eq!(s.stat("w/x").unwrap(), None);
    assert_eq!(s.list("w").unwrap(), Vec::<String>::new());
    put_bytes(s, "w/x", b"one").unwrap();
    put_bytes(s, "w/x", b"two").unwrap();
    assert_eq!(s.read("w/x").unwrap().unwrap(), b"two");
    assert_eq!(s.size("w/x").unwrap(), Some(3));
    assert_eq!(s.read_range("w/x", 1, 2).unwrap(), b"wo");
    assert!(s.read_range("w/x", 2, 5).is_err(), "a range past the end");
    assert!(s.put_if_absent("w/y", b"first").unwrap());
    assert!(!s.put_if_absent("w/y", b"second").unwrap());
    assert_eq!(s.read("w/y").unwrap().unwrap(), b"first");
    put_bytes(s, "w/b/z", b"z").unwrap();
    assert_eq!(s.list("w").unwrap(), vec!["b/", "x", "y"]);
    // One listing tells each file's size, as asking for each does.
    let files = s.list_files("w").unwrap();
    assert_eq!(
        files
            .iter()
            .map(|(n, m)| (n.as_str(), m.size))
            .collect::<Vec<_>>(),
        vec![("x", 3), ("y", 5)]
    );
    for (name, listed) in &files {
        let now = s.stat(&format!("w/{name}")).unwrap().unwrap();
        assert!(listed.same_as(&now), "{name}: {listed:?} {now:?}");
    }
    s.rename("w/x", "w/v").unwrap();
    assert_eq!(s.read("w/x").unwrap(), None);
    assert_eq!(s.read("w/v").unwrap().unwrap(), b"two");
    s.delete("w/v").unwrap();
    s.delete("w/v").unwrap();
    s.delete_all(&["w/y".into(), "w/missing".into()]).unwrap();
    assert_eq!(s.list("w").unwrap(), vec!["b/"]);
}
