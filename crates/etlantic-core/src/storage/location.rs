//! Locations: a local directory or an object-store URL, and the providers that open them.
//!
//! Everywhere a pipeline names a place for its bytes (the checkpoint, a file source or
//! sink, the quarantine, a table), the text is a [`Location`]: a local path (`file://x`,
//! a bare path, relative ones joined to the project root) or a URL whose scheme a linked
//! [`StorageProvider`] serves (`s3://bucket/prefix` through `etlantic-object-store`).
//! [`open_location`] turns one into a [`Storage`].

use super::{open, Storage};
use crate::diagnostics::{codes, Error, Result};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Options of the object stores a run reaches, from the profile's `storage_options`
/// (secrets already resolved): `endpoint`, `region`, `access_key_id`,
/// `secret_access_key`, `session_token`, `allow_http`, … A provider documents the keys it
/// reads; options it does not know are refused by it with a diagnostic. Values here may be
/// credentials: never print them.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StorageOptions(pub BTreeMap<String, String>);

impl StorageOptions {
    /// The options of `map`.
    pub fn new(map: BTreeMap<String, String>) -> Self {
        StorageOptions(map)
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
}

impl fmt::Debug for StorageOptions {
    // Keys only: values may be credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// Where a directory of files is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// A directory of the local file system (absolute).
    Local(PathBuf),
    /// A prefix of an object store: `scheme://bucket/prefix` (no trailing `/`).
    Remote(url::Url),
}

/// The object-store schemes connectors that read and write files accept besides `file`
/// (served by the storage provider linked for them, `etlantic-object-store`).
pub const OBJECT_SCHEMES: &[&str] = &["s3", "s3a", "gs", "az", "abfs", "abfss"];

/// The schemes a location may have besides `file`: object stores.
fn remote_scheme(scheme: &str) -> bool {
    !matches!(scheme, "file" | "")
}

impl Location {
    /// Parses `text`: `file://path`, a bare path (both resolved against `root` when
    /// relative), or `scheme://bucket/prefix` for an object store. `ETL007` for text that
    /// is neither (a URL without a bucket, a query string or fragment in a location).
    pub fn parse(text: &str, root: &Path) -> Result<Location> {
        let bad = |why: &str| {
            Error::new(
                &codes::BAD_URI,
                format!("`{text}` is not a location: {why}"),
            )
        };
        match text.split_once("://") {
            None => Ok(Location::Local(crate::uri::located(root, text))),
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("file") => {
                if rest.is_empty() {
                    return Err(bad("the path is empty"));
                }
                Ok(Location::Local(crate::uri::located(root, rest)))
            }
            Some((scheme, _)) if remote_scheme(&scheme.to_ascii_lowercase()) => {
                let url = url::Url::parse(text).map_err(|e| bad(&e.to_string()))?;
                if url.host_str().is_none_or(str::is_empty) {
                    return Err(bad("it names no bucket (write scheme://bucket/prefix)"));
                }
                if url.query().is_some() || url.fragment().is_some() {
                    return Err(bad("a location has no query string or fragment"));
                }
                if !url.username().is_empty() || url.password().is_some() {
                    return Err(bad(
                        "credentials go in the profile's storage_options, not the location",
                    ));
                }
                Ok(Location::Remote(trimmed(url)))
            }
            Some(_) => Err(bad("the scheme is empty")),
        }
    }

    /// The location a file connector's binding names: `file://path` resolved against
    /// `root`, or `scheme://bucket/prefix` (without the binding's query string).
    pub fn of_binding(uri: &crate::uri::BindingUri, root: &Path) -> Result<Location> {
        if uri.scheme == "file" {
            return Ok(Location::Local(crate::uri::located(root, &uri.location)));
        }
        Location::parse(
            &format!("{}://{}", uri.scheme, uri.location.trim_end_matches('/')),
            root,
        )
    }

    /// The directory this location is in and its last segment's name (a file's
    /// directory and name).
    pub fn parent_and_name(&self) -> (Location, String) {
        match self {
            Location::Local(path) => (
                Location::Local(path.parent().unwrap_or(Path::new(".")).to_path_buf()),
                path.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
            Location::Remote(url) => {
                let (parent, name) = url
                    .path()
                    .rsplit_once('/')
                    .map(|(p, n)| (p.to_string(), n.to_string()))
                    .unwrap_or_default();
                let mut parent_url = url.clone();
                parent_url.set_path(&parent);
                (Location::Remote(parent_url), name)
            }
        }
    }

    /// A table's or warehouse's location as a binding writes it: a path (relative to
    /// `root` or absolute), `file://path`, or an object-store URL of one of
    /// [`OBJECT_SCHEMES`]; `ETL007` for any other scheme.
    pub fn parse_path_or_object(text: &str, root: &Path) -> Result<Location> {
        if !text.contains("://") {
            return Ok(Location::Local(crate::uri::located(root, text)));
        }
        let parsed = Location::parse(text, root)?;
        if parsed.is_remote() && !OBJECT_SCHEMES.contains(&parsed.scheme()) {
            return Err(Error::new(
                &codes::BAD_URI,
                format!(
                    "`{text}` is not a location: `{}://` is neither a path nor an object store (s3://, gs://, az://)",
                    parsed.scheme()
                ),
            ));
        }
        Ok(parsed)
    }

    /// The local directory, if it is one.
    pub fn as_local(&self) -> Option<&Path> {
        match self {
            Location::Local(p) => Some(p),
            Location::Remote(_) => None,
        }
    }

    /// Whether it is on an object store.
    pub fn is_remote(&self) -> bool {
        matches!(self, Location::Remote(_))
    }

    /// The location `sub` (a `/`-separated relative path) inside this one.
    pub fn join(&self, sub: &str) -> Location {
        let sub = sub.trim_matches('/');
        if sub.is_empty() {
            return self.clone();
        }
        match self {
            Location::Local(p) => Location::Local(p.join(sub)),
            Location::Remote(u) => {
                let mut u = u.clone();
                let path = format!("{}/{sub}", u.path().trim_end_matches('/'));
                u.set_path(&path);
                Location::Remote(u)
            }
        }
    }

    /// The scheme: `file` or the object store's.
    pub fn scheme(&self) -> &str {
        match self {
            Location::Local(_) => "file",
            Location::Remote(u) => u.scheme(),
        }
    }
}

impl From<PathBuf> for Location {
    fn from(p: PathBuf) -> Self {
        Location::Local(p)
    }
}

impl From<&Path> for Location {
    fn from(p: &Path) -> Self {
        Location::Local(p.to_path_buf())
    }
}

impl From<&PathBuf> for Location {
    fn from(p: &PathBuf) -> Self {
        Location::Local(p.clone())
    }
}

fn trimmed(mut url: url::Url) -> url::Url {
    let path = url.path().trim_end_matches('/').to_string();
    url.set_path(&path);
    url
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            Location::Remote(u) => write!(f, "{u}"),
        }
    }
}

/// Opens object-store locations of some URL schemes (registered with
/// [`StorageRegistration`] through `inventory`).
///
/// An implementation's [`Storage`] keeps the [durability contract](super) for whole
/// objects: `put` and `put_if_absent` are atomic (an object is whole or absent) and
/// durable when they return, `put_if_absent` is a conditional create that two writers
/// cannot both win (S3's `If-None-Match: *`), reads see every completed write, and a
/// listing shows every object written before it. It does not append
/// ([`Storage::appends`] is `false`; callers then write an object per record), its
/// `rename` is a copy then a delete (not atomic), and its [`Storage::lock`] is a lease
/// (see the provider's docs): the conditional creates of the checkpoint's log are what
/// keeps two writers from committing the same micro-batch.
pub trait StorageProvider: Send + Sync {
    /// The URL schemes it serves (`s3`, `gs`, …), lower case.
    fn schemes(&self) -> &'static [&'static str];

    /// The storage rooted at `url` (`scheme://bucket/prefix`). Cheap and offline: errors
    /// in the options are reported here, unreachable stores on first use or by
    /// [`StorageProvider::check`].
    fn open(&self, url: &url::Url, options: &StorageOptions) -> Result<Arc<dyn Storage>>;

    /// Checks that `url` can be used: the endpoint answers, the bucket exists, the
    /// credentials are accepted and, when `conditional` is set, the store honours
    /// conditional creates. A coded diagnostic naming the location otherwise. May write
    /// and delete a small object under the location.
    fn check(&self, url: &url::Url, options: &StorageOptions, conditional: bool) -> Result<()>;
}

/// Registers a [`StorageProvider`]: `inventory::submit! { StorageRegistration(&MyProvider) }`.
pub struct StorageRegistration(pub &'static dyn StorageProvider);

inventory::collect!(StorageRegistration);

/// The provider linked for `scheme`, if any.
pub fn provider(scheme: &str) -> Option<&'static dyn StorageProvider> {
    inventory::iter::<StorageRegistration>
        .into_iter()
        .map(|r| r.0)
        .find(|p| p.schemes().iter().any(|s| s.eq_ignore_ascii_case(scheme)))
}

fn provider_for(url: &url::Url) -> Result<&'static dyn StorageProvider> {
    provider(url.scheme()).ok_or_else(|| {
        Error::new(
            &codes::BAD_URI,
            format!(
                "no storage for `{}://` locations is linked into this program (at {url})",
                url.scheme()
            ),
        )
        .with_help(
            "Build etlantic with the `object-store` feature (it serves s3://, gs:// and az://), or use a file:// location.",
        )
    })
}

/// The storage of `location`: the local disk (or a test [`super::mount`]) for a local
/// one, the linked provider's for a remote one.
pub fn open_location(location: &Location, options: &StorageOptions) -> Result<Arc<dyn Storage>> {
    match location {
        Location::Local(p) => Ok(open(p)),
        Location::Remote(u) => provider_for(u)?.open(u, options),
    }
}

/// Checks `location` as [`StorageProvider::check`] does; local locations need nothing.
pub fn check_location(
    location: &Location,
    options: &StorageOptions,
    conditional: bool,
) -> Result<()> {
    match location {
        Location::Local(_) => Ok(()),
        Location::Remote(u) => provider_for(u)?.check(u, options, conditional),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_and_join() {
        let root = Path::new("/project");
        assert_eq!(
            Location::parse("file://out/x", root).unwrap(),
            Location::Local("/project/out/x".into())
        );
        assert_eq!(
            Location::parse("/abs/x", root).unwrap(),
            Location::Local("/abs/x".into())
        );
        let s3 = Location::parse("s3://bucket/a/b/", root).unwrap();
        assert_eq!(s3.to_string(), "s3://bucket/a/b");
        assert_eq!(s3.join("log/1").to_string(), "s3://bucket/a/b/log/1");
        assert!(s3.is_remote());
        assert_eq!(
            Location::parse("s3://bucket", root)
                .unwrap()
                .join("x")
                .to_string(),
            "s3://bucket/x"
        );
        for bad in ["s3:///nobucket", "s3://b/p?x=1", "s3://k:s@b/p", "file://"] {
            assert_eq!(
                Location::parse(bad, root).unwrap_err().code(),
                "ETL007",
                "{bad}"
            );
        }
    }

    #[test]
    fn an_unlinked_scheme_is_a_diagnostic() {
        let loc = Location::parse("zz://bucket/p", Path::new("/")).unwrap();
        let e = open_location(&loc, &StorageOptions::default()).unwrap_err();
        assert_eq!(e.code(), "ETL007");
        assert!(e.to_string().contains("zz://"), "{e}");
    }

    #[test]
    fn options_never_print_their_values() {
        let o = StorageOptions::new([("secret_access_key".into(), "hunter2".into())].into());
        assert!(!format!("{o:?}").contains("hunter2"));
    }
}
