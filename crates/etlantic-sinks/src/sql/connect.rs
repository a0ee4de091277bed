//! Where the sink connects: PostgreSQL connect options parsed from the binding's
//! location (password kept out of messages), SQLite options for a file.

use super::bad_uri;
use etlantic_core::diagnostics::Result;
use etlantic_core::uri::BindingUri;
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::sqlite::{SqliteConnectOptions, SqliteSynchronous};
use std::path::Path;
use std::str::FromStr;

/// Where to connect, parsed from the binding's location.
#[derive(Clone)]
pub(crate) enum Target {
    Postgres(Box<PgConnectOptions>),
    Sqlite(Box<SqliteConnectOptions>),
}

/// Parses `[user[:password]@]host[:port]/database`. The password is taken literally (a
/// resolved secret); the last `@` ends the user info, so the password may hold `@`.
pub(crate) fn pg_options(uri: &BindingUri, ssl_mode: Option<&str>) -> Result<PgConnectOptions> {
    let loc = uri.location.as_str();
    let (userinfo, rest) = match loc.rfind('@') {
        Some(at) => (Some(&loc[..at]), &loc[at + 1..]),
        None => (None, loc),
    };
    let (hostport, database) = rest.split_once('/').unwrap_or((rest, ""));
    if hostport.is_empty() {
        return Err(bad_uri(uri, "a PostgreSQL binding needs a host"));
    }
    let database = database.trim_end_matches('/');
    if database.is_empty() || database.contains('/') {
        return Err(bad_uri(
            uri,
            "a PostgreSQL binding needs a database: postgres://user@host:port/database",
        ));
    }
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .map_err(|_| bad_uri(uri, format!("port `{p}` is not a number")))?,
        ),
        None => (hostport, 5432),
    };
    let mut o = PgConnectOptions::new_without_pgpass()
        .host(host)
        .port(port)
        .database(database)
        .application_name("etlantic")
        .options([("TimeZone", "UTC")]);
    if let Some(info) = userinfo {
        let (user, password) = match info.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (info, None),
        };
        if !user.is_empty() {
            o = o.username(user);
        }
        if let Some(p) = password {
            o = o.password(p);
        }
    }
    if let Some(m) = ssl_mode {
        o = o.ssl_mode(PgSslMode::from_str(m).map_err(|_| bad_uri(uri, "bad sslmode"))?);
    }
    Ok(o)
}

/// How messages name a target: never with its password.
pub(crate) fn describe_target(uri: &BindingUri) -> String {
    let loc = match uri.location.rfind('@') {
        Some(at) => {
            let user = uri.location[..at].split(':').next().unwrap_or("");
            format!("{user}@{}", &uri.location[at + 1..])
        }
        None => uri.location.clone(),
    };
    format!("{}://{loc}", uri.scheme)
}

pub(super) fn sqlite_options(path: &Path) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(std::time::Duration::from_secs(30))
}
