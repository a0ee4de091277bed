//! The query parameters a provider's bindings accept, declared once: the provider's
//! "unknown parameter" diagnostic names them from the same list the user docs are
//! generated from (`docs/plugins.md`, checked by a test), so the two cannot drift.

/// One query parameter of a binding (`scheme://location?name=value`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindingOption {
    /// The parameter's name as written in the URI (a trailing `<property>` marks a prefix,
    /// e.g. `kafka.<property>`).
    pub name: &'static str,
    /// What applies when the parameter is not given.
    pub default: &'static str,
    /// What it does, in one sentence.
    pub meaning: &'static str,
}

/// The names of `options`, comma-separated, for a diagnostic listing the known ones.
pub fn option_names(options: &[BindingOption]) -> String {
    options
        .iter()
        .map(|o| o.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// [`option_names`] without the options named in `except` (those a binding of this kind
/// does not take, e.g. PostgreSQL's `sslmode` for SQLite).
pub fn option_names_except(options: &[BindingOption], except: &[&str]) -> String {
    let kept: Vec<BindingOption> = options
        .iter()
        .filter(|o| !except.contains(&o.name))
        .copied()
        .collect();
    option_names(&kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_listed_in_order() {
        const O: &[BindingOption] = &[
            BindingOption {
                name: "a",
                default: "1",
                meaning: "x",
            },
            BindingOption {
                name: "b",
                default: "",
                meaning: "y",
            },
        ];
        assert_eq!(option_names(O), "a, b");
        assert_eq!(option_names_except(O, &["a"]), "b");
        assert_eq!(option_names(&[]), "");
    }
}
