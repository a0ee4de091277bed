//! One batch's transaction on PostgreSQL or SQLite: create the table, check and lock the
//! progress row, replace or insert the rows, record the batch, commit (see the exactly-once
//! protocol in the [module docs](super)).

use super::columns::{add_pg, add_sqlite};
use super::statements::{Rendered, Statements};
use etlantic_core::plugin::WriteOutcome;
use sqlx::postgres::{PgArguments, PgConnection};
use sqlx::sqlite::{SqliteArguments, SqliteConnection};
use sqlx::{Connection, Row};

/// One batch's transaction.
pub(super) struct Job<'a> {
    pub(super) statements: &'a Statements,
    pub(super) rendered: &'a Rendered,
    pub(super) query_id: &'a str,
    pub(super) sink: String,
    pub(super) batch_id: u64,
    pub(super) streaming: bool,
    pub(super) upsert: bool,
    pub(super) replace: bool,
}

type JobResult<T> = std::result::Result<T, (&'static str, String)>;

fn at<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> (&'static str, String) {
    move |e| (what, e.to_string())
}

impl Job<'_> {
    fn chunks(&self) -> impl Iterator<Item = &[usize]> {
        self.rendered
            .rows
            .chunks(self.statements.rows_per_statement())
    }

    fn batch_id_i64(&self) -> JobResult<i64> {
        i64::try_from(self.batch_id).map_err(|_| ("batch id", "does not fit BIGINT".to_string()))
    }

    pub(super) async fn run_pg(&self, c: &mut PgConnection) -> JobResult<WriteOutcome> {
        let batch_id = self.batch_id_i64()?;
        let mut tx = c.begin().await.map_err(at("BEGIN"))?;
        sqlx::query(&self.statements.create_table(self.upsert))
            .execute(&mut *tx)
            .await
            .map_err(at("cannot create the table"))?;
        if self.streaming {
            let progress = self.statements.table.progress_table();
            sqlx::query(&format!(
                "INSERT INTO {progress} (query_id, sink, batch_id, committed_at) VALUES ($1, $2, NULL, NULL) ON CONFLICT (query_id, sink) DO NOTHING"
            ))
            .bind(self.query_id)
            .bind(&self.sink)
            .execute(&mut *tx)
            .await
            .map_err(at("cannot lock the progress row"))?;
            let recorded: Option<i64> = sqlx::query(&format!(
                "SELECT batch_id FROM {progress} WHERE query_id = $1 AND sink = $2 FOR UPDATE"
            ))
            .bind(self.query_id)
            .bind(&self.sink)
            .fetch_one(&mut *tx)
            .await
            .map_err(at("cannot read the progress row"))?
            .get(0);
            if recorded.is_some_and(|r| batch_id <= r) {
                tx.rollback().await.map_err(at("ROLLBACK"))?;
                return Ok(WriteOutcome::AlreadyCommitted);
            }
        }
        if self.replace {
            sqlx::query(&format!("DELETE FROM {}", self.statements.table.quoted()))
                .execute(&mut *tx)
                .await
                .map_err(at("cannot delete the previous rows"))?;
        }
        for chunk in self.chunks() {
            let sql = self.statements.insert(chunk.len(), self.upsert);
            let mut args = PgArguments::default();
            for &r in chunk {
                for (col, vals) in self.statements.columns.iter().zip(&self.rendered.columns) {
                    add_pg(&mut args, col, &vals[r]).map_err(at("cannot bind a value"))?;
                }
            }
            sqlx::query_with(&sql, args)
                .execute(&mut *tx)
                .await
                .map_err(at("cannot insert the rows"))?;
        }
        etlantic_core::faults::check(etlantic_core::faults::IN_SINK, self.batch_id);
        if self.streaming {
            sqlx::query(&format!(
                "INSERT INTO {} (query_id, sink, batch_id, committed_at) VALUES ($1, $2, $3, now()) ON CONFLICT (query_id, sink) DO UPDATE SET batch_id = excluded.batch_id, committed_at = excluded.committed_at",
                self.statements.table.progress_table()
            ))
            .bind(self.query_id)
            .bind(&self.sink)
            .bind(batch_id)
            .execute(&mut *tx)
            .await
            .map_err(at("cannot record the batch in the progress table"))?;
        }
        tx.commit().await.map_err(at("COMMIT"))?;
        Ok(WriteOutcome::Written {
            rows: self.rendered.rows.len() as u64,
        })
    }

    pub(super) async fn run_sqlite(&self, c: &mut SqliteConnection) -> JobResult<WriteOutcome> {
        let batch_id = self.batch_id_i64()?;
        let mut tx = c
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(at("BEGIN IMMEDIATE"))?;
        sqlx::query(&self.statements.create_table(self.upsert))
            .execute(&mut *tx)
            .await
            .map_err(at("cannot create the table"))?;
        if self.streaming {
            let recorded: Option<i64> = sqlx::query(&format!(
                "SELECT batch_id FROM {} WHERE query_id = ? AND sink = ?",
                self.statements.table.progress_table()
            ))
            .bind(self.query_id)
            .bind(&self.sink)
            .fetch_optional(&mut *tx)
            .await
            .map_err(at("cannot read the progress row"))?
            .and_then(|r| r.get::<Option<i64>, _>(0));
            if recorded.is_some_and(|r| batch_id <= r) {
                tx.rollback().await.map_err(at("ROLLBACK"))?;
                return Ok(WriteOutcome::AlreadyCommitted);
            }
        }
        if self.replace {
            sqlx::query(&format!("DELETE FROM {}", self.statements.table.quoted()))
                .execute(&mut *tx)
                .await
                .map_err(at("cannot delete the previous rows"))?;
        }
        for chunk in self.chunks() {
            let sql = self.statements.insert(chunk.len(), self.upsert);
            let mut args = SqliteArguments::default();
            for &r in chunk {
                for (col, vals) in self.statements.columns.iter().zip(&self.rendered.columns) {
                    add_sqlite(&mut args, col, &vals[r]).map_err(at("cannot bind a value"))?;
                }
            }
            sqlx::query_with(&sql, args)
                .execute(&mut *tx)
                .await
                .map_err(at("cannot insert the rows"))?;
        }
        etlantic_core::faults::check(etlantic_core::faults::IN_SINK, self.batch_id);
        if self.streaming {
            sqlx::query(&format!(
                "INSERT INTO {} (query_id, sink, batch_id, committed_at) VALUES (?, ?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now')) ON CONFLICT (query_id, sink) DO UPDATE SET batch_id = excluded.batch_id, committed_at = excluded.committed_at",
                self.statements.table.progress_table()
            ))
            .bind(self.query_id)
            .bind(&self.sink)
            .bind(batch_id)
            .execute(&mut *tx)
            .await
            .map_err(at("cannot record the batch in the progress table"))?;
        }
        tx.commit().await.map_err(at("COMMIT"))?;
        Ok(WriteOutcome::Written {
            rows: self.rendered.rows.len() as u64,
        })
    }
}
