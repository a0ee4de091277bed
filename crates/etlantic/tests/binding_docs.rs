//! `docs/plugins.md` lists every binding option of every linked connector exactly as the
//! providers declare them (the declarations also name the options in "unknown parameter"
//! diagnostics). `ETLANTIC_UPDATE_DOCS=1` rewrites the generated part.

use etlantic::binding_docs::{binding_options_markdown, with_generated, BEGIN, END};

#[test]
fn the_user_docs_list_every_binding_option() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/plugins.md");
    let doc = std::fs::read_to_string(&path).expect("docs/plugins.md");
    let generated = binding_options_markdown();
    // Every provider the default build links is there, with its parameters.
    for needle in [
        "`file://`, `s3://`, `s3a://`, `gs://`, `az://`, `abfs://`, `abfss://` source",
        "`max_files_per_trigger`",
        "`read_ahead`",
        "`kafka://` source",
        "`startingOffsets`",
        "`delta://` sink",
        "`iceberg://` sink",
        "`postgres://`, `postgresql://` source",
        "`sqlite://` sink",
    ] {
        assert!(generated.contains(needle), "{needle} in\n{generated}");
    }
    let expected = with_generated(&doc, &generated)
        .unwrap_or_else(|| panic!("docs/plugins.md lacks the lines {BEGIN} … {END}"));
    if std::env::var_os("ETLANTIC_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &expected).expect("write docs/plugins.md");
        return;
    }
    assert!(
        doc == expected,
        "docs/plugins.md is out of date with the providers' options: run \
         `ETLANTIC_UPDATE_DOCS=1 cargo test -p etlantic --test binding_docs`"
    );
}

/// An unknown parameter names the known ones from the same declarations.
#[test]
fn unknown_parameters_are_named_with_the_declared_options() {
    use etlantic_core::plugin::{option_names, source_provider};
    let file = source_provider("file").expect("file source");
    let uri = etlantic_core::uri::BindingUri::parse("file://data/x.jsonl?colour=red").expect("uri");
    let err = match file.capabilities(&uri) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("an unknown parameter is refused"),
    };
    assert!(
        err.contains(&format!("(known: {})", option_names(file.options()))),
        "{err}"
    );
}
