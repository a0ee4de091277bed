//! The `console://` sink: pretty-prints every batch to standard output, like Spark's
//! console sink.
//!
//! `console://?num_rows=20&truncate=true` — each write prints
//!
//! ```text
//! -------------------------------------------
//! Batch: 3
//! -------------------------------------------
//! +----+-------+
//! | id | name  |
//! +----+-------+
//! | 1  | alpha |
//! +----+-------+
//! ```
//!
//! showing at most `num_rows` rows (default 20, then `only showing top 20 rows`), with
//! values longer than 20 characters cut to 17 and `...` unless `truncate=false`, and nulls
//! as `NULL`. Batch and streaming runs, every output mode (a complete-mode batch prints
//! the whole result). Plain append: a replayed batch is printed again (at-least-once).

use arrow::array::{ArrayRef, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::guarantee::{SinkCommitProtocol, SinkGuarantee};
use etlantic_core::plugin::{option_names, BindingOption};
use etlantic_core::plugin::{
    Sink, SinkBatch, SinkCapabilities, SinkContext, SinkProvider, SinkRegistration, WriteOutcome,
};
use etlantic_core::streaming::OutputMode;
use etlantic_core::uri::BindingUri;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// The provider of `console://` sinks.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConsoleSinkProvider;

inventory::submit! { SinkRegistration(&ConsoleSinkProvider) }

/// The options of a `console://` binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsoleOptions {
    /// Rows shown per batch (`num_rows`, also `numRows`; default 20).
    pub num_rows: usize,
    /// Cut values longer than 20 characters (`truncate`; default true).
    pub truncate: bool,
}

impl Default for ConsoleOptions {
    fn default() -> Self {
        ConsoleOptions {
            num_rows: 20,
            truncate: true,
        }
    }
}

impl ConsoleOptions {
    /// Parses the URI's parameters (`ETL007` for an unknown or invalid one).
    pub fn from_uri(uri: &BindingUri) -> Result<Self> {
        let mut o = ConsoleOptions::default();
        let bad = |k: &str, v: &str, what: &str| {
            Error::new(
                &codes::BAD_URI,
                format!("`{uri}`: parameter `{k}={v}` is invalid, expected {what}"),
            )
        };
        for (k, v) in &uri.params {
            match k.as_str() {
                "num_rows" | "numRows" => {
                    o.num_rows = v.parse().map_err(|_| bad(k, v, "a number"))?
                }
                "truncate" => {
                    o.truncate = match v.to_ascii_lowercase().as_str() {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => return Err(bad(k, v, "true or false")),
                    }
                }
                other => {
                    return Err(Error::new(
                        &codes::BAD_URI,
                        format!(
                            "`{uri}`: unknown parameter `{other}` for the console sink (known: {})",
                            option_names(OPTIONS)
                        ),
                    ))
                }
            }
        }
        Ok(o)
    }
}

/// The query parameters of a `console://` sink binding.
pub const OPTIONS: &[BindingOption] = &[
    BindingOption {
        name: "num_rows",
        default: "20",
        meaning: "Rows printed per micro-batch (also `numRows`).",
    },
    BindingOption {
        name: "truncate",
        default: "true",
        meaning: "Cut values longer than 20 characters to 17 and `...`.",
    },
];

impl SinkProvider for ConsoleSinkProvider {
    fn options(&self) -> &'static [BindingOption] {
        OPTIONS
    }

    fn scheme(&self) -> &'static str {
        "console"
    }

    fn description(&self) -> &'static str {
        "Prints every batch as a table to standard output (like Spark's console sink)"
    }

    fn capabilities(&self, uri: &BindingUri) -> Result<SinkCapabilities> {
        ConsoleOptions::from_uri(uri)?;
        Ok(SinkCapabilities {
            batch: true,
            streaming: true,
            output_modes: vec![OutputMode::Append, OutputMode::Update, OutputMode::Complete],
            guarantee: SinkGuarantee::new(SinkCommitProtocol::PlainAppend),
        })
    }

    fn create(&self, ctx: SinkContext) -> Result<Box<dyn Sink>> {
        Ok(Box::new(ConsoleSink::stdout(ConsoleOptions::from_uri(
            &ctx.uri,
        )?)))
    }
}

enum Target {
    Stdout,
    Writer(Arc<Mutex<dyn Write + Send>>),
}

/// A `console://` sink.
pub struct ConsoleSink {
    options: ConsoleOptions,
    target: Target,
}

impl std::fmt::Debug for ConsoleSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleSink")
            .field("options", &self.options)
            .finish()
    }
}

impl ConsoleSink {
    /// A sink printing to standard output.
    pub fn stdout(options: ConsoleOptions) -> Self {
        ConsoleSink {
            options,
            target: Target::Stdout,
        }
    }

    /// A sink printing to `writer` (for tests and embedding).
    pub fn with_writer(options: ConsoleOptions, writer: Arc<Mutex<dyn Write + Send>>) -> Self {
        ConsoleSink {
            options,
            target: Target::Writer(writer),
        }
    }

    /// The text printed for one batch.
    pub fn render(
        &self,
        batch_id: u64,
        batches: &[RecordBatch],
        schema: &Schema,
    ) -> Result<String> {
        let total: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let mut shown = Vec::new();
        let mut left = self.options.num_rows;
        for b in batches {
            if left == 0 {
                break;
            }
            let n = b.num_rows().min(left);
            shown.push(self.as_text(&b.slice(0, n))?);
            left -= n;
        }
        if shown.is_empty() {
            shown.push(RecordBatch::new_empty(Arc::new(text_schema(schema))));
        }
        let table = arrow::util::pretty::pretty_format_batches(&shown)
            .map_err(|e| Error::new(&codes::ENGINE_ERROR, format!("arrow: {e}")))?;
        let rule = "-------------------------------------------";
        let mut out = format!("{rule}\nBatch: {batch_id}\n{rule}\n{table}\n");
        if total > self.options.num_rows {
            out.push_str(&format!(
                "only showing top {} row{}\n",
                self.options.num_rows,
                if self.options.num_rows == 1 { "" } else { "s" }
            ));
        }
        out.push('\n');
        Ok(out)
    }

    fn as_text(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let opts = FormatOptions::default().with_null("NULL");
        let err =
            |e: arrow::error::ArrowError| Error::new(&codes::ENGINE_ERROR, format!("arrow: {e}"));
        let columns = batch
            .columns()
            .iter()
            .map(|c| {
                let fmt = ArrayFormatter::try_new(c.as_ref(), &opts)?;
                let values: Vec<String> = (0..c.len())
                    .map(|i| {
                        let v = fmt.value(i).to_string();
                        if self.options.truncate && v.chars().count() > 20 {
                            format!("{}...", v.chars().take(17).collect::<String>())
                        } else {
                            v
                        }
                    })
                    .collect();
                Ok(Arc::new(StringArray::from(values)) as ArrayRef)
            })
            .collect::<std::result::Result<Vec<_>, arrow::error::ArrowError>>()
            .map_err(err)?;
        RecordBatch::try_new(Arc::new(text_schema(&batch.schema())), columns).map_err(err)
    }
}

fn text_schema(schema: &Schema) -> Schema {
    Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| Field::new(f.name(), DataType::Utf8, true))
            .collect::<Vec<_>>(),
    )
}

#[async_trait::async_trait]
impl Sink for ConsoleSink {
    async fn write(&mut self, batch: SinkBatch<'_>) -> Result<WriteOutcome> {
        let text = self.render(batch.batch_id, &batch.data.batches, &batch.data.schema)?;
        let io = |e: std::io::Error| Error::new(&codes::SINK_WRITE_FAILED, format!("console: {e}"));
        match &self.target {
            Target::Stdout => {
                // `print!` (not a raw handle) so that test harnesses capture the output.
                print!("{text}");
                std::io::stdout().flush().map_err(io)?;
            }
            Target::Writer(w) => {
                let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
                w.write_all(text.as_bytes()).map_err(io)?;
                w.flush().map_err(io)?;
            }
        }
        Ok(WriteOutcome::Written {
            rows: batch.data.num_rows() as u64,
        })
    }
}
