//! The `etlantic` command line. Exit codes: 0 ok, 1 invalid pipeline, 2 usage error,
//! 3 planning failure, 4 execution failure, 5 breaking contract changes found by `diff`
//! (see `etlantic::exit`).

use clap::{Parser, Subcommand, ValueEnum};
use etlantic::exit;
use etlantic::generate::{generate, Standard};
use etlantic::plan::plan::PipelinePlan;
use etlantic::plan::{plan, Project};
use etlantic::progress_view::{self, ProgressView};
use etlantic::run::RunContext;
use etlantic_core::diagnostics::{render, Diagnostics, OutputFormat};
use std::path::{Path, PathBuf};

/// glibc's malloc hands the large buffers of every micro-batch back to the kernel and
/// faults them in again (about a fifth of the CPU time of a streaming query, measured in
/// docs/nexmark.md); mimalloc keeps them for reuse.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "etlantic",
    version,
    about = "Typed, contract-checked pipelines, batch or streaming, on pluggable backends",
    after_help = "Exit codes: 0 success; 1 invalid pipeline, profile or contract; 2 command-line usage \
(also: `diff` of documents of different kinds); 3 planning failure; 4 execution failure; \
5 `diff` of two contract versions found a breaking change."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Human,
    Json,
    Sarif,
}

impl From<Format> for OutputFormat {
    fn from(f: Format) -> Self {
        match f {
            Format::Human => OutputFormat::Human,
            Format::Json => OutputFormat::Json,
            Format::Sarif => OutputFormat::Sarif,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum TemplateArg {
    Batch,
    Streaming,
}

#[derive(Clone, Copy, ValueEnum)]
enum GenerateKind {
    Odcs,
    Dtcs,
    Dpcs,
}

#[derive(clap::Args, Clone)]
struct Target {
    /// The pipeline file.
    #[arg(default_value = "pipeline.yaml")]
    pipeline: PathBuf,
    /// The profile file (default: profiles/local.yaml next to the pipeline).
    #[arg(short, long)]
    profile: Option<PathBuf>,
}

#[derive(Subcommand)]
enum DlqCommand {
    /// Count quarantined records by query, micro-batch, code and quality rule.
    List {
        #[command(flatten)]
        target: Target,
        /// Output format (`json` prints the groups as JSON).
        #[arg(long, value_enum, default_value = "human")]
        format: Format,
    },
    /// Print quarantined records as JSON lines, optionally filtered.
    Show {
        #[command(flatten)]
        target: Target,
        /// Only records with this code (e.g. ETL704).
        #[arg(long)]
        code: Option<String>,
        /// Only records a quality rule with this id quarantined.
        #[arg(long)]
        rule: Option<String>,
        /// Only records of this micro-batch.
        #[arg(long)]
        batch: Option<u64>,
    },
    /// Replay quarantined records of a source into the (fixed) pipeline, once: a streaming
    /// run over them with its own checkpoint; records already redriven are skipped.
    Redrive {
        #[command(flatten)]
        target: Target,
        /// The source whose records to replay (default: the only streaming source).
        #[arg(long)]
        source: Option<String>,
        /// Only records with this code (e.g. ETL704).
        #[arg(long)]
        code: Option<String>,
        /// Only records a quality rule with this id quarantined.
        #[arg(long)]
        rule: Option<String>,
        /// Only records of this micro-batch.
        #[arg(long)]
        batch: Option<u64>,
        /// Output format (`json` prints the redrive report).
        #[arg(long, value_enum, default_value = "human")]
        format: Format,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Scaffold an example project (pipeline, ODCS contracts, a profile, sample data).
    Init {
        /// Directory to create the project in.
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// Which example: `batch` (orders to revenue per customer) or `streaming` (page
        /// views per 5-minute window from files arriving in two steps).
        #[arg(long, value_enum, default_value = "batch")]
        template: TemplateArg,
    },
    /// Validate a pipeline against its contracts and profile.
    Validate {
        #[command(flatten)]
        target: Target,
        /// Output format of the diagnostics.
        #[arg(long, value_enum, default_value = "human")]
        format: Format,
    },
    /// Plan a pipeline and print the PipelinePlan (canonical JSON).
    Plan {
        #[command(flatten)]
        target: Target,
        /// Also write the plan to this file.
        #[arg(short, long)]
        out: Option<PathBuf>,
        /// Also write the pipeline back as YAML, self-contained (inline contracts and
        /// transform plans); planning it with the same profile gives the same plan.
        #[arg(long, value_name = "FILE")]
        emit_pipeline: Option<PathBuf>,
        /// Output format of diagnostics.
        #[arg(long, value_enum, default_value = "human")]
        format: Format,
    },
    /// Explain a plan as text or as a Mermaid flowchart.
    Explain {
        #[command(flatten)]
        target: Target,
        /// Explain a saved plan instead of planning the pipeline.
        #[arg(long)]
        plan: Option<PathBuf>,
        /// Print Mermaid instead of text.
        #[arg(long)]
        mermaid: bool,
    },
    /// Run a pipeline (or a saved plan).
    Run {
        #[command(flatten)]
        target: Target,
        /// Run a saved plan (its fingerprint is checked).
        #[arg(long)]
        plan: Option<PathBuf>,
        /// Directory relative paths of a saved plan resolve against (default: the plan's directory).
        #[arg(long)]
        root: Option<PathBuf>,
        /// Output format of the run report.
        #[arg(long, value_enum, default_value = "human")]
        format: Format,
        /// Streaming only: stop after this many micro-batches of this run (the query
        /// resumes from its checkpoint next time). Ctrl-C also stops after the current one.
        #[arg(long)]
        max_batches: Option<u64>,
        /// Streaming only: serve Prometheus metrics at `http://ADDR/metrics` while the
        /// query runs (e.g. `127.0.0.1:9464`).
        #[arg(long, value_name = "ADDR")]
        metrics_addr: Option<std::net::SocketAddr>,
    },
    /// Inspect the quarantine (dead-letter) output the profile names.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Compare two plans (each a saved plan .json or a pipeline .yaml planned with --profile),
    /// or two versions of a contract (ODCS, DTCS or DPCS, YAML or JSON).
    ///
    /// Contracts are compared with their standard's crate, which classifies every change
    /// as breaking or compatible. Exit code 5 when any change is breaking, 0 when all are
    /// compatible; 2 when the two files are not of the same kind (ETL009); 1 when one does
    /// not parse or validate (ETL005, ETL010).
    Diff {
        /// The old plan, pipeline or contract.
        old: PathBuf,
        /// The new plan, pipeline or contract.
        new: PathBuf,
        /// Profile for pipeline files.
        #[arg(short, long)]
        profile: Option<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value = "human")]
        format: Format,
    },
    /// Generate ODCS, DTCS or DPCS documents for a pipeline.
    Generate {
        /// Which standard.
        #[arg(value_enum)]
        kind: GenerateKind,
        #[command(flatten)]
        target: Target,
        /// Output directory.
        #[arg(short, long, default_value = "generated")]
        out: PathBuf,
    },
    /// Run a conformance corpus (`spark`: scenarios recorded from Apache Spark).
    Conformance {
        /// The corpus kind.
        #[arg(value_enum)]
        suite: Suite,
        /// Directory of scenario `*.json` files.
        dir: PathBuf,
        /// Backend to run on: `datafusion` (the embedded runtime) or `spark` (real
        /// Apache Spark through Spark Connect).
        #[arg(long, default_value = "datafusion")]
        backend: String,
        /// With `--backend spark`: the Spark Connect endpoint (`sc://host:port`). Without
        /// it, a local server is started from the `pyspark` package and stopped after.
        #[arg(long)]
        endpoint: Option<String>,
    },
    /// Show where a streaming query stands: running, stopped or failed (and why), its last
    /// micro-batch, rates, watermark lag, what its sources hold unread, state per
    /// operator, late and quarantined rows, sinks, and the checkpoint's size. On a
    /// terminal the view refreshes while the query runs (Ctrl-C leaves it).
    ///
    /// Exit code 0 when the query runs or stopped, 4 when it failed (or its process died
    /// without saying why).
    Status {
        /// The query's checkpoint: a directory or an object-store URI (`s3://bucket/chk`).
        /// Default: the checkpoint the pipeline's profile names.
        checkpoint: Option<String>,
        /// The pipeline whose checkpoint to read (default `pipeline.yaml`); its profile
        /// also gives the object-store options.
        #[arg(long)]
        pipeline: Option<PathBuf>,
        /// The profile file (default: profiles/local.yaml next to the pipeline).
        #[arg(short, long)]
        profile: Option<PathBuf>,
        /// Output format (`json` prints the status once, as JSON).
        #[arg(long, value_enum, default_value = "human")]
        format: Format,
        /// Print once and exit, even on a terminal.
        #[arg(long)]
        once: bool,
        /// Seconds between refreshes of the live view.
        #[arg(long, default_value_t = 2)]
        interval: u64,
    },
    /// Render a query's history (rates, micro-batch duration, watermark lag, state size,
    /// late and quarantined rows over time) from its progress records as one
    /// self-contained HTML page with SVG charts.
    Report {
        /// The query's checkpoint (default: the one the pipeline's profile names).
        checkpoint: Option<String>,
        /// The pipeline whose checkpoint to read (default `pipeline.yaml`).
        #[arg(long)]
        pipeline: Option<PathBuf>,
        /// The profile file (default: profiles/local.yaml next to the pipeline).
        #[arg(short, long)]
        profile: Option<PathBuf>,
        /// The page to write.
        #[arg(short, long, default_value = "report.html")]
        out: PathBuf,
    },
    /// List the linked plugins.
    Plugins,
}

#[derive(Clone, Copy, ValueEnum)]
enum Suite {
    Spark,
}

/// The Spark corpus on real Spark: at `endpoint`, or on a local server started for the
/// run.
#[cfg(feature = "spark")]
fn conformance_on_spark(
    dir: &Path,
    endpoint: Option<String>,
) -> Result<Vec<etlantic_testkit::conformance::ScenarioOutcome>, String> {
    let (_server, url) = match endpoint {
        Some(url) => (None, url),
        None => {
            eprintln!("starting a local Spark Connect server (pyspark)...");
            let server = etlantic_spark_compat::local::LocalSparkConnect::start()
                .map_err(|e| e.to_string())?;
            let url = server.url();
            (Some(server), url)
        }
    };
    etlantic_testkit::conformance::on_spark::run_dir_on_spark(dir, &url)
}

#[cfg(not(feature = "spark"))]
fn conformance_on_spark(
    _dir: &Path,
    _endpoint: Option<String>,
) -> Result<Vec<etlantic_testkit::conformance::ScenarioOutcome>, String> {
    Err("this build has no Spark backend (cargo feature `spark`)".into())
}

fn print_diags(d: &Diagnostics, format: Format) {
    if d.is_empty() {
        return;
    }
    eprint!("{}", render(d, format.into()));
    if !matches!(format, Format::Human) {
        eprintln!();
    }
}

fn fail(e: &etlantic_core::Error, format: Format) -> i32 {
    print_diags(&e.0, format);
    exit::for_error(e)
}

fn load_and_plan(target: &Target, format: Format) -> Result<(Project, PipelinePlan), i32> {
    let project =
        Project::load(&target.pipeline, target.profile.as_deref()).map_err(|e| fail(&e, format))?;
    let outcome = plan(&project);
    match outcome.into_result() {
        Ok(p) => {
            print_diags(&p.warnings, format);
            Ok((project, p))
        }
        Err(e) => Err(fail(&e, format)),
    }
}

fn read_plan(path: &Path) -> Result<PipelinePlan, etlantic_core::Error> {
    let text = etlantic_core::model::yaml::read_file(path, &path.display().to_string())?;
    PipelinePlan::from_json(&text, &path.display().to_string())
}

fn plan_or_pipeline(
    path: &Path,
    profile: Option<&Path>,
    format: Format,
) -> Result<PipelinePlan, i32> {
    if path.extension().and_then(|e| e.to_str()) == Some("json") {
        read_plan(path).map_err(|e| fail(&e, format))
    } else {
        load_and_plan(
            &Target {
                pipeline: path.to_path_buf(),
                profile: profile.map(Path::to_path_buf),
            },
            format,
        )
        .map(|(_, p)| p)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime starts")
}

/// The log filter without `ETLANTIC_LOG`: warnings of ETLantic's crates, not of every
/// dependency's (their warnings are theirs to tune: `ETLANTIC_LOG=warn` shows them).
const DEFAULT_LOG: &str = "etlantic=warn,etlantic_core=warn,etlantic_runtime=warn,\
etlantic_datafusion=warn,etlantic_sources=warn,etlantic_sinks=warn,etlantic_rocksdb=warn,\
etlantic_object_store=warn,etlantic_sql=warn,etlantic_polars=warn,etlantic_spark_compat=warn";

fn main() {
    etlantic::link_plugins();
    etlantic_core::untrusted::quiet_guarded_panics();
    // Log lines go to stderr, filtered by `ETLANTIC_LOG` (e.g. `info`, `etlantic=debug`;
    // default: ETLantic's own warnings); a run's lines carry its application, query and
    // run ids.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ETLANTIC_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG)),
        )
        .with_writer(std::io::stderr)
        .init();
    // Two linked plugins claiming one scheme or name would make lookups ambiguous.
    if let Err(e) = etlantic_core::plugin::check_registry() {
        eprintln!("{e}");
        std::process::exit(etlantic::exit::for_error(&e));
    }
    let cli = Cli::parse();
    std::process::exit(match cli.command {
        Command::Init { dir, template } => {
            let template = match template {
                TemplateArg::Batch => etlantic::scaffold::Template::Batch,
                TemplateArg::Streaming => etlantic::scaffold::Template::Streaming,
            };
            match etlantic::scaffold::init_template(&dir, template) {
                Ok(files) => {
                    for f in files {
                        println!("created {}", f.display());
                    }
                    match template {
                    etlantic::scaffold::Template::Batch => {
                        println!("\nNext: cd {} && etlantic run", dir.display())
                    }
                    etlantic::scaffold::Template::Streaming => println!(
                        "\nNext: cd {} && etlantic run && etlantic status\nThen: mv samples/step2/003.jsonl data/views/ && etlantic run (see README.md)",
                        dir.display()
                    ),
                }
                    exit::OK
                }
                Err(e) => fail(&e, Format::Human),
            }
        }
        Command::Validate { target, format } => {
            let project = match Project::load(&target.pipeline, target.profile.as_deref()) {
                Ok(p) => p,
                Err(e) => {
                    print_result(&e.0, format);
                    std::process::exit(exit::for_error(&e));
                }
            };
            let d = etlantic::plan::validate(&project);
            print_result(&d, format);
            if d.has_errors() {
                exit::for_error(&etlantic_core::Error(d))
            } else {
                exit::OK
            }
        }
        Command::Plan {
            target,
            out,
            emit_pipeline,
            format,
        } => match load_and_plan(&target, format) {
            Ok((_, p)) => {
                let json = p.to_pretty_json();
                // With `-o`, the plan goes to the file only; the terminal gets one line.
                let printed = match &out {
                    Some(out) => {
                        if let Err(e) = std::fs::write(out, &json) {
                            eprintln!("cannot write {}: {e}", out.display());
                            std::process::exit(exit::EXECUTION_FAILED);
                        }
                        format!("wrote the plan to {} ({})", out.display(), p.fingerprint)
                    }
                    None => json,
                };
                if let Some(file) = emit_pipeline {
                    let yaml = match etlantic::emit::pipeline_yaml(&p) {
                        Ok(y) => y,
                        Err(e) => std::process::exit(fail(&e, format)),
                    };
                    if let Err(e) = std::fs::write(&file, yaml) {
                        eprintln!("cannot write {}: {e}", file.display());
                        std::process::exit(exit::EXECUTION_FAILED);
                    }
                }
                println!("{printed}");
                exit::OK
            }
            Err(code) => code,
        },
        Command::Explain {
            target,
            plan: saved,
            mermaid,
        } => {
            let p = match saved {
                Some(path) => read_plan(&path).map_err(|e| fail(&e, Format::Human)),
                None => load_and_plan(&target, Format::Human).map(|(_, p)| p),
            };
            match p {
                Ok(p) => {
                    if mermaid {
                        print!("{}", etlantic::plan::explain::explain_mermaid(&p));
                    } else {
                        print!("{}", etlantic::plan::explain::explain_text(&p));
                    }
                    exit::OK
                }
                Err(code) => code,
            }
        }
        Command::Run {
            target,
            plan: saved,
            root,
            format,
            max_batches,
            metrics_addr,
        } => {
            let (p, project_root) = match saved {
                Some(path) => match read_plan(&path) {
                    Ok(p) => {
                        let r = root.unwrap_or_else(|| {
                            path.canonicalize()
                                .ok()
                                .and_then(|c| c.parent().map(Path::to_path_buf))
                                .unwrap_or_else(|| PathBuf::from("."))
                        });
                        (p, r)
                    }
                    Err(e) => std::process::exit(fail(&e, format)),
                },
                None => match load_and_plan(&target, format) {
                    Ok((project, p)) => (p, project.root),
                    Err(code) => std::process::exit(code),
                },
            };
            run_plan(&p, &project_root, format, max_batches, metrics_addr)
        }
        Command::Status {
            checkpoint,
            pipeline,
            profile,
            format,
            once,
            interval,
        } => status(checkpoint, pipeline, profile, format, once, interval),
        Command::Report {
            checkpoint,
            pipeline,
            profile,
            out,
        } => history_report(checkpoint, pipeline, profile, &out),
        Command::Dlq {
            command:
                DlqCommand::Redrive {
                    target,
                    source,
                    code,
                    rule,
                    batch,
                    format,
                },
        } => {
            let filter = etlantic::dlq::Filter { code, rule, batch };
            let result =
                Project::load(&target.pipeline, target.profile.as_deref()).and_then(|project| {
                    runtime().block_on(etlantic::dlq::redrive(&project, source.as_deref(), &filter))
                });
            match result {
                Err(e) => fail(&e, format),
                Ok(report) => {
                    let failed = report.run.as_ref().is_some_and(|r| r.status != "succeeded");
                    match format {
                        Format::Human => {
                            println!(
                                "redrive of `{}`: {} replayed, {} already redriven, {} not replayable (not JSON)",
                                report.source,
                                report.replayed,
                                report.already_redriven,
                                report.not_replayable
                            );
                            if let Some(run) = &report.run {
                                println!(
                                    "run {} {}: {} rows written, {} quarantined again",
                                    report.redrive_id.as_deref().unwrap_or_default(),
                                    run.status,
                                    run.sinks.iter().map(|s| s.rows).sum::<u64>(),
                                    run.quarantined
                                );
                                for e in &run.errors {
                                    eprintln!("{e}");
                                }
                            }
                        }
                        _ => println!(
                            "{}",
                            serde_json::to_string_pretty(&report).expect("serialises")
                        ),
                    }
                    if failed {
                        exit::EXECUTION_FAILED
                    } else {
                        exit::OK
                    }
                }
            }
        }
        Command::Dlq { command } => {
            let (target, format) = match &command {
                DlqCommand::List { target, format } => (target, *format),
                DlqCommand::Show { target, .. } => (target, Format::Human),
                DlqCommand::Redrive { .. } => unreachable!("handled above"),
            };
            let lines = Project::load(&target.pipeline, target.profile.as_deref())
                .and_then(|p| etlantic::dlq::read_project(&p));
            match (lines, command) {
                (Err(e), _) => fail(&e, format),
                (Ok(lines), DlqCommand::List { .. }) => {
                    let groups = etlantic::dlq::summarise(&lines);
                    match format {
                        Format::Human => print!("{}", etlantic::dlq::render_summary(&groups)),
                        _ => println!(
                            "{}",
                            serde_json::to_string_pretty(&groups).expect("serialises")
                        ),
                    }
                    exit::OK
                }
                (
                    Ok(lines),
                    DlqCommand::Show {
                        code, rule, batch, ..
                    },
                ) => {
                    let filter = etlantic::dlq::Filter { code, rule, batch };
                    for l in etlantic::dlq::select(&lines, &filter) {
                        println!("{l}");
                    }
                    exit::OK
                }
                (Ok(_), DlqCommand::Redrive { .. }) => unreachable!("handled above"),
            }
        }
        Command::Diff {
            old,
            new,
            profile,
            format,
        } => {
            match etlantic::contract_diff::diff_files(&old, &new) {
                Ok(Some(d)) => {
                    match format {
                        Format::Human => print!("{}", d.render_text()),
                        _ => println!("{}", serde_json::to_string_pretty(&d).expect("serialises")),
                    }
                    std::process::exit(d.exit_code());
                }
                Err(e) => {
                    print_diags(&e.0, format);
                    std::process::exit(etlantic::contract_diff::exit_code_for_error(&e));
                }
                Ok(None) => {}
            }
            let a = plan_or_pipeline(&old, profile.as_deref(), format);
            let b = plan_or_pipeline(&new, profile.as_deref(), format);
            match (a, b) {
                (Ok(a), Ok(b)) => {
                    let changes = etlantic::plan::diff::diff(&a, &b);
                    match format {
                        Format::Human => print!("{}", etlantic::plan::diff::render_text(&changes)),
                        _ => println!(
                            "{}",
                            serde_json::to_string_pretty(&serde_json::json!({
                                "old": a.fingerprint, "new": b.fingerprint, "changes": changes,
                            }))
                            .expect("serialises")
                        ),
                    }
                    exit::OK
                }
                (Err(code), _) | (_, Err(code)) => code,
            }
        }
        Command::Generate { kind, target, out } => match load_and_plan(&target, Format::Human) {
            Ok((_, p)) => {
                let std = match kind {
                    GenerateKind::Odcs => Standard::Odcs,
                    GenerateKind::Dtcs => Standard::Dtcs,
                    GenerateKind::Dpcs => Standard::Dpcs,
                };
                match generate(&p, std, &out) {
                    Ok(files) => {
                        for f in files {
                            println!("wrote {}", f.display());
                        }
                        exit::OK
                    }
                    Err(e) => fail(&e, Format::Human),
                }
            }
            Err(code) => code,
        },
        Command::Conformance {
            suite: Suite::Spark,
            dir,
            backend,
            endpoint,
        } => {
            let outcomes = match backend.as_str() {
                "datafusion" => runtime().block_on(etlantic_testkit::conformance::run_dir(&dir)),
                "spark" => conformance_on_spark(&dir, endpoint),
                other => {
                    eprintln!(
                        "backend `{other}` is not available for conformance runs (datafusion, spark)"
                    );
                    std::process::exit(exit::USAGE);
                }
            };
            match outcomes {
                Ok(outcomes) => {
                    let failed = outcomes.iter().filter(|o| !o.passed).count();
                    for o in &outcomes {
                        println!("{}", o.line());
                        if !o.passed {
                            for p in o.problems.iter().skip(1).take(5) {
                                println!("    {}", p.replace('\n', "\n    "));
                            }
                        }
                    }
                    println!("{} passed, {failed} failed", outcomes.len() - failed);
                    if failed == 0 {
                        exit::OK
                    } else {
                        exit::EXECUTION_FAILED
                    }
                }
                Err(e) => {
                    eprintln!("{e}");
                    exit::USAGE
                }
            }
        }
        Command::Plugins => {
            println!("Backends:");
            for b in etlantic_core::plugin::backends() {
                let c = b.capabilities();
                println!(
                    "  {:<12} regions {:?}; {} actions, {} functions",
                    b.name(),
                    c.region_kinds,
                    c.actions.len(),
                    c.functions.len()
                );
                if c.region_kinds
                    .contains(&etlantic_core::plugin::RegionKind::Streaming)
                {
                    let s = &c.streaming;
                    println!(
                        "  {:<12} streaming: late policies [{}]; quarantine {}; allowed lateness {}{}",
                        "",
                        s.late_policies.join(", "),
                        if s.quarantine {
                            "yes"
                        } else {
                            "no (on_error: fail)"
                        },
                        if s.allowed_lateness { "yes" } else { "no" },
                        if s.whole_query {
                            format!(
                                "; the whole query, reading and writing {} itself",
                                s.io_schemes
                                    .iter()
                                    .map(|x| format!("{x}://"))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        } else {
                            String::new()
                        }
                    );
                }
            }
            println!("Sources:");
            for s in etlantic_core::plugin::source_providers() {
                for scheme in std::iter::once(s.scheme()).chain(s.aliases().iter().copied()) {
                    println!("  {:<12} {}", format!("{scheme}://"), s.description());
                }
            }
            println!("Sinks:");
            for s in etlantic_core::plugin::sink_providers() {
                for scheme in std::iter::once(s.scheme()).chain(s.aliases().iter().copied()) {
                    println!("  {:<12} {}", format!("{scheme}://"), s.description());
                }
            }
            println!("Stateful processors (process steps):");
            for p in etlantic_core::plugin::processors() {
                println!("  {:<16} {}", p.name(), p.description());
            }
            exit::OK
        }
    });
}

fn print_result(d: &Diagnostics, format: Format) {
    match format {
        Format::Human => {
            if d.is_empty() {
                println!("valid: no problems found");
            } else {
                print!("{}", render(d, OutputFormat::Human));
            }
        }
        f => println!("{}", render(d, f.into())),
    }
}

/// The checkpoint `status` and `report` read: the one named, else the one the pipeline's
/// profile names; object-store options from the profile when a pipeline is involved.
fn locate_checkpoint(
    checkpoint: Option<String>,
    pipeline: Option<PathBuf>,
    profile: Option<PathBuf>,
    format: Format,
) -> Result<
    (
        etlantic_core::storage::Location,
        etlantic_core::storage::StorageOptions,
    ),
    i32,
> {
    let project =
        (checkpoint.is_none() || pipeline.is_some() || profile.is_some()).then(|| Target {
            pipeline: pipeline.unwrap_or_else(|| PathBuf::from("pipeline.yaml")),
            profile,
        });
    let located = match project {
        Some(target) => {
            let (project, plan) = load_and_plan(&target, format)?;
            let ctx = RunContext::for_plan(&plan, &project.root);
            let location = match &checkpoint {
                Some(text) => etlantic::status::location_of(text),
                None => etlantic::run::checkpoint_location(&plan, &ctx),
            };
            location.and_then(|l| Ok((l, etlantic::run::storage_options(&plan, &ctx)?)))
        }
        None => etlantic::status::location_of(checkpoint.as_deref().unwrap_or_default())
            .map(|l| (l, Default::default())),
    };
    located.map_err(|e| fail(&e, format))
}

/// `etlantic report`: the query's history as an HTML page.
fn history_report(
    checkpoint: Option<String>,
    pipeline: Option<PathBuf>,
    profile: Option<PathBuf>,
    out: &Path,
) -> i32 {
    let (location, options) = match locate_checkpoint(checkpoint, pipeline, profile, Format::Human)
    {
        Ok(x) => x,
        Err(code) => return code,
    };
    let read = etlantic::status::read(&location, &options).and_then(|s| {
        let storage = etlantic_core::storage::open_location(&location, &options)?;
        Ok((
            s,
            etlantic_runtime::status::read_progress(storage.as_ref())?,
        ))
    });
    let (status, records) = match read {
        Ok(x) => x,
        Err(e) => return fail(&e, Format::Human),
    };
    if let Err(e) = std::fs::write(out, etlantic::history::page(&status, &records)) {
        eprintln!("cannot write {}: {e}", out.display());
        return exit::EXECUTION_FAILED;
    }
    println!(
        "wrote {} ({} micro-batches of query {})",
        out.display(),
        records.len(),
        status.pipeline
    );
    exit::OK
}

/// `etlantic status`: the query of a checkpoint, once or refreshing.
fn status(
    checkpoint: Option<String>,
    pipeline: Option<PathBuf>,
    profile: Option<PathBuf>,
    format: Format,
    once: bool,
    interval: u64,
) -> i32 {
    use etlantic_runtime::status::Liveness;
    use std::io::IsTerminal;
    let (location, options) = match locate_checkpoint(checkpoint, pipeline, profile, format) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let live = !once && matches!(format, Format::Human) && std::io::stdout().is_terminal();
    loop {
        let s = match etlantic::status::read(&location, &options) {
            Ok(s) => s,
            Err(e) => return fail(&e, format),
        };
        match format {
            Format::Human if live => {
                // Clear the screen and go home, like `top`.
                print!("\x1b[2J\x1b[H{}", etlantic::status::render(&s));
                println!("\nrefreshing every {interval} s; Ctrl-C leaves");
            }
            Format::Human => print!("{}", etlantic::status::render(&s)),
            _ => println!("{}", serde_json::to_string_pretty(&s).expect("serialises")),
        }
        if !live || s.state != Liveness::Running {
            return match s.state {
                Liveness::Failed => exit::EXECUTION_FAILED,
                _ => exit::OK,
            };
        }
        std::thread::sleep(std::time::Duration::from_secs(interval.max(1)));
    }
}

fn run_plan(
    p: &PipelinePlan,
    root: &Path,
    format: Format,
    max_batches: Option<u64>,
    metrics_addr: Option<std::net::SocketAddr>,
) -> i32 {
    let ctx = RunContext::for_plan(p, root);
    let report = if p.profile.mode == etlantic_core::streaming::ExecutionMode::Streaming {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let human = matches!(format, Format::Human);
        // A trigger that ends (a backfill) shows how far it is; one that runs on does not.
        let ends = matches!(
            p.profile.trigger.unwrap_or_default(),
            etlantic_core::streaming::Trigger::AvailableNow
                | etlantic_core::streaming::Trigger::Once
        ) && max_batches.is_none();
        let view = (human && ends).then(|| ProgressView::new(progress_view::Style::detect(), true));
        let shown = view.clone();
        let on_progress: etlantic_runtime::ProgressListener = std::sync::Arc::new(
            move |p: &etlantic_runtime::progress::QueryProgress| {
                if !human {
                    eprintln!("{}", p.to_json());
                    return;
                }
                let say = |line: String| match &shown {
                    Some(v) => v.println(&line),
                    None => eprintln!("{line}"),
                };
                if let Some(v) = &shown {
                    v.batch_done(p);
                }
                let wm = p.event_time.watermark.as_deref().unwrap_or("-");
                let state: u64 = p.state_operators.iter().map(|o| o.num_rows_total).sum();
                say(format!(
                    "batch {:>5} {:<7} in {:>6} rows  out {:>6} rows  quarantined {:>4}  late {:>4}  state {:>7} rows  watermark {wm}  {} ms",
                    p.batch_id, p.kind, p.num_input_rows, p.sink.num_output_rows,
                    p.quarantined_rows, p.late_rows, state, p.batch_duration
                ));
                for s in &p.sources {
                    for l in &s.data_loss {
                        say(format!(
                            "warning: data loss in {}: {}",
                            s.description, l.reason
                        ));
                    }
                }
            },
        );
        let s = stop.clone();
        let rt = runtime();
        rt.spawn(async move {
            if let Some(signal) = stop_signal().await {
                eprintln!("stopping after the current micro-batch ({signal})");
                s.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        });
        rt.block_on(etlantic::run::run_streaming(
            p,
            &ctx,
            etlantic::run::StreamingRun {
                on_progress: Some(on_progress),
                stop,
                max_batches,
                metrics_addr,
                progress: view,
            },
        ))
    } else {
        let view = matches!(format, Format::Human)
            .then(|| ProgressView::new(progress_view::Style::detect(), false));
        runtime().block_on(etlantic::run::run_batch_with(p, &ctx, view))
    };
    match format {
        Format::Human => {
            println!(
                "run {} of {} ({})",
                report.run_id, report.pipeline, report.fingerprint
            );
            for s in &report.sources {
                println!(
                    "  source {:<16} {} rows read, {} quarantined",
                    s.id, s.rows, s.rejected
                );
                for l in &s.data_loss {
                    println!("  source {:<16} data loss: {}", s.id, l.reason);
                }
            }
            for s in &report.sinks {
                if s.rows_unknown {
                    println!(
                        "  sink   {:<16} rows written not reported by the backend",
                        s.id
                    );
                } else {
                    println!("  sink   {:<16} {} rows written", s.id, s.rows);
                }
            }
            if report.quarantined > 0 {
                println!(
                    "  {} bad record(s) quarantined in {}",
                    report.quarantined, report.quarantine
                );
            }
            println!("{} in {} ms", report.status, report.duration_ms);
            if !report.errors.is_empty() {
                eprint!(
                    "{}",
                    render(&Diagnostics(report.errors.clone()), OutputFormat::Human)
                );
            }
        }
        _ => println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("reports serialise")
        ),
    }
    if report.status == "succeeded" {
        exit::OK
    } else {
        exit::EXECUTION_FAILED
    }
}

/// Waits for Ctrl-C (SIGINT) or, on Unix, SIGTERM (what a container orchestrator sends):
/// both stop a streaming query after its current micro-batch. `None` when no signal can
/// be listened to.
async fn stop_signal() -> Option<&'static str> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).ok()?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.ok().map(|_| "Ctrl-C"),
            _ = term.recv() => Some("SIGTERM"),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await.ok().map(|_| "Ctrl-C")
    }
}
