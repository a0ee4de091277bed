//! Binding URIs: `scheme://location?key=value&...`.
//!
//! We parse URIs ourselves instead of with `url`, because `file://data/orders.jsonl` must
//! mean the *relative* path `data/orders.jsonl` (WHATWG URL parsing would read `data` as a
//! host), and because secret references like `${env:PASSWORD}` must survive unchanged
//! until run time.

use crate::diagnostics::{codes, Diagnostic, Error, Result};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A parsed binding URI.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingUri {
    /// Lower-case scheme, e.g. `file`, `kafka`, `memory`.
    pub scheme: String,
    /// Everything between `://` and `?`, unchanged (may hold `${env:NAME}` references).
    pub location: String,
    /// Query parameters in the order written.
    pub params: IndexMap<String, String>,
}

impl BindingUri {
    /// Parses `scheme://location?k=v&k2=v2`.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::from(Diagnostic::new(
                &codes::BAD_URI,
                format!("cannot parse binding URI `{}`: {why}", redact(text)),
            ))
        };
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| bad("missing `scheme://`"))?;
        if scheme.is_empty()
            || !scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.')
        {
            return Err(bad("the scheme must be letters, digits, `+`, `-` or `.`"));
        }
        let (location, query) = match rest.split_once('?') {
            Some((l, q)) => (l, Some(q)),
            None => (rest, None),
        };
        let mut params = IndexMap::new();
        if let Some(q) = query {
            for pair in q.split('&').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                if k.is_empty() {
                    return Err(bad("empty parameter name"));
                }
                params.insert(percent_decode(k), percent_decode(v));
            }
        }
        Ok(BindingUri {
            scheme: scheme.to_ascii_lowercase(),
            location: location.to_string(),
            params,
        })
    }

    /// A parameter's value.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.params.get(key).map(String::as_str)
    }

    /// The URI with the user-info password (if any) replaced by `***`.
    pub fn redacted(&self) -> String {
        redact(&self.to_string())
    }
}

impl fmt::Display for BindingUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme, self.location)?;
        for (i, (k, v)) in self.params.iter().enumerate() {
            write!(f, "{}{}={}", if i == 0 { '?' } else { '&' }, k, v)?;
        }
        Ok(())
    }
}

/// Hides a plain-text password in `scheme://user:password@host` form.
pub fn redact(text: &str) -> String {
    if let Some((scheme, rest)) = text.split_once("://") {
        let authority_end = rest.find('/').unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        if let Some(at) = authority.rfind('@') {
            let userinfo = &authority[..at];
            if let Some((user, pw)) = userinfo.split_once(':') {
                if !is_secret_reference(pw) {
                    return format!("{scheme}://{user}:***{}", &rest[at..]);
                }
            }
        }
    }
    text.to_string()
}

/// Whether the URI's user-info carries a literal password (not a `${...}` reference).
pub fn has_plain_password(text: &str) -> bool {
    redact(text) != text
}

/// Whether `s` is exactly one secret reference `${env:NAME}` / `${secret:NAME}`.
pub fn is_secret_reference(s: &str) -> bool {
    s.starts_with("${") && s.ends_with('}') && s[2..s.len() - 1].contains(':')
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_file_uri_keeps_its_path() {
        let u = BindingUri::parse("file://data/orders.csv?format=csv&header=true").unwrap();
        assert_eq!(u.scheme, "file");
        assert_eq!(u.location, "data/orders.csv");
        assert_eq!(u.param("header"), Some("true"));
        assert_eq!(
            u.to_string(),
            "file://data/orders.csv?format=csv&header=true"
        );
    }

    #[test]
    fn bad_uris_have_a_code() {
        let e = BindingUri::parse("data/orders.csv").unwrap_err();
        assert_eq!(e.code(), "ETL007");
        assert!(BindingUri::parse("://x").is_err());
    }

    #[test]
    fn passwords_are_redacted_but_references_are_not() {
        assert_eq!(
            redact("postgres://bob:hunter2@db:5432/x"),
            "postgres://bob:***@db:5432/x"
        );
        assert!(has_plain_password("postgres://bob:hunter2@db/x"));
        assert!(!has_plain_password("postgres://bob:${env:PGPASS}@db/x"));
        assert!(!has_plain_password("file://a/b:c@d"));
    }

    #[test]
    fn percent_decoding() {
        let u = BindingUri::parse("memory://x?name=a%20b&q=c+d").unwrap();
        assert_eq!(u.param("name"), Some("a b"));
        assert_eq!(u.param("q"), Some("c d"));
    }
}

/// The absolute form of `path` with `.` and `..` removed lexically (symlinks are not
/// resolved and the path need not exist). Table formats address their files by URL, in
/// which a `..` segment is illegal, so a binding like `delta://../tables/x` must be
/// normalised before it becomes one.
pub fn absolute_normalized(path: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    use std::path::Component;
    let abs = std::path::absolute(path)?;
    let mut out = std::path::PathBuf::new();
    for c in abs.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod normalize_tests {
    #[test]
    fn dot_dot_is_removed_lexically() {
        let p = super::absolute_normalized(std::path::Path::new("/a/b/../c/./d")).unwrap();
        assert_eq!(p, std::path::PathBuf::from("/a/c/d"));
    }
}
