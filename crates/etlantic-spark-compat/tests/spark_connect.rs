//! Against a real local Spark Connect server (started from the `pyspark` package).

use etlantic_spark_compat::local::LocalSparkConnect;
use spark_connect::session::SparkSession;

/// The server starts, a session connects, and a query's result comes back as Arrow.
#[test]
fn a_local_server_runs_a_query_and_returns_arrow() {
    let server = LocalSparkConnect::start().expect("a local Spark Connect server");
    let session = SparkSession::builder()
        .remote(&server.url())
        .get_or_create()
        .expect("a session");
    let version = session.version().expect("the server's version");
    assert!(version.starts_with('4'), "Spark {version}");
    let batches = session
        .sql("SELECT id, id * 2 AS twice FROM range(5)")
        .expect("a data frame")
        .collect_record_batches()
        .expect("the result");
    let twice: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            b.column_by_name("twice")
                .expect("a column `twice`")
                .as_any()
                .downcast_ref::<arrow::array::Int64Array>()
                .expect("bigint")
                .values()
                .to_vec()
        })
        .collect();
    assert_eq!(twice, [0, 2, 4, 6, 8]);
}
