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

    /// The URI with its credentials (see [`redact`]) replaced by `***`.
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

/// Whether an option named `key` holds a credential: one of its words (split at `.`,
/// `_`, `-` and lower-to-upper case changes) is `password`, `passwd`, `pwd`,
/// `passphrase`, `secret`, `token`, `credential(s)`, `apikey`, `accesskey`, `secretkey`
/// or `privatekey`, or it is `key` right after `api`, `access`, `private`, `secret`,
/// `account`, `auth`, `client`, `sas`, `sasl`, `shared`, `master` or `encryption`
/// (`api_key`, `sasl.key`... are credentials; a Kafka record `key` column, upsert `keys`
/// or `ssl.key.location` are not). A name ending in `location`, `file`, `filename` or
/// `path` says where a credential is kept, not what it is.
pub fn is_credential_key(key: &str) -> bool {
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut prev_lower = false;
    for c in key.chars() {
        if matches!(c, '.' | '_' | '-' | ' ') {
            if !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            prev_lower = false;
            continue;
        }
        if c.is_ascii_uppercase() && prev_lower {
            words.push(std::mem::take(&mut word));
        }
        prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        word.push(c.to_ascii_lowercase());
    }
    if !word.is_empty() {
        words.push(word);
    }
    if words
        .last()
        .is_some_and(|w| matches!(w.as_str(), "location" | "file" | "path" | "filename"))
    {
        return false;
    }
    words.iter().enumerate().any(|(i, w)| {
        matches!(
            w.as_str(),
            "password"
                | "passwd"
                | "pwd"
                | "passphrase"
                | "secret"
                | "token"
                | "credential"
                | "credentials"
                | "apikey"
                | "accesskey"
                | "secretkey"
                | "privatekey"
        ) || (w == "key"
            && i > 0
            && matches!(
                words[i - 1].as_str(),
                "api"
                    | "access"
                    | "private"
                    | "secret"
                    | "account"
                    | "auth"
                    | "client"
                    | "sas"
                    | "sasl"
                    | "shared"
                    | "master"
                    | "encryption"
            ))
    })
}

/// Where a URI holds a credential in plain text (not a `${...}` reference): `password`
/// for `scheme://user:password@host`, the option's name for `?name=value` and
/// `;name=value` (Spark Connect's `sc://host/;token=...`) options named like a credential
/// ([`is_credential_key`]). Empty when there is none.
pub fn plain_credentials(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    scan(text, &mut |what, value| {
        if !is_secret_reference(value) && !value.is_empty() {
            found.push(what.to_string());
        }
        None
    });
    found
}

/// The URI with every credential it holds in plain text replaced by `***`: the password
/// of `scheme://user:password@host` and the values of options named like credentials
/// (`?kafka.sasl.password=...`, `;token=...`). `${...}` references stay as they are.
pub fn redact(text: &str) -> String {
    scan(text, &mut |_, value| {
        (!is_secret_reference(value) && !value.is_empty()).then(|| "***".to_string())
    })
}

/// Whether the URI holds a credential in plain text (see [`plain_credentials`]).
pub fn has_plain_password(text: &str) -> bool {
    !plain_credentials(text).is_empty()
}

/// Walks the credentials of a URI, calling `visit(what, value)` for each; a returned
/// value replaces it. Returns the text with the replacements made.
fn scan(text: &str, visit: &mut dyn FnMut(&str, &str) -> Option<String>) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_string();
    };
    let (location, query) = match rest.split_once('?') {
        Some((l, q)) => (l, Some(q)),
        None => (rest, None),
    };
    // The user-info password.
    let authority_end = location.find('/').unwrap_or(location.len());
    let authority = &location[..authority_end];
    let mut loc = location.to_string();
    if let Some(at) = authority.rfind('@') {
        if let Some((user, pw)) = authority[..at].split_once(':') {
            if let Some(r) = visit("password", pw) {
                loc = format!("{user}:{r}{}", &location[at..]);
            }
        }
    }
    // `;name=value` options of the path (Spark Connect).
    if loc.contains(';') {
        let mut parts = loc.split(';');
        let mut rebuilt = parts.next().unwrap_or_default().to_string();
        for part in parts {
            rebuilt.push(';');
            match part.split_once('=') {
                Some((k, v)) if is_credential_key(k) => {
                    rebuilt.push_str(k);
                    rebuilt.push('=');
                    rebuilt.push_str(&visit(k, v).unwrap_or_else(|| v.to_string()));
                }
                _ => rebuilt.push_str(part),
            }
        }
        loc = rebuilt;
    }
    let mut out = format!("{scheme}://{loc}");
    if let Some(q) = query {
        out.push('?');
        let pairs: Vec<String> = q
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, v)) if is_credential_key(&percent_decode(k)) => {
                    match visit(&percent_decode(k), &percent_decode(v)) {
                        Some(r) => format!("{k}={r}"),
                        None => pair.to_string(),
                    }
                }
                _ => pair.to_string(),
            })
            .collect();
        out.push_str(&pairs.join("&"));
    }
    out
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
    fn credentials_in_options_and_spark_tokens_are_found_and_redacted() {
        let t = "kafka://b:9092/t?format=json&kafka.sasl.password=hunter2&key=user&kafka.ssl.key.location=/k.pem";
        assert_eq!(plain_credentials(t), vec!["kafka.sasl.password"]);
        assert_eq!(
            redact(t),
            "kafka://b:9092/t?format=json&kafka.sasl.password=***&key=user&kafka.ssl.key.location=/k.pem"
        );
        let sc = "sc://spark:15002/;token=abc123;user_id=me";
        assert_eq!(plain_credentials(sc), vec!["token"]);
        assert_eq!(redact(sc), "sc://spark:15002/;token=***;user_id=me");
        // References are not credentials in plain text, and stay visible.
        for ok in [
            "sc://spark:15002/;token=${secret:spark}",
            "kafka://b/t?kafka.sasl.password=${env:PW}",
            "postgres://u:${secret:pw}@db/x?sslmode=require",
            "postgres://db/x?table=t&mode=upsert&keys=a,b",
            "kafka://b/t?key=user_id",
        ] {
            assert!(plain_credentials(ok).is_empty(), "{ok}");
            assert_eq!(redact(ok), ok);
        }
        assert_eq!(
            plain_credentials(
                "s3://b/p?aws_secret_access_key=x&apiKey=y&X-Auth-Token=z&ssl.key.password=w"
            ),
            vec![
                "aws_secret_access_key",
                "apiKey",
                "X-Auth-Token",
                "ssl.key.password"
            ]
        );
        assert_eq!(
            plain_credentials("postgres://bob:hunter2@db/x?password=p"),
            vec!["password", "password"]
        );
        for not in [
            "key",
            "keys",
            "primary_key",
            "key_column",
            "ssl.keystore.location",
            "ssl.key.location",
            "tokenizer",
        ] {
            assert!(!is_credential_key(not), "{not}");
        }
        for yes in [
            "sasl.password",
            "api_key",
            "apiKey",
            "sasl.oauthbearer.client.secret",
            "accessToken",
            "sas_token",
            "privateKey",
        ] {
            assert!(is_credential_key(yes), "{yes}");
        }
    }

    #[test]
    fn percent_decoding() {
        let u = BindingUri::parse("memory://x?name=a%20b&q=c+d").unwrap();
        assert_eq!(u.param("name"), Some("a b"));
        assert_eq!(u.param("q"), Some("c d"));
    }
}

/// `location` resolved against the project root `root`: itself when absolute, else
/// joined to `root`. Every relative location of a pipeline (bindings, quarantine,
/// checkpoint, region locations) resolves this way.
pub fn located(root: &std::path::Path, location: &str) -> std::path::PathBuf {
    let p = std::path::Path::new(location);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        root.join(p)
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
