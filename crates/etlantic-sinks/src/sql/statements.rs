//! The SQL text the sink runs: `CREATE TABLE` for the target and progress tables, and
//! multi-row `INSERT`s (upserts) sized under the bind-parameter limit; and a batch's
//! rows rendered for binding.

use super::columns::{arrow_err, column_values, ColumnPlan, Val};
use super::{quote, Dialect, TableName};
use arrow::array::RecordBatch;
use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use std::collections::HashMap;

pub(super) struct Statements {
    pub(super) dialect: Dialect,
    pub(super) table: TableName,
    pub(super) columns: Vec<ColumnPlan>,
    pub(super) keys: Vec<String>,
}

impl Statements {
    pub(super) fn create_table(&self, upsert: bool) -> String {
        let mut cols: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                format!(
                    "{} {}{}",
                    quote(&c.name),
                    c.sql_type,
                    if c.not_null { " NOT NULL" } else { "" }
                )
            })
            .collect();
        if upsert {
            cols.push(format!(
                "PRIMARY KEY ({})",
                self.keys
                    .iter()
                    .map(|k| quote(k))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        format!(
            "CREATE TABLE IF NOT EXISTS {} ({})",
            self.table.quoted(),
            cols.join(", ")
        )
    }

    pub(super) fn create_progress(&self) -> String {
        let (bigint, ts) = match self.dialect {
            Dialect::Postgres => ("BIGINT", "TIMESTAMPTZ"),
            Dialect::Sqlite => ("INTEGER", "TEXT"),
        };
        format!(
            "CREATE TABLE IF NOT EXISTS {} (query_id TEXT NOT NULL, sink TEXT NOT NULL, batch_id {bigint}, committed_at {ts}, PRIMARY KEY (query_id, sink))",
            self.table.progress_table()
        )
    }

    fn placeholder(&self, n: usize, col: &ColumnPlan) -> String {
        match (self.dialect, col.cast) {
            (Dialect::Postgres, Some(c)) => format!("${n}::{c}"),
            (Dialect::Postgres, None) => format!("${n}"),
            (Dialect::Sqlite, _) => "?".to_string(),
        }
    }

    pub(super) fn insert(&self, rows: usize, upsert: bool) -> String {
        let cols: Vec<String> = self.columns.iter().map(|c| quote(&c.name)).collect();
        let mut sql = format!(
            "INSERT INTO {} ({}) VALUES ",
            self.table.quoted(),
            cols.join(", ")
        );
        let mut n = 0;
        for r in 0..rows {
            if r > 0 {
                sql.push(',');
            }
            sql.push('(');
            for (i, c) in self.columns.iter().enumerate() {
                if i > 0 {
                    sql.push(',');
                }
                n += 1;
                sql.push_str(&self.placeholder(n, c));
            }
            sql.push(')');
        }
        if upsert {
            let keys: Vec<String> = self.keys.iter().map(|k| quote(k)).collect();
            let updates: Vec<String> = self
                .columns
                .iter()
                .filter(|c| !self.keys.contains(&c.name))
                .map(|c| format!("{q} = excluded.{q}", q = quote(&c.name)))
                .collect();
            if updates.is_empty() {
                sql.push_str(&format!(" ON CONFLICT ({}) DO NOTHING", keys.join(", ")));
            } else {
                sql.push_str(&format!(
                    " ON CONFLICT ({}) DO UPDATE SET {}",
                    keys.join(", "),
                    updates.join(", ")
                ));
            }
        }
        sql
    }

    pub(super) fn rows_per_statement(&self) -> usize {
        (self.dialect.max_binds() / self.columns.len().max(1)).max(1)
    }
}

/// The rows of a batch to write, as rendered columns and the row order.
pub(super) struct Rendered {
    pub(super) columns: Vec<Vec<Val>>,
    pub(super) rows: Vec<usize>,
}

pub(super) fn render(
    data: &Table,
    plan: &[ColumnPlan],
    dedupe_keys: Option<&[String]>,
) -> Result<Rendered> {
    let batch: RecordBatch = data.concat().map_err(arrow_err)?;
    let mut columns = Vec::with_capacity(plan.len());
    for c in plan {
        let col = batch.column_by_name(&c.name).ok_or_else(|| {
            Error::new(
                &codes::SINK_CONTRACT_MISMATCH,
                format!("column `{}` is missing from the batch", c.name),
            )
        })?;
        columns.push(column_values(col, &c.name)?);
    }
    let n = batch.num_rows();
    let rows = match dedupe_keys {
        None => (0..n).collect(),
        Some(keys) => {
            // The last row of each key wins (a multi-row upsert may not touch a row twice).
            let idx: Vec<usize> = keys
                .iter()
                .map(|k| {
                    plan.iter()
                        .position(|c| &c.name == k)
                        .expect("checked keys")
                })
                .collect();
            // Collecting into a map keeps the last row of each key.
            let last: HashMap<Vec<String>, usize> = (0..n)
                .map(|r| {
                    let key: Vec<String> = idx
                        .iter()
                        .map(|&i| format!("{:?}", columns[i][r]))
                        .collect();
                    (key, r)
                })
                .collect();
            let mut keep: Vec<usize> = last.into_values().collect();
            keep.sort_unstable();
            keep
        }
    };
    Ok(Rendered { columns, rows })
}
