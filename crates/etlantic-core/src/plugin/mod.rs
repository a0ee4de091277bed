//! Plugin contracts and their registry.
//!
//! Sources, sinks, backends, engine-specific transformation implementations and custom
//! stateful processors ([`processor`]) register themselves with [`inventory::submit!`];
//! the facade links the ones its cargo features enable, and profiles resolve bindings to
//! them by URI scheme (pipelines name processors in `process` steps). A third-party crate adds
//! a plugin the same way:
//!
//! ```text
//! struct MySourceProvider;
//! impl etlantic_core::plugin::SourceProvider for MySourceProvider { /* ... */ }
//! inventory::submit! { etlantic_core::plugin::SourceRegistration(&MySourceProvider) }
//! ```

mod backend;
mod options;
pub mod processor;
mod registry;
mod sink;
mod source;

pub use backend::{
    Backend, BackendCapabilities, RegionKind, RegionLocation, StepLogic, StepTask,
    StreamingSupport, TransformImpl,
};
pub use options::{option_names, option_names_except, BindingOption};
pub use processor::{
    ExpiredTimer, GroupKey, ListState, MapState, ProcessorContext, ProcessorInit,
    ProcessorProvider, ProcessorSpec, StatefulProcessor, TimerValues, ValueState,
};
pub use registry::{check_registry, registry, Registry};
pub use sink::{Sink, SinkBatch, SinkCapabilities, SinkContext, SinkProvider, WriteOutcome};
pub use source::{
    ReadLimit, Source, SourceBatch, SourceCapabilities, SourceContext, SourceProvider,
};

/// Registers a [`SourceProvider`].
pub struct SourceRegistration(pub &'static dyn SourceProvider);
/// Registers a [`SinkProvider`].
pub struct SinkRegistration(pub &'static dyn SinkProvider);
/// Registers a [`Backend`].
pub struct BackendRegistration(pub &'static dyn Backend);
/// Registers a [`TransformImpl`].
pub struct TransformImplRegistration(pub &'static dyn TransformImpl);
/// Registers a [`ProcessorProvider`] (a custom stateful processor, see [`processor`]).
pub struct ProcessorRegistration(pub &'static dyn ProcessorProvider);

inventory::collect!(SourceRegistration);
inventory::collect!(SinkRegistration);
inventory::collect!(BackendRegistration);
inventory::collect!(TransformImplRegistration);
inventory::collect!(ProcessorRegistration);

/// Every linked source provider.
pub fn source_providers() -> impl Iterator<Item = &'static dyn SourceProvider> {
    inventory::iter::<SourceRegistration>
        .into_iter()
        .map(|r| r.0)
}

/// Every linked sink provider.
pub fn sink_providers() -> impl Iterator<Item = &'static dyn SinkProvider> {
    inventory::iter::<SinkRegistration>.into_iter().map(|r| r.0)
}

/// Every linked backend.
pub fn backends() -> impl Iterator<Item = &'static dyn Backend> {
    inventory::iter::<BackendRegistration>
        .into_iter()
        .map(|r| r.0)
}

/// Every linked engine-specific transformation.
pub fn transform_impls() -> impl Iterator<Item = &'static dyn TransformImpl> {
    inventory::iter::<TransformImplRegistration>
        .into_iter()
        .map(|r| r.0)
}

/// The source provider of a URI scheme (or one of its aliases).
pub fn source_provider(scheme: &str) -> Option<&'static dyn SourceProvider> {
    registry().source(scheme)
}

/// The sink provider of a URI scheme (or one of its aliases).
pub fn sink_provider(scheme: &str) -> Option<&'static dyn SinkProvider> {
    registry().sink(scheme)
}

/// A backend by name.
pub fn backend(name: &str) -> Option<&'static dyn Backend> {
    registry().backend(name)
}

/// The engine-specific transformation `name` of `backend`.
pub fn transform_impl(backend: &str, name: &str) -> Option<&'static dyn TransformImpl> {
    registry().transform_impl(backend, name)
}

/// The engine-specific transformations named `name`, on whichever backend.
pub fn transform_impls_named(name: &str) -> impl Iterator<Item = &'static dyn TransformImpl> + '_ {
    transform_impls().filter(move |t| t.name() == name)
}

/// Every linked custom stateful processor.
pub fn processors() -> impl Iterator<Item = &'static dyn ProcessorProvider> {
    inventory::iter::<ProcessorRegistration>
        .into_iter()
        .map(|r| r.0)
}

/// A custom stateful processor by name.
pub fn processor(name: &str) -> Option<&'static dyn ProcessorProvider> {
    registry().processor(name)
}
