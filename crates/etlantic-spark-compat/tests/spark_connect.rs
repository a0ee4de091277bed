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

mod backend {
    use arrow::array::{Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use etlantic_core::data::Table;
    use etlantic_core::ir::{Action, BinaryOp, Expr, Literal, TransformPlanBuilder};
    use etlantic_core::plugin::{Backend, StepLogic, StepTask};
    use etlantic_spark_compat::local::LocalSparkConnect;
    use etlantic_spark_compat::SparkBackend;
    use indexmap::IndexMap;
    use std::sync::Arc;

    fn orders() -> Table {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("customer", DataType::Utf8, true),
            Field::new("amount", DataType::Int64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5])),
                Arc::new(StringArray::from(vec![
                    Some("a"),
                    Some("b"),
                    Some("a"),
                    None,
                    Some("b"),
                ])),
                Arc::new(Int64Array::from(vec![
                    Some(10),
                    Some(5),
                    None,
                    Some(7),
                    Some(30),
                ])),
            ],
        )
        .unwrap();
        Table::new(schema, vec![batch])
    }

    fn task(actions: Vec<Action>) -> StepTask {
        let table = orders();
        let mut b = TransformPlanBuilder::new("t")
            .input("orders", Some(table.schema.as_ref()))
            .from_input("orders");
        for a in actions {
            b = b.step(a);
        }
        StepTask {
            id: "result".into(),
            inputs: [("orders".to_string(), "orders".to_string())].into(),
            logic: StepLogic::Portable {
                plan: Arc::new(b.output("result", None).build().unwrap()),
                parameters: IndexMap::new(),
                output: "result".into(),
            },
        }
    }

    fn run(backend: &SparkBackend, t: &StepTask) -> etlantic_core::Result<Table> {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let inputs: IndexMap<String, Table> = [("orders".to_string(), orders())].into();
        rt.block_on(backend.execute_batch(std::slice::from_ref(t), inputs, &["result".into()]))
            .map(|mut m| m.swap_remove("result").unwrap())
    }

    /// Nothing listens on the port: the run fails with ETL710 and a hint, not a panic.
    #[test]
    fn an_unreachable_endpoint_is_a_diagnostic() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let backend = SparkBackend::new(format!("sc://127.0.0.1:{port}"));
        let t = task(vec![Action::Limit {
            count: 1,
            offset: 0,
        }]);
        let e = run(&backend, &t).unwrap_err();
        assert_eq!(e.code(), "ETL710", "{e}");
        assert!(e.to_string().contains(&port.to_string()), "{e}");
    }

    /// What the backend does not declare is refused before anything runs.
    #[test]
    fn undeclared_actions_are_refused_when_planning() {
        let backend = SparkBackend::new("sc://127.0.0.1:1");
        let t = task(vec![Action::Explode {
            column: "customer".into(),
            alias: "c".into(),
            outer: false,
        }]);
        let schemas: IndexMap<String, arrow::datatypes::SchemaRef> =
            [("orders".to_string(), orders().schema)].into();
        let e = backend.output_schema(&t, &schemas).unwrap_err();
        assert_eq!(e.code(), "ETL501");
    }

    /// Order-dependent steps on real Spark: filter, group, sort with ties, limit; the
    /// result comes back in DTCS order with the promised schema.
    #[test]
    fn a_region_runs_on_spark_in_dtcs_order() {
        let server = LocalSparkConnect::start().expect("a local Spark Connect server");
        let backend = SparkBackend::new(server.url());
        let t = task(vec![
            Action::Filter {
                predicate: Expr::Binary(
                    BinaryOp::Gt,
                    Box::new(Expr::col("id")),
                    Box::new(Expr::Literal(Literal::Integer(0))),
                ),
            },
            Action::Aggregate {
                group_by: vec![etlantic_core::ir::NamedExpr::column("customer")],
                aggregates: vec![etlantic_core::ir::Aggregate {
                    name: "total".into(),
                    func: etlantic_core::ir::AggFunc::Sum,
                    arg: Some(Expr::col("amount")),
                }],
            },
            Action::Sort {
                keys: vec![etlantic_core::ir::SortKey {
                    expr: Expr::col("total"),
                    descending: true,
                    nulls_first: false,
                }],
            },
            Action::Limit {
                count: 2,
                offset: 0,
            },
        ]);
        let got = run(&backend, &t).expect("the region runs");
        let schemas: IndexMap<String, arrow::datatypes::SchemaRef> =
            [("orders".to_string(), orders().schema)].into();
        assert_eq!(got.schema, backend.output_schema(&t, &schemas).unwrap());
        let b = got.concat().unwrap();
        let customers: Vec<Option<&str>> = b
            .column_by_name("customer")
            .unwrap()
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .iter()
            .collect();
        // b: 35, a: 10 (null ignored), null: 7.
        assert_eq!(customers, [Some("b"), Some("a")]);
    }
}

/// A data source the cluster lacks (pyspark brings no Kafka or Delta jars) is a
/// diagnostic naming the package to add; built-in formats pass.
#[test]
fn a_missing_connector_is_a_diagnostic_before_anything_starts() {
    use etlantic_spark_compat::streaming::require_data_source;
    let server = LocalSparkConnect::start().expect("a local Spark Connect server");
    let session = SparkSession::builder()
        .remote(&server.url())
        .get_or_create()
        .expect("a session");
    let e = require_data_source(
        &session,
        "kafka",
        "org.apache.spark:spark-sql-kafka-0-10_2.13",
    )
    .unwrap_err();
    assert_eq!(e.code(), "ETL711", "{e}");
    assert!(format!("{e:?}").contains("spark-sql-kafka"), "{e:?}");
    require_data_source(&session, "json", "-").expect("json is built in");
    // A source Spark has: analysis fails for another reason (no path), which is no
    // missing connector.
    require_data_source(&session, "noop", "-").expect("noop exists");
}
