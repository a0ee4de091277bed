//! Where SQL regions run: the database each step on an SQL backend is bound to, and
//! the sources such a region reads in place instead of through the source.

use super::Planner;
use etlantic_core::diagnostics::{codes, Diagnostic};
use etlantic_core::streaming::ExecutionMode;

impl Planner<'_> {
    /// Binds every step on a backend that runs inside another system (an SQL backend)
    /// to the database it runs in: the binding of a source it reads directly, else of a
    /// sink it feeds directly, whose scheme the backend declares, else the database of
    /// an input computed on the same backend. A step with none of these runs in a
    /// private database when the backend has one (SQLite in memory), otherwise it is an
    /// error (`ETL506`).
    pub(super) fn region_locations(&mut self) {
        let pl = self.p.pipeline.clone();
        for id in self.order.clone() {
            let Some(backend) = self.backend_of.get(&id).copied() else {
                continue;
            };
            let schemes = backend.capabilities().location_schemes;
            if schemes.is_empty() {
                continue;
            }
            let t = pl.transform(&id).expect("ordered transforms exist");
            let from_sources = t
                .inputs
                .values()
                .filter_map(|r| pl.source(r.from()))
                .map(|s| s.asset.clone());
            let from_sinks = pl
                .sinks
                .iter()
                .filter(|s| s.input == id)
                .map(|s| s.asset.clone());
            let found = from_sources.chain(from_sinks).find(|asset| {
                self.bindings
                    .get(asset)
                    .is_some_and(|u| schemes.contains(&u.scheme))
            });
            // Else the database of an input computed on this backend: the region goes on
            // there instead of leaving the database and coming back.
            let inherited = t.inputs.values().find_map(|r| {
                let same_backend = self
                    .backend_of
                    .get(r.from())
                    .is_some_and(|b| b.name() == backend.name());
                same_backend
                    .then(|| self.location_of.get(r.from()).cloned())
                    .flatten()
            });
            match found {
                None if inherited.is_some() => {
                    self.location_of
                        .insert(id.clone(), inherited.expect("checked"));
                }
                Some(asset) => {
                    let db = self.database_of(&asset);
                    self.location_of.insert(id.clone(), db);
                }
                None if backend.name() == "sqlite" => {}
                None if self.p.profile.endpoints.contains_key(backend.name()) => {
                    let endpoint = self.p.profile.endpoints[backend.name()].clone();
                    self.location_of.insert(id.clone(), endpoint);
                }
                None => self.push(
                    Diagnostic::new(
                        &codes::REGION_LOCATION,
                        format!(
                            "`{id}` runs on `{}` but reads no source and feeds no sink in such a database ({}), so there is no database to run it in",
                            backend.name(),
                            schemes.join(", ")
                        ),
                    )
                    .at(format!("engines.{id}"))
                    .help(format!(
                        "Name where `{}` runs under `endpoints:` in the profile (e.g. `{}: {}://host:port`).",
                        backend.name(),
                        backend.name(),
                        schemes[0]
                    )),
                ),
            }
        }
    }

    /// The database of an SQL asset's binding, not the table:
    /// `scheme://location[?sslmode=..]` (secret references unresolved).
    fn database_of(&self, asset: &str) -> String {
        let uri = &self.bindings[asset];
        let binding = &self.p.profile.bindings[asset];
        let mut db = binding.split('?').next().unwrap_or(binding).to_string();
        if let Some(mode) = uri.param("sslmode") {
            db.push_str(&format!("?sslmode={mode}"));
        }
        db
    }

    /// Sources whose binding says `read=in_place`: an SQL region of their own database
    /// reads the table where it lies, so its rows never leave the database. That needs a
    /// batch run, a PostgreSQL table (`table=`, not `query=`), and every reader of the
    /// source in an SQL region of that database; otherwise `ETL506`. The source's
    /// contract still gives the schema, but no record is decoded or quarantined: the
    /// database's types are the check, and a value that does not convert fails the run.
    pub(super) fn in_place_sources(&mut self) {
        let pl = self.p.pipeline.clone();
        for src in &pl.sources {
            let Some(uri) = self.bindings.get(&src.asset) else {
                continue;
            };
            match uri.param("read") {
                None | Some("rows") => continue,
                Some("in_place") => {}
                Some(other) => {
                    self.push(
                        Diagnostic::new(
                            &codes::REGION_LOCATION,
                            format!("`read={other}` on the binding of `{}`: expected `in_place` or `rows`", src.asset),
                        )
                        .at(format!("bindings.{}", src.asset)),
                    );
                    continue;
                }
            }
            let why_not = if self.p.profile.mode != ExecutionMode::Batch {
                Some("a streaming query reads its sources per micro-batch".to_string())
            } else if !matches!(uri.scheme.as_str(), "postgres" | "postgresql") {
                Some(format!("`{}` tables are read through the source (only PostgreSQL tables are read in place)", uri.scheme))
            } else if uri.param("table").is_none() {
                Some("only a `table=` is read in place, not a `query=`".to_string())
            } else {
                let db = self.database_of(&src.asset);
                let outside: Vec<String> = pl
                    .transforms
                    .iter()
                    .filter(|t| t.inputs.values().any(|r| r.from() == src.id))
                    .filter(|t| self.location_of.get(&t.id) != Some(&db))
                    .map(|t| format!("`{}`", t.id))
                    .chain(
                        pl.sinks
                            .iter()
                            .filter(|k| k.input == src.id)
                            .map(|k| format!("sink `{}`", k.id)),
                    )
                    .collect();
                (!outside.is_empty()).then(|| {
                    format!(
                        "{} read(s) it outside an SQL region of its database",
                        outside.join(", ")
                    )
                })
            };
            match why_not {
                Some(why) => self.push(
                    Diagnostic::new(
                        &codes::REGION_LOCATION,
                        format!("source `{}` cannot be read in place: {why}", src.id),
                    )
                    .help("Drop `read=in_place` from the binding (the source then reads, checks and hands on the rows), or place every reader of the source on the database's backend with `engines:`.")
                    .at(format!("bindings.{}", src.asset)),
                ),
                None => {
                    let table = uri.param("table").expect("checked").to_string();
                    self.in_place.insert(src.id.clone(), table);
                }
            }
        }
    }
}
