//! Relations: a DataFusion data frame plus what the engine knows about its row order.
//!
//! DTCS relations are ordered (a stable sort, "first row per key", `first`/`last`,
//! `limit` after `sort` all depend on it), SQL relations are not, and DataFusion's
//! optimizer is free to drop a sort whose order nobody asks for. So order is carried
//! explicitly: an *ordered* relation has the hidden `Int64` column [`ORD`], unique per
//! row, whose ascending order is the relation's row order. Unordered relations do not
//! have it; their order is whatever the engine produces (deterministic, but unspecified).

use crate::error::{self, DfResultExt};
use crate::expr::{column_of, Scope};
use crate::table::{is_reserved, ORD};
use datafusion::common::DFSchemaRef;
use datafusion::logical_expr::{Expr as DfExpr, SortExpr};
use datafusion::prelude::DataFrame;
use etlantic_core::Result;

/// A relation being compiled.
#[derive(Clone, Debug)]
pub(crate) struct Relation {
    /// The rows.
    pub(crate) df: DataFrame,
    /// Whether the relation has the ordinal column [`ORD`].
    pub(crate) ordered: bool,
    /// Whether the engine already produces the rows in ordinal order (true for scans and
    /// anything that only filters or projects them), so no sort is needed to read them
    /// in order.
    pub(crate) in_order: bool,
}

impl Relation {
    /// Wraps a data frame; `ordered` is derived from its columns.
    pub(crate) fn new(df: DataFrame) -> Self {
        let ordered = df.schema().fields().iter().any(|f| f.name() == ORD);
        Relation {
            df,
            ordered,
            in_order: false,
        }
    }

    /// A relation whose physical order is its ordinal order (a scan of a table with the
    /// ordinal appended).
    pub(crate) fn scan(df: DataFrame) -> Self {
        let mut r = Relation::new(df);
        r.in_order = r.ordered;
        r
    }

    /// A relation produced by an operator that may reorder rows.
    pub(crate) fn shuffled(df: DataFrame, ordered: bool) -> Self {
        Relation {
            df,
            ordered,
            in_order: false,
        }
    }

    /// The logical schema (with qualifiers and hidden columns).
    pub(crate) fn schema(&self) -> DFSchemaRef {
        self.df.logical_plan().schema().clone()
    }

    /// The user-visible column names, in order.
    pub(crate) fn columns(&self) -> Vec<String> {
        self.df
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .filter(|n| !is_reserved(n))
            .collect()
    }

    /// Whether the relation has a user column `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        !is_reserved(name) && self.df.schema().fields().iter().any(|f| f.name() == name)
    }

    /// A reference to a user or hidden column.
    pub(crate) fn col(&self, name: &str) -> DfExpr {
        column_of(&self.schema(), name)
    }

    /// The scope expressions over this relation are compiled in.
    pub(crate) fn scope(&self) -> Scope {
        Scope::of(self.schema())
    }

    /// References to every user column, in order.
    pub(crate) fn column_exprs(&self) -> Vec<DfExpr> {
        let schema = self.schema();
        self.columns()
            .iter()
            .map(|c| column_of(&schema, c))
            .collect()
    }

    /// Sort expression on the ordinal (ascending).
    pub(crate) fn ord_sort(&self) -> Vec<SortExpr> {
        if self.ordered {
            vec![self.col(ORD).sort(true, false)]
        } else {
            vec![]
        }
    }

    /// Projects `exprs` (already aliased) and, when `keep_order` and the relation is
    /// ordered, the ordinal.
    pub(crate) fn select(self, mut exprs: Vec<DfExpr>, keep_order: bool) -> Result<Relation> {
        let ordered = keep_order && self.ordered;
        if ordered {
            exprs.push(self.col(ORD));
        }
        let in_order = self.in_order && ordered;
        let df = self.df.select(exprs).df("projection")?;
        Ok(Relation {
            df,
            ordered,
            in_order,
        })
    }

    /// Projects `exprs` plus a new ordinal computed by `ord` (a window expression or any
    /// expression that yields unique values per row).
    pub(crate) fn select_with_ord(self, mut exprs: Vec<DfExpr>, ord: DfExpr) -> Result<Relation> {
        exprs.push(
            datafusion::logical_expr::cast(ord, arrow::datatypes::DataType::Int64).alias(ORD),
        );
        let df = self.df.select(exprs).df("projection")?;
        Ok(Relation::shuffled(df, true))
    }

    /// Drops the ordinal if `keep_order` is false.
    pub(crate) fn keep_order(self, keep_order: bool) -> Result<Relation> {
        if keep_order || !self.ordered {
            return Ok(self);
        }
        let exprs = self.column_exprs();
        self.select(exprs, false)
    }

    /// The final data frame: rows in relation order, only user columns.
    pub(crate) fn finish(self) -> Result<DataFrame> {
        let exprs = self.column_exprs();
        let df = if self.ordered && !self.in_order {
            let sort = self.ord_sort();
            self.df.sort(sort).df("final order")?
        } else {
            self.df
        };
        df.select(exprs).df("final projection")
    }

    /// Runs DataFusion's analyzer (type coercion, ...) so that later steps see final types.
    pub(crate) fn analyzed(self) -> Result<Relation> {
        let in_order = self.in_order;
        let (state, plan) = self.df.into_parts();
        let plan = state
            .analyzer()
            .execute_and_check(plan, state.config_options(), |_, _| {})
            .df("analysis")?;
        let df = DataFrame::new(state, plan);
        let ordered = df.schema().fields().iter().any(|f| f.name() == ORD);
        Ok(Relation {
            df,
            ordered,
            in_order: in_order && ordered,
        })
    }

    /// Checks that a user column exists (`ETL206` otherwise).
    pub(crate) fn require(&self, name: &str) -> Result<()> {
        if self.has(name) {
            Ok(())
        } else {
            Err(error::unknown_column(name, &self.columns()))
        }
    }
}
