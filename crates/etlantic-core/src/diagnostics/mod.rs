//! Diagnostics: every problem a user can cause is reported as a [`Diagnostic`] with a
//! stable code from the [`codes`] catalogue, a severity, a message, the path of the
//! offending node, the phase that found it and a hint.
//!
//! Diagnostics render for humans ([`render_human`]), as JSON ([`render_json`]) and as
//! SARIF 2.1.0 ([`render_sarif`]). The catalogue is also written to
//! `docs/diagnostics.md`; a test keeps the two in sync.

pub mod codes;
mod render;

use serde::{Deserialize, Serialize};
use std::fmt;

pub use codes::CodeInfo;
pub use render::{render, render_human, render_json, render_sarif, OutputFormat};

/// How serious a diagnostic is. Only [`Severity::Error`] stops validation or a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The pipeline cannot be planned or run.
    Error,
    /// Something is probably wrong, but the pipeline can run.
    Warning,
    /// Worth knowing; never a problem by itself.
    Info,
}

impl Severity {
    /// Lower-case name (`error`, `warning`, `info`).
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

/// The phase of the life of a pipeline in which a diagnostic was produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Reading files: YAML/JSON syntax, unknown fields, unreadable paths.
    Load,
    /// The shape of the pipeline graph: ids, ports, cycles.
    Structural,
    /// Names that must resolve: assets, contracts, upstream nodes, bindings, plugins.
    Reference,
    /// Contracts and port types: schemas that must agree, expressions that must type-check.
    Semantic,
    /// Spark's supported-operation rules for unbounded inputs.
    Streaming,
    /// Whether the chosen backend, source or sink can do what the pipeline asks.
    Capability,
    /// Whether the end-to-end delivery guarantee a profile requires can be met.
    Guarantee,
    /// Organisation rules from the profile (secrets, allowed schemes, ...).
    Policy,
    /// Splitting the pipeline into regions and building the plan.
    Planning,
    /// Running a plan: data errors, I/O, engine failures.
    Execution,
    /// Checkpoint and restart.
    Checkpoint,
}

impl Phase {
    /// Snake-case name, as in JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Load => "load",
            Phase::Structural => "structural",
            Phase::Reference => "reference",
            Phase::Semantic => "semantic",
            Phase::Streaming => "streaming",
            Phase::Capability => "capability",
            Phase::Guarantee => "guarantee",
            Phase::Policy => "policy",
            Phase::Planning => "planning",
            Phase::Execution => "execution",
            Phase::Checkpoint => "checkpoint",
        }
    }
}

/// One finding, with everything a user needs to fix it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Diagnostic {
    /// Stable code from [`codes`], e.g. `ETL201`.
    pub code: String,
    /// How serious it is.
    pub severity: Severity,
    /// What is wrong, naming the values involved.
    pub message: String,
    /// The logical path of the offending node, e.g. `transforms[clean].inputs.orders`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// The file the problem is in, when there is one (relative to the project root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// 1-based line in `file`, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    /// The phase that found it.
    pub phase: Phase,
    /// How to fix it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub help: String,
}

impl Diagnostic {
    /// A diagnostic with the code's default severity, phase and help text.
    pub fn new(code: &CodeInfo, message: impl Into<String>) -> Self {
        Diagnostic {
            code: code.code.to_string(),
            severity: code.severity,
            message: message.into(),
            path: String::new(),
            file: None,
            line: None,
            phase: code.phase,
            help: code.help.to_string(),
        }
    }

    /// Sets the logical path of the offending node.
    pub fn at(mut self, path: impl Into<String>) -> Self {
        self.path = path.into();
        self
    }

    /// Sets the file the problem is in.
    pub fn in_file(mut self, file: impl Into<String>) -> Self {
        self.file = Some(file.into());
        self
    }

    /// Sets the 1-based line number.
    pub fn on_line(mut self, line: u64) -> Self {
        self.line = Some(line);
        self
    }

    /// Replaces the default help text with a more specific hint.
    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = help.into();
        self
    }

    /// Overrides the severity (e.g. a policy that downgrades an error to a warning).
    pub fn severity(mut self, severity: Severity) -> Self {
        self.severity = severity;
        self
    }

    /// Whether this diagnostic is an error.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}[{}]: {}",
            self.severity.as_str(),
            self.code,
            self.message
        )?;
        if !self.path.is_empty() {
            write!(f, " (at {})", self.path)?;
        }
        Ok(())
    }
}

/// An ordered collection of diagnostics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    /// An empty collection.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one diagnostic.
    pub fn push(&mut self, d: Diagnostic) {
        self.0.push(d);
    }

    /// Adds all diagnostics of another collection.
    pub fn extend(&mut self, other: Diagnostics) {
        self.0.extend(other.0);
    }

    /// Whether any diagnostic is an error.
    pub fn has_errors(&self) -> bool {
        self.0.iter().any(Diagnostic::is_error)
    }

    /// Number of errors.
    pub fn error_count(&self) -> usize {
        self.0.iter().filter(|d| d.is_error()).count()
    }

    /// Number of warnings.
    pub fn warning_count(&self) -> usize {
        self.0
            .iter()
            .filter(|d| d.severity == Severity::Warning)
            .count()
    }

    /// Whether the collection is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Iterates over the diagnostics.
    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter()
    }

    /// Whether a diagnostic with this code is present.
    pub fn contains_code(&self, code: &CodeInfo) -> bool {
        self.0.iter().any(|d| d.code == code.code)
    }

    /// `Ok(())` when there is no error, otherwise the whole collection as an [`Error`].
    pub fn into_result(self) -> Result<(), Error> {
        if self.has_errors() {
            Err(Error(self))
        } else {
            Ok(())
        }
    }
}

impl From<Diagnostic> for Diagnostics {
    fn from(d: Diagnostic) -> Self {
        Diagnostics(vec![d])
    }
}

impl IntoIterator for Diagnostics {
    type Item = Diagnostic;
    type IntoIter = std::vec::IntoIter<Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// The error type of ETLantic: one or more diagnostics, at least one of them an error.
#[derive(Clone, Debug, PartialEq)]
pub struct Error(pub Diagnostics);

impl Error {
    /// An error made of one diagnostic.
    pub fn new(code: &CodeInfo, message: impl Into<String>) -> Self {
        Error(Diagnostic::new(code, message).into())
    }

    /// An `ETL707` engine failure: an engine (or a library it calls) failed where user
    /// input cannot be blamed; the message is the cause's.
    pub fn engine(cause: impl std::fmt::Display) -> Self {
        Self::new(&codes::ENGINE_ERROR, cause.to_string())
    }

    /// The diagnostics carried by this error.
    pub fn diagnostics(&self) -> &Diagnostics {
        &self.0
    }

    /// The code of the first error diagnostic.
    pub fn code(&self) -> &str {
        self.0
            .iter()
            .find(|d| d.is_error())
            .or_else(|| self.0.iter().next())
            .map(|d| d.code.as_str())
            .unwrap_or("")
    }

    /// The phase of the first error diagnostic.
    pub fn phase(&self) -> Option<Phase> {
        self.0.iter().find(|d| d.is_error()).map(|d| d.phase)
    }

    /// The same error with a hint on how to fix it (on every diagnostic it carries).
    pub fn with_help(self, help: impl Into<String>) -> Self {
        let help = help.into();
        self.map_diagnostics(|d| d.help(help.clone()))
    }

    /// Applies `f` to every diagnostic (e.g. to prefix paths).
    pub fn map_diagnostics(mut self, f: impl Fn(Diagnostic) -> Diagnostic) -> Self {
        self.0 .0 = self.0 .0.into_iter().map(f).collect();
        self
    }
}

impl From<Diagnostic> for Error {
    fn from(d: Diagnostic) -> Self {
        Error(d.into())
    }
}

impl From<Diagnostics> for Error {
    fn from(d: Diagnostics) -> Self {
        Error(d)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for d in self.0.iter() {
            if !first {
                writeln!(f)?;
            }
            first = false;
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// Result with an ETLantic [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
