//! The changelog of an operator's state: a changes batch holds the rows added or changed
//! since the previous version and the identities of rows that left (one by one, or in
//! runs), and applying it to the previous version's snapshot gives the new version.

use arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt64Array,
};
use arrow::compute::kernels::boolean::not;
use arrow::compute::{
    cast, concat_batches, filter_record_batch, lexsort_to_indices, take_record_batch, SortColumn,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};
use etlantic_core::diagnostics::{codes, Error, Result};
use std::collections::HashSet;
use std::sync::Arc;

/// The column of a changes batch that marks a removed row.
pub const REMOVED: &str = "__removed";

/// The column of a changes batch by which one removed row stands for a run of them:
/// every identity from the row's own to the one whose last identity column is this
/// value (the other identity columns equal), inclusive. Null for a single row.
pub const REMOVED_THROUGH: &str = "__removed_through";

fn relaxed(schema: &Schema) -> Schema {
    Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<Field>>(),
    )
}

/// Rows in the layout `schema` (a snapshot's) that stand for removed state rows: the
/// `identity` columns given, nulls elsewhere.
pub fn removed_rows(schema: &SchemaRef, identity: Vec<(&str, ArrayRef)>) -> Result<RecordBatch> {
    let n = identity.first().map(|(_, a)| a.len()).unwrap_or(0);
    let cols = schema
        .fields()
        .iter()
        .map(|f| {
            identity
                .iter()
                .find(|(name, _)| name == f.name())
                .map(|(_, a)| a.clone())
                .unwrap_or_else(|| new_null_array(f.data_type(), n))
        })
        .collect();
    RecordBatch::try_new(Arc::new(relaxed(schema)), cols).map_err(Error::engine)
}

/// Runs of removed state rows in the layout `schema` (a snapshot's): `prefix` gives all
/// identity columns but the last, `last` names the last, which holds non-negative
/// integers; run `i` removes the identities from `first[i]` to `through[i]` of it.
/// Nulls elsewhere. A state that leaves in arrival order (a join's rows, evicted by
/// the watermark) logs a few runs per micro-batch instead of a row per removed row.
pub fn removed_runs<'a>(
    schema: &SchemaRef,
    mut prefix: Vec<(&'a str, ArrayRef)>,
    last: &'a str,
    first: UInt64Array,
    through: UInt64Array,
) -> Result<RecordBatch> {
    let field = schema.field_with_name(last).map_err(Error::engine)?;
    let first = cast(&(Arc::new(first) as ArrayRef), field.data_type()).map_err(Error::engine)?;
    prefix.push((last, first));
    let rows = removed_rows(schema, prefix)?;
    let mut fields: Vec<Field> = rows
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(REMOVED_THROUGH, DataType::UInt64, true));
    let mut cols = rows.columns().to_vec();
    cols.push(Arc::new(through));
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(Error::engine)
}

/// A changes batch: the rows added or changed (`upserts`, batches in a snapshot's
/// layout), then the `removed` ones (see [`removed_rows`] and [`removed_runs`]), with a
/// [`REMOVED`] column telling which. The parts are copied once, into the result.
pub fn changes_batch(upserts: &[RecordBatch], removed: &RecordBatch) -> Result<RecordBatch> {
    let mut fields: Vec<Field> = relaxed(&removed.schema())
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(REMOVED, DataType::Boolean, false));
    let schema = Arc::new(Schema::new(fields));
    let runs = removed.schema().index_of(REMOVED_THROUGH).is_ok();
    let part = |b: &RecordBatch, removed: bool| -> Result<RecordBatch> {
        let mut cols = b.columns().to_vec();
        // Upserted rows stand for themselves only.
        if runs && !removed {
            cols.push(new_null_array(&DataType::UInt64, b.num_rows()));
        }
        cols.push(Arc::new(BooleanArray::from(vec![removed; b.num_rows()])));
        RecordBatch::try_new(schema.clone(), cols).map_err(Error::engine)
    };
    let mut parts = upserts
        .iter()
        .map(|b| part(b, false))
        .collect::<Result<Vec<_>>>()?;
    parts.push(part(removed, true)?);
    concat_batches(&schema, &parts).map_err(Error::engine)
}

/// `base` (a snapshot, or nothing) with a changes batch applied: rows of `base` that the
/// changes replace or remove (same `identity` values) go, the upserted rows come in, and
/// the result is ordered by `identity`.
pub fn apply_changes(
    base: Option<&RecordBatch>,
    changes: &RecordBatch,
    identity: &[&str],
) -> Result<RecordBatch> {
    apply_chain(base, std::slice::from_ref(changes), identity)
}

/// `base` (a snapshot, or nothing) with every changes batch of `chain` (oldest first)
/// applied: what [`apply_changes`] one batch after the other gives, in one pass — a row
/// survives unless a newer batch of the chain replaces or removes its identity — with one
/// sort at the end instead of one per batch. A restart of a long chain over a large state
/// encodes and sorts the state once, not once per micro-batch of the chain.
pub fn apply_chain(
    base: Option<&RecordBatch>,
    chain: &[RecordBatch],
    identity: &[&str],
) -> Result<RecordBatch> {
    let bad = |m: String| Error::new(&codes::CHECKPOINT_CORRUPT, format!("state changes: {m}"));
    let Some(newest) = chain.last() else {
        return base
            .cloned()
            .ok_or_else(|| Error::engine("internal: no state and no changes to apply"));
    };
    let layout = ChangesLayout::of(newest, identity)?;
    // Identities (row-encoded) that a batch newer than the one being read touched, and
    // the runs of removed rows of those batches.
    let mut touched: HashSet<Box<[u8]>> = HashSet::new();
    let mut newer_runs: Vec<RemovedRuns> = Vec::new();
    let mut parts = Vec::new();
    let survivors = |b: &RecordBatch,
                     touched: &HashSet<Box<[u8]>>,
                     newer_runs: &[RemovedRuns]|
     -> Result<RecordBatch> {
        let ids = layout.id_cols(b)?;
        let rows = layout
            .converter
            .convert_columns(&ids)
            .map_err(Error::engine)?;
        let in_runs = newer_runs
            .iter()
            .map(|r| r.contains_fn(&ids))
            .collect::<Result<Vec<_>>>()?;
        let keep = BooleanArray::from(
            (0..rows.num_rows())
                .map(|i| !touched.contains(rows.row(i).data()) && !in_runs.iter().any(|f| f(i)))
                .collect::<Vec<bool>>(),
        );
        filter_record_batch(b, &keep).map_err(Error::engine)
    };
    for changes in chain.iter().rev() {
        let flags = changes
            .column_by_name(REMOVED)
            .and_then(|c| c.as_any().downcast_ref::<BooleanArray>().cloned())
            .ok_or_else(|| bad(format!("no `{REMOVED}` column")))?;
        let upserts = layout.data(
            &filter_record_batch(changes, &not(&flags).map_err(Error::engine)?)
                .map_err(Error::engine)?,
        )?;
        parts.push(survivors(&upserts, &touched, &newer_runs)?);
        // This batch is newer than the ones read after it.
        let all = layout
            .converter
            .convert_columns(&layout.id_cols(changes)?)
            .map_err(Error::engine)?;
        touched.extend((0..all.num_rows()).map(|i| Box::<[u8]>::from(all.row(i).data())));
        newer_runs.push(RemovedRuns::of(changes, identity)?);
    }
    if let Some(base) = base {
        parts.push(survivors(&layout.data(base)?, &touched, &newer_runs)?);
    }
    layout.sorted(&parts)
}

/// The `identity` columns of `b`.
fn identity_columns(identity: &[&str], b: &RecordBatch) -> Result<Vec<ArrayRef>> {
    identity
        .iter()
        .map(|c| {
            b.column_by_name(c).cloned().ok_or_else(|| {
                Error::new(
                    &codes::CHECKPOINT_CORRUPT,
                    format!("state changes: no identity column `{c}`"),
                )
            })
        })
        .collect()
}

/// The data columns and the identity of a changes batch's layout.
struct ChangesLayout<'a> {
    /// The batch's columns but [`REMOVED`] and [`REMOVED_THROUGH`].
    schema: SchemaRef,
    identity: &'a [&'a str],
    /// Encodes the identity columns.
    converter: RowConverter,
}

impl<'a> ChangesLayout<'a> {
    fn of(changes: &RecordBatch, identity: &'a [&'a str]) -> Result<Self> {
        let fields: Vec<Field> = changes
            .schema()
            .fields()
            .iter()
            .filter(|f| f.name() != REMOVED && f.name() != REMOVED_THROUGH)
            .map(|f| f.as_ref().clone())
            .collect();
        let converter = RowConverter::new(
            identity_columns(identity, changes)?
                .iter()
                .map(|a| SortField::new(a.data_type().clone()))
                .collect(),
        )
        .map_err(Error::engine)?;
        Ok(ChangesLayout {
            schema: Arc::new(Schema::new(fields)),
            identity,
            converter,
        })
    }

    /// The identity columns of `b`.
    fn id_cols(&self, b: &RecordBatch) -> Result<Vec<ArrayRef>> {
        identity_columns(self.identity, b)
    }

    /// `b`'s data columns, in the layout's types.
    fn data(&self, b: &RecordBatch) -> Result<RecordBatch> {
        let cols = self
            .schema
            .fields()
            .iter()
            .map(|f| {
                let c = b.column_by_name(f.name()).ok_or_else(|| {
                    Error::new(
                        &codes::CHECKPOINT_CORRUPT,
                        format!("state changes: no column `{}`", f.name()),
                    )
                })?;
                if c.data_type() == f.data_type() {
                    Ok(c.clone())
                } else {
                    cast(c, f.data_type()).map_err(Error::engine)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        RecordBatch::try_new_with_options(
            self.schema.clone(),
            cols,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(b.num_rows())),
        )
        .map_err(Error::engine)
    }

    /// `parts` as one batch ordered by identity.
    fn sorted(&self, parts: &[RecordBatch]) -> Result<RecordBatch> {
        let merged = concat_batches(&self.schema, parts).map_err(Error::engine)?;
        let sort: Vec<SortColumn> = self
            .id_cols(&merged)?
            .into_iter()
            .map(|values| SortColumn {
                values,
                options: None,
            })
            .collect();
        let order = lexsort_to_indices(&sort, None).map_err(Error::engine)?;
        take_record_batch(&merged, &order).map_err(Error::engine)
    }
}

/// The runs of removed identities of a changes batch (its rows with a
/// [`REMOVED_THROUGH`]): per value of the identity columns but the last (encoded as
/// rows; empty when the identity is one column), the ranges of the last, sorted.
struct RemovedRuns {
    /// Encodes the identity columns but the last (`None`: there are none).
    prefix: Option<RowConverter>,
    ranges: std::collections::HashMap<Vec<u8>, Vec<(u64, u64)>>,
}

impl RemovedRuns {
    fn of(changes: &RecordBatch, identity: &[&str]) -> Result<Self> {
        let bad = |m: String| Error::new(&codes::CHECKPOINT_CORRUPT, format!("state changes: {m}"));
        let Some((last, prefix)) = identity.split_last() else {
            return Err(bad("the operator's changelog has no identity".into()));
        };
        let column = |name: &str| {
            changes
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| bad(format!("no identity column `{name}`")))
        };
        let Some(through) = changes.column_by_name(REMOVED_THROUGH) else {
            return Ok(RemovedRuns {
                prefix: None,
                ranges: Default::default(),
            });
        };
        let prefix_cols = prefix
            .iter()
            .map(|c| column(c))
            .collect::<Result<Vec<_>>>()?;
        let mut runs = RemovedRuns {
            prefix: (!prefix_cols.is_empty())
                .then(|| {
                    RowConverter::new(
                        prefix_cols
                            .iter()
                            .map(|a| SortField::new(a.data_type().clone()))
                            .collect(),
                    )
                })
                .transpose()
                .map_err(Error::engine)?,
            ranges: Default::default(),
        };
        let through = cast(through, &DataType::UInt64).map_err(Error::engine)?;
        let through = through.as_primitive::<arrow::datatypes::UInt64Type>();
        let first = cast(&column(last)?, &DataType::UInt64).map_err(Error::engine)?;
        let first = first.as_primitive::<arrow::datatypes::UInt64Type>();
        let keys = runs.keys(&prefix_cols)?;
        for i in (0..changes.num_rows()).filter(|i| through.is_valid(*i)) {
            if first.is_null(i) || first.value(i) > through.value(i) {
                return Err(bad(format!(
                    "a run of removed rows is malformed (row {i} of the changes)"
                )));
            }
            runs.ranges
                .entry(Self::key(&keys, i).to_vec())
                .or_default()
                .push((first.value(i), through.value(i)));
        }
        for r in runs.ranges.values_mut() {
            r.sort_unstable();
        }
        Ok(runs)
    }

    fn keys(&self, prefix_cols: &[ArrayRef]) -> Result<Option<arrow::row::Rows>> {
        self.prefix
            .as_ref()
            .map(|c| c.convert_columns(prefix_cols))
            .transpose()
            .map_err(Error::engine)
    }

    fn key(keys: &Option<arrow::row::Rows>, i: usize) -> &[u8] {
        keys.as_ref().map_or(&[], |k| k.row(i).data())
    }

    /// Whether row `i` of the state whose identity columns are `ids` lies in a run.
    fn contains_fn(&self, ids: &[ArrayRef]) -> Result<impl Fn(usize) -> bool + '_> {
        let (keys, last) = match ids.split_last() {
            Some((last, prefix)) if !self.ranges.is_empty() => (
                self.keys(prefix)?,
                Some(cast(last, &DataType::UInt64).map_err(Error::engine)?),
            ),
            _ => (None, None),
        };
        Ok(move |i: usize| {
            let Some(last) = &last else {
                return false;
            };
            let last = last.as_primitive::<arrow::datatypes::UInt64Type>();
            if last.is_null(i) {
                return false;
            }
            let v = last.value(i);
            self.ranges.get(Self::key(&keys, i)).is_some_and(|r| {
                // The last run starting at or before `v` (runs never overlap).
                let at = r.partition_point(|(first, _)| *first <= v);
                at > 0 && v <= r[at - 1].1
            })
        })
    }
}

/// States and changes of rows `(id, value)` identified by `id`, for the tests of the
/// checkpoint modules.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use arrow::array::{Int64Array, StringArray};

    /// A state of rows `(id, value)` identified by `id`.
    pub(crate) fn state(rows: &[(i64, &str)]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("value", DataType::Utf8, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap()
    }

    pub(crate) fn changes(upserts: &[(i64, &str)], removed: &[i64]) -> RecordBatch {
        let up = state(upserts);
        let gone = removed_rows(
            &up.schema(),
            vec![(
                "id",
                Arc::new(Int64Array::from(removed.to_vec())) as ArrayRef,
            )],
        )
        .unwrap();
        changes_batch(&[up], &gone).unwrap()
    }

    pub(crate) fn rows(b: &RecordBatch) -> Vec<(i64, String)> {
        let ids = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        let values = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        (0..b.num_rows())
            .map(|i| (ids.value(i), values.value(i).to_string()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{rows, state};
    use super::*;

    #[test]
    fn a_run_of_removed_rows_removes_its_whole_range_and_nothing_else() {
        let base = state(&[(1, "a"), (2, "b"), (3, "c"), (4, "d"), (6, "f"), (7, "g")]);
        let up = state(&[(5, "e"), (9, "i")]);
        // Runs 2..=4 and 7..=8 (8 is not held: nothing to remove), and one row, 1.
        let runs = removed_runs(
            &up.schema(),
            vec![],
            "id",
            UInt64Array::from(vec![7, 2, 1]),
            UInt64Array::from(vec![8, 4, 1]),
        )
        .unwrap();
        let changes = changes_batch(&[up], &runs).unwrap();
        let applied = apply_changes(Some(&base), &changes, &["id"]).unwrap();
        assert_eq!(
            rows(&applied),
            vec![(5, "e".into()), (6, "f".into()), (9, "i".into())]
        );
        // A run whose end comes before its start is refused as corrupt.
        let bad = removed_runs(
            &state(&[]).schema(),
            vec![],
            "id",
            UInt64Array::from(vec![4]),
            UInt64Array::from(vec![2]),
        )
        .unwrap();
        let bad = changes_batch(&[state(&[])], &bad).unwrap();
        let err = apply_changes(Some(&base), &bad, &["id"]).unwrap_err();
        assert!(err.to_string().contains("malformed"), "{err}");
    }

    /// A chain applied in one pass gives what applying its batches one by one gives:
    /// rows replaced, removed and re-added across batches, runs included.
    #[test]
    fn a_chain_in_one_pass_equals_its_batches_one_by_one() {
        use super::fixtures::changes;
        let base = state(&[(1, "a"), (2, "b"), (3, "c"), (4, "d"), (8, "h")]);
        let up = state(&[(9, "i")]);
        let run = removed_runs(
            &up.schema(),
            vec![],
            "id",
            UInt64Array::from(vec![3]),
            UInt64Array::from(vec![5]),
        )
        .unwrap();
        let chain = [
            // 2 replaced, 1 removed, 5 added.
            changes(&[(2, "B"), (5, "e")], &[1]),
            // 1 back, 5 replaced, 8 removed.
            changes(&[(1, "A"), (5, "E")], &[8]),
            // 3..=5 removed by a run, 9 added.
            changes_batch(&[up], &run).unwrap(),
            // 4 back (it was in the run), 2 removed.
            changes(&[(4, "D")], &[2]),
        ];
        let mut one_by_one = Some(base.clone());
        for c in &chain {
            one_by_one = Some(apply_changes(one_by_one.as_ref(), c, &["id"]).unwrap());
        }
        let at_once = apply_chain(Some(&base), &chain, &["id"]).unwrap();
        assert_eq!(at_once, one_by_one.unwrap());
        assert_eq!(
            rows(&at_once),
            vec![(1, "A".into()), (4, "D".into()), (9, "i".into())]
        );
        // Without a base, and with no changes at all.
        let none = apply_chain(None, &chain[..2], &["id"]).unwrap();
        assert_eq!(
            rows(&none),
            vec![(1, "A".into()), (2, "B".into()), (5, "E".into())]
        );
        assert_eq!(apply_chain(Some(&base), &[], &["id"]).unwrap(), base);
    }

    #[test]
    fn runs_remove_only_the_rows_of_their_own_identity_prefix() {
        // A join's identity: (side, seq); both sides hold seqs 1..=3.
        let schema = Arc::new(Schema::new(vec![
            Field::new("side", DataType::UInt8, false),
            Field::new("seq", DataType::UInt64, false),
        ]));
        let held = |rows: &[(u8, u64)]| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(arrow::array::UInt8Array::from_iter_values(
                        rows.iter().map(|r| r.0),
                    )),
                    Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.1))),
                ],
            )
            .unwrap()
        };
        let base = held(&[(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]);
        // Side 0 loses 1..=2, side 1 loses 3.
        let runs = removed_runs(
            &schema,
            vec![(
                "side",
                Arc::new(arrow::array::UInt8Array::from(vec![0, 1])) as ArrayRef,
            )],
            "seq",
            UInt64Array::from(vec![1, 3]),
            UInt64Array::from(vec![2, 3]),
        )
        .unwrap();
        let changes = changes_batch(&[held(&[])], &runs).unwrap();
        let applied = apply_changes(Some(&base), &changes, &["side", "seq"]).unwrap();
        let sides = applied
            .column(0)
            .as_primitive::<arrow::datatypes::UInt8Type>();
        let seqs = applied
            .column(1)
            .as_primitive::<arrow::datatypes::UInt64Type>();
        let left: Vec<(u8, u64)> = (0..applied.num_rows())
            .map(|i| (sides.value(i), seqs.value(i)))
            .collect();
        assert_eq!(left, vec![(0, 3), (1, 1), (1, 2)]);
    }
}
