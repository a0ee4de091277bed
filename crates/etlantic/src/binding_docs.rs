//! The user docs' table of binding options, generated from the linked providers'
//! declarations ([`etlantic_core::plugin::BindingOption`]) so that it cannot drift from
//! the code: `tests/binding_docs.rs` checks that `docs/plugins.md` holds exactly this text.

use etlantic_core::plugin::{sink_providers, source_providers, BindingOption};

/// The marker lines around the generated text in `docs/plugins.md`.
pub const BEGIN: &str = "<!-- binding-options: generated from the providers' declared options; \
refresh with `ETLANTIC_UPDATE_DOCS=1 cargo test -p etlantic --test binding_docs` -->";
/// The line after the generated text.
pub const END: &str = "<!-- /binding-options -->";

/// One group of the table: providers of one kind sharing their options.
struct Group {
    kind: &'static str,
    schemes: Vec<&'static str>,
    description: &'static str,
    options: &'static [BindingOption],
}

/// The Markdown for every linked source and sink provider: a heading per scheme (schemes
/// with the same options and description share one) and a table of its parameters.
pub fn binding_options_markdown() -> String {
    let mut groups: Vec<Group> = Vec::new();
    let mut add =
        |kind: &'static str, scheme, description, options: &'static [BindingOption]| match groups
            .iter_mut()
            .find(|g| {
                g.kind == kind && g.description == description && std::ptr::eq(g.options, options)
            }) {
            Some(g) => g.schemes.push(scheme),
            None => groups.push(Group {
                kind,
                schemes: vec![scheme],
                description,
                options,
            }),
        };
    let mut sources: Vec<_> = source_providers().collect();
    sources.sort_by_key(|p| p.scheme());
    for p in sources {
        for scheme in std::iter::once(p.scheme()).chain(p.aliases().iter().copied()) {
            add("source", scheme, p.description(), p.options());
        }
    }
    let mut sinks: Vec<_> = sink_providers().collect();
    sinks.sort_by_key(|p| p.scheme());
    for p in sinks {
        for scheme in std::iter::once(p.scheme()).chain(p.aliases().iter().copied()) {
            add("sink", scheme, p.description(), p.options());
        }
    }
    let mut out = String::new();
    for g in &groups {
        let schemes: Vec<String> = g.schemes.iter().map(|s| format!("`{s}://`")).collect();
        out.push_str(&format!(
            "\n#### {} {}\n\n{}.\n\n",
            schemes.join(", "),
            g.kind,
            g.description.trim_end_matches('.')
        ));
        if g.options.is_empty() {
            out.push_str("No parameters.\n");
            continue;
        }
        out.push_str("| parameter | default | meaning |\n|---|---|---|\n");
        for o in g.options {
            let default = if o.default.is_empty() {
                "—".to_string()
            } else {
                o.default.replace('|', "\\|")
            };
            out.push_str(&format!(
                "| `{}` | {} | {} |\n",
                o.name,
                default,
                o.meaning.replace('|', "\\|")
            ));
        }
    }
    out
}

/// `doc` with the text between [`BEGIN`] and [`END`] replaced by `generated`; `None` when
/// the markers are missing.
pub fn with_generated(doc: &str, generated: &str) -> Option<String> {
    let start = doc.find(BEGIN)? + BEGIN.len();
    let end = start + doc[start..].find(END)?;
    Some(format!("{}\n{generated}\n{}", &doc[..start], &doc[end..]))
}
