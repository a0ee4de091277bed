//! Input slots: tables whose rows are set before each run of a physical plan that was
//! planned once.
//!
//! An [`InputSlot`] is a DataFusion [`TableProvider`] whose scan ([`SlotExec`]) reads
//! the batches the slot holds *when the plan executes*, not when it was planned. A
//! micro-batch fills the slots and runs the plan again; nothing is re-planned.
//!
//! The scan reports no statistics and one partition, so that the plan chosen does not
//! depend on the rows of the micro-batch it happened to be planned with.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::Result as DfResult;
use datafusion::datasource::TableType;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::memory::MemoryStream;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use std::any::Any;
use std::sync::{Arc, Mutex};

/// The rows one input of a prepared plan reads on its next run.
#[derive(Debug)]
pub struct InputSlot {
    schema: SchemaRef,
    batches: Arc<Mutex<Vec<RecordBatch>>>,
}

impl InputSlot {
    /// An empty slot for rows of `schema`.
    pub fn new(schema: SchemaRef) -> Self {
        InputSlot {
            schema,
            batches: Arc::default(),
        }
    }

    /// Sets the rows the next run reads (each of the slot's schema).
    pub fn fill(&self, batches: Vec<RecordBatch>) {
        *self.batches.lock().expect("slot lock") = batches;
    }

    /// Drops the rows (after a run, so that they are not kept alive until the next).
    pub fn clear(&self) {
        self.batches.lock().expect("slot lock").clear();
    }
}

#[async_trait]
impl TableProvider for InputSlot {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        // Filters are not pushed down (the default) and the limit is a hint: the plan
        // keeps its own filter and limit operators above this scan.
        let schema = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(Arc::new(SlotExec {
            schema,
            projection: projection.cloned(),
            batches: self.batches.clone(),
            properties: Arc::new(properties),
        }))
    }
}

/// The scan of an [`InputSlot`]: one partition of the rows it holds at execution.
#[derive(Debug)]
pub struct SlotExec {
    schema: SchemaRef,
    projection: Option<Vec<usize>>,
    batches: Arc<Mutex<Vec<RecordBatch>>>,
    properties: Arc<PlanProperties>,
}

impl DisplayAs for SlotExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "SlotExec: projection={:?}", self.projection)
    }
}

impl ExecutionPlan for SlotExec {
    fn name(&self) -> &str {
        "SlotExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let data = self.batches.lock().expect("slot lock").clone();
        Ok(Box::pin(MemoryStream::try_new(
            data,
            self.schema.clone(),
            self.projection.clone(),
        )?))
    }
}
