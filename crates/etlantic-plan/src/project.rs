//! A project: a pipeline file, the profile it runs with, and the directory relative paths
//! resolve against (the pipeline file's directory).

use etlantic_core::diagnostics::{Diagnostic, Result};
use etlantic_core::model::Pipeline;
use etlantic_core::profile::Profile;
use std::path::{Path, PathBuf};

/// The profile used when none is given and `profiles/local.yaml` does not exist.
pub const DEFAULT_PROFILE_FILE: &str = "profiles/local.yaml";

/// A loaded project.
#[derive(Clone, Debug)]
pub struct Project {
    /// Directory relative paths are resolved against.
    pub root: PathBuf,
    /// The pipeline file name relative to `root` (for diagnostics and provenance).
    pub pipeline_file: String,
    /// The pipeline.
    pub pipeline: Pipeline,
    /// The profile.
    pub profile: Profile,
    /// The profile file relative to `root`, when it came from a file.
    pub profile_file: Option<String>,
}

/// `path` relative to `root`, with `/` separators: a path outside `root` climbs out of it
/// with `..` (`../shared/stream.yaml`), so that a plan never holds an absolute path. Both
/// are taken lexically (`.` and `..` resolved, symbolic links not followed); on Windows,
/// a path on another drive has no relative form and keeps its own.
pub fn display_relative(root: &Path, path: &Path) -> String {
    use std::path::Component;
    fn normal(p: &Path) -> Vec<Component<'_>> {
        let mut out: Vec<Component<'_>> = Vec::new();
        for c in p.components() {
            match c {
                Component::CurDir => {}
                Component::ParentDir if matches!(out.last(), Some(Component::Normal(_))) => {
                    out.pop();
                }
                c => out.push(c),
            }
        }
        out
    }
    let (root, path) = (normal(root), normal(path));
    let text = |c: &Component<'_>| c.as_os_str().to_string_lossy().into_owned();
    if root.first() != path.first() {
        // No common root (another drive): no relative form.
        return path.iter().map(text).collect::<Vec<_>>().join("/");
    }
    let common = root.iter().zip(&path).take_while(|(a, b)| a == b).count();
    root[common..]
        .iter()
        .map(|_| "..".to_string())
        .chain(path[common..].iter().map(text))
        .collect::<Vec<_>>()
        .join("/")
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

impl Project {
    /// Loads a pipeline file and a profile file. Without a profile path,
    /// `profiles/local.yaml` next to the pipeline is used if it exists, else an empty
    /// profile named `default` (then every asset is unbound, which validation reports).
    pub fn load(pipeline_path: &Path, profile_path: Option<&Path>) -> Result<Self> {
        let pipeline_abs = absolute(pipeline_path);
        let root = pipeline_abs
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let pipeline_file = display_relative(&root, &pipeline_abs);
        let text = etlantic_core::model::yaml::read_file(&pipeline_abs, &pipeline_file)?;
        let pipeline = Pipeline::from_yaml(&text, &pipeline_file)?;
        let (profile, profile_file) = match profile_path {
            Some(p) => {
                let abs = absolute(p);
                let name = display_relative(&root, &abs);
                (Profile::load(&abs, &name)?, Some(name))
            }
            None => {
                let default = root.join(DEFAULT_PROFILE_FILE);
                if default.exists() {
                    (
                        Profile::load(&default, DEFAULT_PROFILE_FILE)?,
                        Some(DEFAULT_PROFILE_FILE.to_string()),
                    )
                } else {
                    (Profile::new("default"), None)
                }
            }
        };
        Ok(Project {
            root,
            pipeline_file,
            pipeline,
            profile,
            profile_file,
        })
    }

    /// A project from values (the Rust API); `root` resolves relative paths.
    pub fn from_parts(root: impl Into<PathBuf>, pipeline: Pipeline, profile: Profile) -> Self {
        Project {
            root: root.into(),
            pipeline_file: "pipeline.yaml".into(),
            pipeline,
            profile,
            profile_file: None,
        }
    }

    /// Resolves a path relative to the project root.
    pub fn resolve(&self, relative: &str) -> PathBuf {
        etlantic_core::uri::located(&self.root, relative)
    }

    /// Reads a file relative to the root; a missing file is `code`.
    pub fn read(
        &self,
        relative: &str,
        code: &etlantic_core::diagnostics::CodeInfo,
    ) -> Result<String> {
        std::fs::read_to_string(self.resolve(relative)).map_err(|e| {
            Diagnostic::new(code, format!("cannot read `{relative}`: {e}"))
                .in_file(relative.to_string())
                .into()
        })
    }
}

#[cfg(test)]
mod relative_tests {
    use super::display_relative;
    use std::path::Path;

    #[test]
    fn paths_outside_the_root_climb_out_of_it() {
        let rel = |r: &str, p: &str| display_relative(Path::new(r), Path::new(p));
        assert_eq!(
            rel("/w/proj", "/w/proj/profiles/local.yaml"),
            "profiles/local.yaml"
        );
        assert_eq!(
            rel("/w/proj", "/w/shared/stream.yaml"),
            "../shared/stream.yaml"
        );
        assert_eq!(
            rel("/w/proj", "/tmp/x/stream.yaml"),
            "../../tmp/x/stream.yaml"
        );
        assert_eq!(rel("/w/proj", "/w/proj/./a/../b.yaml"), "b.yaml");
        assert_eq!(rel("/w/proj/", "/w/proj/pipeline.yaml"), "pipeline.yaml");
    }
}
