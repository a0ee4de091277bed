//! Walking a project's pipeline graph: what feeds a node.

use crate::project::Project;

/// Sources feeding `node` (transitively).
pub(crate) fn sources_of(project: &Project, node: &str, out: &mut Vec<String>) {
    if project.pipeline.source(node).is_some() {
        if !out.iter().any(|s| s == node) {
            out.push(node.to_string());
        }
        return;
    }
    if let Some(t) = project.pipeline.transform(node) {
        for r in t.inputs.values() {
            sources_of(project, r.from(), out);
        }
    }
}

/// Transformations feeding `node`, upstream first.
pub(crate) fn transforms_of(project: &Project, node: &str, out: &mut Vec<String>) {
    if let Some(t) = project.pipeline.transform(node) {
        for r in t.inputs.values() {
            transforms_of(project, r.from(), out);
        }
        if !out.iter().any(|x| x == node) {
            out.push(node.to_string());
        }
    }
}

/// Whether `source` is a static source (`static_refresh`).
pub(crate) fn is_static(project: &Project, source: &str) -> bool {
    project
        .pipeline
        .source(source)
        .is_some_and(|s| s.is_static())
}
