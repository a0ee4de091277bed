//! The registry of linked plugins: built once, as maps, from the [`inventory`]
//! registrations.
//!
//! Every lookup is a map lookup: a URI scheme to its source or sink provider (a
//! provider's [`SourceProvider::aliases`] are keys too), a name to its backend or
//! processor, a (backend, name) pair to its engine-specific transformation. A key two
//! plugins claim is a conflict: the first registered keeps it for lookups, and
//! [`Registry::check`] (run when the CLI starts and when a run starts) refuses to go on
//! with `ETL210` naming both.

use super::{Backend, ProcessorProvider, SinkProvider, SourceProvider, TransformImpl};
use crate::diagnostics::{codes, Diagnostic, Diagnostics, Result};
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// The linked plugins, by the keys pipelines name them with.
pub struct Registry {
    sources: BTreeMap<&'static str, &'static dyn SourceProvider>,
    sinks: BTreeMap<&'static str, &'static dyn SinkProvider>,
    backends: BTreeMap<&'static str, &'static dyn Backend>,
    transform_impls: BTreeMap<(&'static str, &'static str), &'static dyn TransformImpl>,
    processors: BTreeMap<&'static str, &'static dyn ProcessorProvider>,
    conflicts: Vec<Diagnostic>,
}

/// Adds `value` under `key`, or notes a conflict when the key is taken.
fn claim<K: Ord + Copy, V: Copy>(
    map: &mut BTreeMap<K, V>,
    conflicts: &mut Vec<Diagnostic>,
    key: K,
    value: V,
    what: impl FnOnce() -> String,
) {
    match map.entry(key) {
        std::collections::btree_map::Entry::Occupied(_) => {
            conflicts.push(Diagnostic::new(&codes::PLUGIN_CONFLICT, what()))
        }
        std::collections::btree_map::Entry::Vacant(slot) => {
            slot.insert(value);
        }
    }
}

impl Registry {
    /// A registry of the given plugins, in registration order.
    pub fn build(
        sources: impl IntoIterator<Item = &'static dyn SourceProvider>,
        sinks: impl IntoIterator<Item = &'static dyn SinkProvider>,
        backends: impl IntoIterator<Item = &'static dyn Backend>,
        transform_impls: impl IntoIterator<Item = &'static dyn TransformImpl>,
        processors: impl IntoIterator<Item = &'static dyn ProcessorProvider>,
    ) -> Self {
        let mut r = Registry {
            sources: BTreeMap::new(),
            sinks: BTreeMap::new(),
            backends: BTreeMap::new(),
            transform_impls: BTreeMap::new(),
            processors: BTreeMap::new(),
            conflicts: Vec::new(),
        };
        for p in sources {
            for scheme in std::iter::once(p.scheme()).chain(p.aliases().iter().copied()) {
                claim(&mut r.sources, &mut r.conflicts, scheme, p, || {
                    format!("two linked source plugins handle `{scheme}://`")
                });
            }
        }
        for p in sinks {
            for scheme in std::iter::once(p.scheme()).chain(p.aliases().iter().copied()) {
                claim(&mut r.sinks, &mut r.conflicts, scheme, p, || {
                    format!("two linked sink plugins handle `{scheme}://`")
                });
            }
        }
        for b in backends {
            let name = b.name();
            claim(&mut r.backends, &mut r.conflicts, name, b, || {
                format!("two linked backends are named `{name}`")
            });
        }
        for t in transform_impls {
            let key = (t.backend(), t.name());
            claim(&mut r.transform_impls, &mut r.conflicts, key, t, || {
                format!(
                    "two linked transformations are named `{}` on backend `{}`",
                    key.1, key.0
                )
            });
        }
        for p in processors {
            let name = p.name();
            claim(&mut r.processors, &mut r.conflicts, name, p, || {
                format!("two linked stateful processors are named `{name}`")
            });
        }
        r
    }

    /// `ETL210` for every key two plugins claim.
    pub fn check(&self) -> Result<()> {
        let mut d = Diagnostics::new();
        for c in &self.conflicts {
            d.push(c.clone());
        }
        d.into_result()
    }

    /// The source provider of a URI scheme.
    pub fn source(&self, scheme: &str) -> Option<&'static dyn SourceProvider> {
        self.sources.get(scheme).copied()
    }

    /// The sink provider of a URI scheme.
    pub fn sink(&self, scheme: &str) -> Option<&'static dyn SinkProvider> {
        self.sinks.get(scheme).copied()
    }

    /// A backend by name.
    pub fn backend(&self, name: &str) -> Option<&'static dyn Backend> {
        self.backends.get(name).copied()
    }

    /// The engine-specific transformation `name` of `backend`.
    pub fn transform_impl(&self, backend: &str, name: &str) -> Option<&'static dyn TransformImpl> {
        self.transform_impls.get(&(backend, name)).copied()
    }

    /// A custom stateful processor by name.
    pub fn processor(&self, name: &str) -> Option<&'static dyn ProcessorProvider> {
        self.processors.get(name).copied()
    }
}

/// The registry of the plugins linked into this program, built on first use.
pub fn registry() -> &'static Registry {
    static LINKED: OnceLock<Registry> = OnceLock::new();
    LINKED.get_or_init(|| {
        Registry::build(
            super::source_providers(),
            super::sink_providers(),
            super::backends(),
            super::transform_impls(),
            super::processors(),
        )
    })
}

/// Refuses (`ETL210`) a program in which two linked plugins claim the same key.
pub fn check_registry() -> Result<()> {
    registry().check()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::{SourceCapabilities, SourceContext};
    use crate::uri::BindingUri;

    struct Provider(&'static str, &'static [&'static str]);

    impl SourceProvider for Provider {
        fn scheme(&self) -> &'static str {
            self.0
        }
        fn aliases(&self) -> &'static [&'static str] {
            self.1
        }
        fn description(&self) -> &'static str {
            "a test provider"
        }
        fn capabilities(&self, _: &BindingUri) -> Result<SourceCapabilities> {
            Err(crate::Error::new(&codes::ENGINE_ERROR, "not for tests"))
        }
        fn create(&self, _: SourceContext) -> Result<Box<dyn crate::plugin::Source>> {
            Err(crate::Error::new(&codes::ENGINE_ERROR, "not for tests"))
        }
    }

    static PG: Provider = Provider("postgres", &["postgresql"]);
    static OTHER_PG: Provider = Provider("postgresql", &[]);
    static FILE: Provider = Provider("file", &[]);

    #[test]
    fn one_provider_serves_its_aliases_and_two_claiming_a_scheme_are_refused() {
        let ok = Registry::build([&PG as &dyn SourceProvider, &FILE], [], [], [], []);
        ok.check().unwrap();
        let by = |s| ok.source(s).map(|p| p.scheme());
        assert_eq!(by("postgresql"), Some("postgres"));
        assert_eq!(by("postgres"), Some("postgres"));
        assert_eq!(by("kafka"), None);

        let clash = Registry::build(
            [&PG as &dyn SourceProvider, &OTHER_PG, &FILE],
            [],
            [],
            [],
            [],
        );
        let e = clash.check().unwrap_err();
        assert_eq!(e.code(), "ETL210", "{e}");
        assert!(e.to_string().contains("postgresql://"), "{e}");
        // The first registered keeps the scheme for lookups.
        assert_eq!(
            clash.source("postgresql").map(|p| p.scheme()),
            Some("postgres")
        );
    }
}
