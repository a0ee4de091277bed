//! The console and memory sinks.

mod common;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use common::*;
use etlantic_core::data::Table;
use etlantic_core::guarantee::SinkCommitProtocol;
use etlantic_core::plugin::{sink_provider, Sink, WriteOutcome};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use etlantic_sinks::console::{ConsoleOptions, ConsoleSink};
use etlantic_sinks::memory::MemorySink;
use std::sync::{Arc, Mutex};

fn people(ids: &[i64], names: &[Option<&str>]) -> Table {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]));
    let b = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(StringArray::from(names.to_vec())),
        ],
    )
    .unwrap();
    Table::new(schema, vec![b])
}

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buffer {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

#[tokio::test]
async fn console_prints_batches_like_spark() {
    let buf = Buffer::default();
    let mut sink =
        ConsoleSink::with_writer(ConsoleOptions::default(), Arc::new(Mutex::new(buf.clone())));
    let t = people(&[1, 2], &[Some("alpha"), None]);
    assert_eq!(
        sink.write(batch("q", 3, OutputMode::Append, &t))
            .await
            .unwrap(),
        WriteOutcome::Written { rows: 2 }
    );
    assert_eq!(
        buf.text(),
        "-------------------------------------------\n\
         Batch: 3\n\
         -------------------------------------------\n\
         +----+-------+\n\
         | id | name  |\n\
         +----+-------+\n\
         | 1  | alpha |\n\
         | 2  | NULL  |\n\
         +----+-------+\n\n"
    );

    // num_rows and truncate.
    let buf = Buffer::default();
    let options =
        ConsoleOptions::from_uri(&BindingUri::parse("console://?num_rows=1").unwrap()).unwrap();
    let mut sink = ConsoleSink::with_writer(options, Arc::new(Mutex::new(buf.clone())));
    let t = people(&[7, 8], &[Some("a name that is far too long"), Some("b")]);
    sink.write(batch("q", 0, OutputMode::Complete, &t))
        .await
        .unwrap();
    assert_eq!(
        buf.text(),
        "-------------------------------------------\n\
         Batch: 0\n\
         -------------------------------------------\n\
         +----+----------------------+\n\
         | id | name                 |\n\
         +----+----------------------+\n\
         | 7  | a name that is fa... |\n\
         +----+----------------------+\n\
         only showing top 1 row\n\n"
    );

    let caps = sink_provider("console")
        .expect("console sink registered")
        .capabilities(&BindingUri::parse("console://").unwrap())
        .unwrap();
    assert!(caps.batch && caps.streaming);
    assert_eq!(caps.guarantee.protocol, SinkCommitProtocol::PlainAppend);
    assert_eq!(
        sink_provider("console")
            .unwrap()
            .capabilities(&BindingUri::parse("console://?rows=3").unwrap())
            .unwrap_err()
            .code(),
        "ETL007"
    );
}

#[tokio::test]
async fn console_sink_from_the_registry_writes_to_stdout() {
    let mut sink = sink_provider("console")
        .unwrap()
        .create(sink_ctx(
            std::path::Path::new("."),
            "console://",
            ExecutionMode::Streaming,
            OutputMode::Append,
        ))
        .unwrap();
    let t = people(&[], &[]);
    assert_eq!(
        sink.write(batch("q", 0, OutputMode::Append, &t))
            .await
            .unwrap(),
        WriteOutcome::Written { rows: 0 }
    );
}

fn memory_sink(name: &str, mode: ExecutionMode) -> Box<dyn Sink> {
    sink_provider("memory")
        .expect("memory sink registered")
        .create(sink_ctx(
            std::path::Path::new("."),
            &format!("memory://{name}"),
            mode,
            OutputMode::Append,
        ))
        .unwrap()
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        })
        .collect()
}

#[tokio::test]
async fn memory_sink_keeps_every_write_and_skips_replays() {
    let mut sink = memory_sink("mem-append", ExecutionMode::Streaming);
    let a = people(&[1, 2], &[None, None]);
    let b = people(&[3], &[None]);
    assert_eq!(
        sink.write(batch("q", 0, OutputMode::Append, &a))
            .await
            .unwrap(),
        WriteOutcome::Written { rows: 2 }
    );
    assert_eq!(
        sink.write(batch("q", 1, OutputMode::Append, &b))
            .await
            .unwrap(),
        WriteOutcome::Written { rows: 1 }
    );
    // A restarted query in the same process replays batch 1.
    let mut again = memory_sink("mem-append", ExecutionMode::Streaming);
    assert_eq!(
        again
            .write(batch("q", 1, OutputMode::Append, &a))
            .await
            .unwrap(),
        WriteOutcome::AlreadyCommitted
    );
    assert_eq!(again.last_committed_batch("q").await.unwrap(), Some(1));
    assert_eq!(again.last_committed_batch("other").await.unwrap(), None);
    // Another query's batch 1 is a different batch.
    assert_eq!(
        again
            .write(batch("q2", 1, OutputMode::Append, &b))
            .await
            .unwrap(),
        WriteOutcome::Written { rows: 1 }
    );
    let writes = MemorySink::snapshot("mem-append");
    assert_eq!(
        writes
            .iter()
            .map(|w| (w.query_id.as_str(), w.batch_id))
            .collect::<Vec<_>>(),
        vec![("q", 0), ("q", 1), ("q2", 1)]
    );
    assert_eq!(ids(&MemorySink::rows("mem-append")), vec![1, 2, 3, 3]);
    assert_eq!(MemorySink::committed_batches("mem-append", "q"), vec![0, 1]);
    assert_eq!(MemorySink::take("mem-append").len(), 3);
    assert!(MemorySink::snapshot("mem-append").is_empty());
}

#[tokio::test]
async fn memory_sink_complete_mode_keeps_the_last_table_and_batch_runs_overwrite() {
    let mut sink = memory_sink("mem-complete", ExecutionMode::Streaming);
    sink.write(batch("q", 0, OutputMode::Complete, &people(&[1], &[None])))
        .await
        .unwrap();
    sink.write(batch(
        "q",
        1,
        OutputMode::Complete,
        &people(&[1, 2], &[None, None]),
    ))
    .await
    .unwrap();
    assert_eq!(
        sink.write(batch("q", 0, OutputMode::Complete, &people(&[9], &[None])))
            .await
            .unwrap(),
        WriteOutcome::AlreadyCommitted
    );
    let writes = MemorySink::snapshot("mem-complete");
    assert_eq!(
        writes.iter().map(|w| w.batch_id).collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert_eq!(writes[1].output_mode, OutputMode::Complete);
    assert_eq!(ids(&writes[0].table.batches), vec![1]);
    // The current result is the last complete table.
    assert_eq!(ids(&MemorySink::rows("mem-complete")), vec![1, 2]);

    let mut sink = memory_sink("mem-batch", ExecutionMode::Batch);
    sink.write(batch("run", 0, OutputMode::Append, &people(&[1], &[None])))
        .await
        .unwrap();
    let mut sink = memory_sink("mem-batch", ExecutionMode::Batch);
    sink.write(batch(
        "run",
        0,
        OutputMode::Append,
        &people(&[5, 6], &[None, None]),
    ))
    .await
    .unwrap();
    assert_eq!(ids(&MemorySink::rows("mem-batch")), vec![5, 6]);

    let caps = sink_provider("memory")
        .unwrap()
        .capabilities(&BindingUri::parse("memory://x").unwrap())
        .unwrap();
    assert_eq!(
        caps.guarantee.protocol,
        SinkCommitProtocol::IdempotentByBatch
    );
    assert_eq!(
        sink_provider("memory")
            .unwrap()
            .capabilities(&BindingUri::parse("memory://").unwrap())
            .unwrap_err()
            .code(),
        "ETL007"
    );
}
