//! Incremental aggregate state for streaming aggregations, with Spark's result types:
//! `count` → long; `sum(long)` → long; `sum(double)` → double; `sum(decimal(p,s))` →
//! decimal(p+10,s); `avg`, `variance`, `stddev` → double; `min`/`max`/`first`/`last` →
//! the input type. Variances keep Welford's count, mean and sum of squared deviations,
//! merged by Chan's formula, so that they are exact to rounding however the rows are
//! split into micro-batches.
//! Aggregates over only nulls are null (count is 0). Min/max/first/last keep their value
//! in Arrow's row format, whose byte order is the value order, so they work for every
//! type; over integers, dates and timestamps they keep a plain `i64` instead, which
//! needs no encoding and no allocation per value.

use crate::expr::types::is_integer;
use arrow::array::{
    Array, ArrayRef, AsArray, Decimal128Array, Float64Array, Int64Array, PrimitiveArray,
    RecordBatch,
};
use arrow::compute::cast;
use arrow::datatypes::{ArrowPrimitiveType, DataType, Field, Float64Type, Int64Type};
use arrow::row::{OwnedRow, RowConverter, Rows, SortField};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::ir::AggFunc;
use etlantic_runtime::engine::{corrupt_state, state_column};
use std::sync::Arc;

/// One aggregate of an operator: its function, output name and input type.
#[derive(Clone, Debug)]
pub struct AggSpec {
    /// Output column.
    pub name: String,
    /// Function.
    pub func: AggFunc,
    /// Input column type (`None` for count(*)).
    pub input_type: Option<DataType>,
}

impl AggSpec {
    /// The output type.
    pub fn output_type(&self) -> DataType {
        match (self.func, &self.input_type) {
            (AggFunc::CountAll | AggFunc::Count | AggFunc::CountDistinct, _) => DataType::Int64,
            (AggFunc::Average, _) => DataType::Float64,
            (f, _) if is_variance(f) => DataType::Float64,
            (AggFunc::Sum, Some(DataType::Decimal128(p, s))) => {
                DataType::Decimal128((*p + 10).min(38), *s)
            }
            (AggFunc::Sum, Some(t)) if is_float(t) => DataType::Float64,
            (AggFunc::Sum, _) => DataType::Int64,
            (_, Some(t)) => t.clone(),
            (_, None) => DataType::Null,
        }
    }

    /// The output field (nullable except counts).
    pub fn output_field(&self) -> Field {
        let nullable = !matches!(
            self.func,
            AggFunc::CountAll | AggFunc::Count | AggFunc::CountDistinct
        );
        Field::new(&self.name, self.output_type(), nullable)
    }

    fn uses_rows(&self) -> bool {
        match self.func {
            AggFunc::CountDistinct => true,
            AggFunc::Min | AggFunc::Max | AggFunc::First | AggFunc::Last => !self.keeps_int(),
            _ => false,
        }
    }

    /// A min/max/first/last whose state is an [`Acc::Int`].
    fn keeps_int(&self) -> bool {
        matches!(
            self.func,
            AggFunc::Min | AggFunc::Max | AggFunc::First | AggFunc::Last
        ) && self.input_type.as_ref().is_some_and(fits_i64)
    }
}

/// Whether every value of the type converts to an `i64` and back unchanged, keeping its
/// order (min/max/first/last then keep a plain integer instead of an encoded row).
fn fits_i64(t: &DataType) -> bool {
    (is_integer(t) && *t != DataType::UInt64)
        || matches!(
            t,
            DataType::Date32 | DataType::Date64 | DataType::Timestamp(..)
        )
}

/// `variance` and `stddev`, sample or population.
fn is_variance(f: AggFunc) -> bool {
    matches!(
        f,
        AggFunc::Variance
            | AggFunc::VariancePopulation
            | AggFunc::Stddev
            | AggFunc::StddevPopulation
    )
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64)
}

/// The state of one aggregate in one group.
#[derive(Clone, Debug, PartialEq)]
pub enum Acc {
    /// A count.
    Count(i64),
    /// Integer sum (`None` while only nulls were seen).
    SumI(Option<i64>),
    /// Float sum.
    SumF(Option<f64>),
    /// Decimal sum (unscaled).
    SumD(Option<i128>),
    /// Average: sum and count of non-null values.
    Avg(f64, i64),
    /// Variance and standard deviation: count, mean and sum of squared deviations from
    /// the mean of the non-null values (Welford).
    Var(i64, f64, f64),
    /// Min/max/first/last of a type that [fits an i64](fits_i64), as that integer.
    Int(Option<i64>),
    /// Min/max/first/last as an encoded row.
    Row(Option<OwnedRow>),
    /// Distinct values (encoded rows).
    Distinct(std::collections::BTreeSet<Vec<u8>>),
}

/// Prepared input columns of one batch, per aggregate.
pub enum AggInput {
    /// count(*).
    None,
    /// Null mask only (count(col)).
    Any(ArrayRef),
    /// Integers, cast to i64.
    I64(Int64Array),
    /// Floats, cast to f64.
    F64(Float64Array),
    /// Decimals.
    D128(Decimal128Array),
    /// Row-encoded values.
    Rows(ArrayRef, Rows),
}

/// Creates, updates and serialises the accumulators of a list of aggregates.
pub struct Accumulators {
    specs: Vec<AggSpec>,
    converters: Vec<Option<RowConverter>>,
}

impl Accumulators {
    /// Accumulators for these aggregates.
    pub fn new(specs: Vec<AggSpec>) -> Result<Self> {
        let converters = specs
            .iter()
            .map(|s| {
                if s.uses_rows() {
                    let t = s.input_type.clone().unwrap_or(DataType::Null);
                    RowConverter::new(vec![SortField::new(t)])
                        .map(Some)
                        .map_err(Error::engine)
                } else {
                    Ok(None)
                }
            })
            .collect::<Result<_>>()?;
        Ok(Accumulators { specs, converters })
    }

    /// The aggregates.
    pub fn specs(&self) -> &[AggSpec] {
        &self.specs
    }

    /// Fresh state for a new group.
    pub fn init(&self) -> Vec<Acc> {
        let mut out = Vec::with_capacity(self.specs.len());
        self.init_into(&mut out);
        out
    }

    /// Appends fresh state for a new group to `out` (flat state of many groups).
    pub fn init_into(&self, out: &mut Vec<Acc>) {
        out.extend(self.specs.iter().map(|s| match (s.func, &s.input_type) {
            (AggFunc::CountAll | AggFunc::Count, _) => Acc::Count(0),
            (AggFunc::CountDistinct, _) => Acc::Distinct(Default::default()),
            (AggFunc::Average, _) => Acc::Avg(0.0, 0),
            (f, _) if is_variance(f) => Acc::Var(0, 0.0, 0.0),
            (AggFunc::Sum, Some(DataType::Decimal128(..))) => Acc::SumD(None),
            (AggFunc::Sum, Some(t)) if is_float(t) => Acc::SumF(None),
            (AggFunc::Sum, _) => Acc::SumI(None),
            _ if s.keeps_int() => Acc::Int(None),
            _ => Acc::Row(None),
        }));
    }

    /// Prepares the input columns (`cols[i]` is the argument of aggregate `i`).
    pub fn prepare(&self, cols: &[Option<ArrayRef>]) -> Result<Vec<AggInput>> {
        self.specs
            .iter()
            .zip(cols)
            .zip(&self.converters)
            .map(|((s, c), conv)| {
                let Some(c) = c else {
                    return Ok(AggInput::None);
                };
                Ok(match (s.func, c.data_type()) {
                    (AggFunc::Count, _) => AggInput::Any(c.clone()),
                    (AggFunc::Sum, DataType::Decimal128(..)) => AggInput::D128(
                        c.as_any()
                            .downcast_ref::<Decimal128Array>()
                            .expect("decimal")
                            .clone(),
                    ),
                    (AggFunc::Sum, t) if is_float(t) => AggInput::F64(f64s(c)?),
                    (AggFunc::Sum, _) => AggInput::I64(i64s(c)?),
                    (AggFunc::Average, _) => AggInput::F64(f64s(c)?),
                    (f, _) if is_variance(f) => AggInput::F64(f64s(c)?),
                    _ if s.keeps_int() => AggInput::I64(i64s(c)?),
                    _ => {
                        let conv = conv.as_ref().expect("row aggregates have converters");
                        AggInput::Rows(
                            c.clone(),
                            conv.convert_columns(std::slice::from_ref(c))
                                .map_err(Error::engine)?,
                        )
                    }
                })
            })
            .collect()
    }

    /// Adds row `i` of the prepared inputs to a group's state.
    #[inline]
    pub fn update(&self, accs: &mut [Acc], inputs: &[AggInput], i: usize) -> Result<()> {
        for ((acc, input), spec) in accs.iter_mut().zip(inputs).zip(&self.specs) {
            update_one(acc, input, spec, i)?;
        }
        Ok(())
    }

    /// Adds every row of the prepared inputs to the state of its group: row `r` belongs
    /// to group `ids[r]`, whose accumulators are `states[ids[r] * n..][..n]` with `n` the
    /// number of aggregates. The result is that of [`Accumulators::update`] row by row;
    /// each aggregate sees the rows in order, so `first`/`last` keep the row order.
    ///
    /// The work goes one aggregate at a time over all rows: the common counts run as a
    /// tight loop instead of dispatching on every (row, aggregate) pair.
    pub fn update_groups(
        &self,
        states: &mut [Acc],
        ids: &[usize],
        inputs: &[AggInput],
    ) -> Result<()> {
        let n = self.specs.len();
        if states.len() < ids.iter().max().map_or(0, |g| (g + 1) * n) {
            return Err(Error::engine(
                "aggregate states are missing for some groups",
            ));
        }
        for (j, (input, spec)) in inputs.iter().zip(&self.specs).enumerate() {
            let all_valid = match input {
                AggInput::None => true,
                AggInput::Any(a) => a.null_count() == 0,
                _ => false,
            };
            if all_valid && matches!(states.get(j), Some(Acc::Count(_)) | None) {
                for &g in ids {
                    if let Acc::Count(c) = &mut states[g * n + j] {
                        *c += 1;
                    } else {
                        return Err(Error::engine("aggregate input does not match its state"));
                    }
                }
                continue;
            }
            if let (AggInput::I64(values), Some(Acc::Int(_))) = (input, states.get(j)) {
                update_ints(states, ids, n, j, values, spec.func)?;
                continue;
            }
            for (row, &g) in ids.iter().enumerate() {
                update_one(&mut states[g * n + j], input, spec, row)?;
            }
        }
        Ok(())
    }

    /// Merges the state of a group that ends earlier (`earlier`) with one that ends later
    /// (`later`) into `earlier` (sessions that grew together).
    ///
    /// Also folds the partial state of a micro-batch into a group's state (see
    /// [`super::operators`]): `later` then holds the batch's rows, which came after the
    /// state's. An integer sum that overflows is an error, as in [`Accumulators::update`].
    /// `later` is consumed: values it holds may be moved out (a min/max row, a distinct
    /// set), leaving it in no defined state.
    pub fn merge(&self, earlier: &mut [Acc], later: &mut [Acc]) -> Result<()> {
        for ((a, b), spec) in earlier.iter_mut().zip(later).zip(&self.specs) {
            match (a, b) {
                (Acc::Count(x), Acc::Count(y)) => *x += *y,
                (Acc::SumI(x), Acc::SumI(y)) => {
                    *x = match (*x, *y) {
                        (Some(p), Some(q)) => Some(p.checked_add(q).ok_or_else(|| {
                            Error::new(
                                &codes::ENGINE_ERROR,
                                format!("sum `{}` overflows a 64-bit integer", spec.name),
                            )
                        })?),
                        (p, None) => p,
                        (None, q) => q,
                    }
                }
                (Acc::SumF(x), Acc::SumF(y)) => *x = add_opt(*x, *y, |p, q| p + q),
                (Acc::SumD(x), Acc::SumD(y)) => *x = add_opt(*x, *y, |p, q| p + q),
                (Acc::Avg(s1, n1), Acc::Avg(s2, n2)) => {
                    *s1 += *s2;
                    *n1 += *n2;
                }
                (Acc::Var(n1, mean1, m21), Acc::Var(n2, mean2, m22)) => {
                    (*n1, *mean1, *m21) = merge_moments((*n1, *mean1, *m21), (*n2, *mean2, *m22));
                }
                (Acc::Distinct(x), Acc::Distinct(y)) => x.append(y),
                (Acc::Int(x), Acc::Int(Some(v))) => *x = Some(pick(spec.func, *x, *v)),
                (Acc::Row(x), Acc::Row(y)) => {
                    let take_later = match (spec.func, x.as_ref(), y.as_ref()) {
                        (_, _, None) => false,
                        (_, None, Some(_)) => true,
                        (AggFunc::Min, Some(p), Some(q)) => q.row() < p.row(),
                        (AggFunc::Max, Some(p), Some(q)) => q.row() > p.row(),
                        (AggFunc::Last, Some(_), Some(_)) => true,
                        _ => false,
                    };
                    if take_later {
                        *x = y.take();
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The output columns for the given groups' states.
    pub fn finish<'a>(
        &self,
        groups: impl Iterator<Item = &'a [Acc]> + Clone,
    ) -> Result<Vec<ArrayRef>> {
        self.columns(groups, false)
    }

    /// The state columns (for snapshots): like [`Accumulators::finish`], except that an
    /// average keeps its sum and count.
    pub fn state_columns<'a>(
        &self,
        groups: impl Iterator<Item = &'a [Acc]> + Clone,
    ) -> Result<Vec<(Field, ArrayRef)>> {
        let mut out = Vec::new();
        for (i, s) in self.specs.iter().enumerate() {
            let col = self.column(groups.clone(), i, true)?;
            match s.func {
                AggFunc::Average => {
                    let counts: Int64Array = groups
                        .clone()
                        .map(|g| match &g[i] {
                            Acc::Avg(_, n) => Some(*n),
                            _ => None,
                        })
                        .collect();
                    out.push((
                        Field::new(format!("{}__sum", s.name), DataType::Float64, true),
                        col,
                    ));
                    out.push((
                        Field::new(format!("{}__count", s.name), DataType::Int64, true),
                        Arc::new(counts) as ArrayRef,
                    ));
                }
                f if is_variance(f) => {
                    let part = |k: usize| -> ArrayRef {
                        let values = groups.clone().map(|g| match &g[i] {
                            Acc::Var(n, mean, m2) => Some([*n as f64, *mean, *m2][k]),
                            _ => None,
                        });
                        if k == 0 {
                            Arc::new(values.map(|v| v.map(|n| n as i64)).collect::<Int64Array>())
                        } else {
                            Arc::new(values.collect::<Float64Array>())
                        }
                    };
                    out.push((
                        Field::new(format!("{}__count", s.name), DataType::Int64, true),
                        part(0),
                    ));
                    out.push((
                        Field::new(format!("{}__mean", s.name), DataType::Float64, true),
                        part(1),
                    ));
                    out.push((
                        Field::new(format!("{}__m2", s.name), DataType::Float64, true),
                        part(2),
                    ));
                }
                AggFunc::CountDistinct => {
                    // Spark does not support distinct aggregations on streams either; the
                    // streaming validation phase rejects them before a query starts.
                    return Err(Error::new(
                        &codes::UNSUPPORTED_STREAMING_OP,
                        "count_distinct cannot be checkpointed",
                    ));
                }
                _ => out.push((Field::new(&s.name, col.data_type().clone(), true), col)),
            }
        }
        Ok(out)
    }

    fn columns<'a>(
        &self,
        groups: impl Iterator<Item = &'a [Acc]> + Clone,
        raw: bool,
    ) -> Result<Vec<ArrayRef>> {
        (0..self.specs.len())
            .map(|i| self.column(groups.clone(), i, raw))
            .collect()
    }

    fn column<'a>(
        &self,
        groups: impl Iterator<Item = &'a [Acc]>,
        i: usize,
        raw: bool,
    ) -> Result<ArrayRef> {
        let spec = &self.specs[i];
        let accs: Vec<&Acc> = groups.map(|g| &g[i]).collect();
        Ok(match spec.func {
            AggFunc::CountAll | AggFunc::Count => Arc::new(
                accs.iter()
                    .map(|a| match a {
                        Acc::Count(n) => Some(*n),
                        _ => None,
                    })
                    .collect::<Int64Array>(),
            ),
            AggFunc::CountDistinct => Arc::new(
                accs.iter()
                    .map(|a| match a {
                        Acc::Distinct(s) => Some(s.len() as i64),
                        _ => None,
                    })
                    .collect::<Int64Array>(),
            ),
            AggFunc::Average => Arc::new(
                accs.iter()
                    .map(|a| match a {
                        Acc::Avg(s, n) if raw => Some(*s),
                        Acc::Avg(s, n) if *n > 0 => Some(*s / *n as f64),
                        _ => None,
                    })
                    .collect::<Float64Array>(),
            ),
            f if is_variance(f) => {
                let sample = matches!(f, AggFunc::Variance | AggFunc::Stddev);
                let sqrt = matches!(f, AggFunc::Stddev | AggFunc::StddevPopulation);
                Arc::new(
                    accs.iter()
                        .map(|a| match a {
                            Acc::Var(n, _, m2) => {
                                let d = if sample { *n - 1 } else { *n };
                                (d > 0).then(|| {
                                    let v = m2 / d as f64;
                                    if sqrt {
                                        v.sqrt()
                                    } else {
                                        v
                                    }
                                })
                            }
                            _ => None,
                        })
                        .collect::<Float64Array>(),
                )
            }
            AggFunc::Sum => match spec.output_type() {
                DataType::Float64 => Arc::new(
                    accs.iter()
                        .map(|a| match a {
                            Acc::SumF(v) => *v,
                            _ => None,
                        })
                        .collect::<Float64Array>(),
                ),
                DataType::Decimal128(p, s) => Arc::new(
                    accs.iter()
                        .map(|a| match a {
                            Acc::SumD(v) => *v,
                            _ => None,
                        })
                        .collect::<Decimal128Array>()
                        .with_precision_and_scale(p, s)
                        .map_err(Error::engine)?,
                ),
                _ => Arc::new(
                    accs.iter()
                        .map(|a| match a {
                            Acc::SumI(v) => *v,
                            _ => None,
                        })
                        .collect::<Int64Array>(),
                ),
            },
            _ if spec.keeps_int() => {
                let values: ArrayRef = Arc::new(
                    accs.iter()
                        .map(|a| match a {
                            Acc::Int(v) => *v,
                            _ => None,
                        })
                        .collect::<Int64Array>(),
                );
                let t = spec.input_type.clone().unwrap_or(DataType::Int64);
                if t == DataType::Int64 {
                    values
                } else {
                    cast(&values, &t).map_err(Error::engine)?
                }
            }
            _ => {
                let conv = self.converters[i]
                    .as_ref()
                    .expect("row aggregates have converters");
                let t = spec.input_type.clone().unwrap_or(DataType::Null);
                if accs.iter().all(|a| matches!(a, Acc::Row(None))) {
                    arrow::array::new_null_array(&t, accs.len())
                } else {
                    // Rows of nulls stand in for groups without a value.
                    let null = conv
                        .convert_columns(&[arrow::array::new_null_array(&t, 1)])
                        .map_err(Error::engine)?;
                    let null_row = null.row(0);
                    let rows: Vec<arrow::row::Row<'_>> = accs
                        .iter()
                        .map(|a| match a {
                            Acc::Row(Some(r)) => r.row(),
                            _ => null_row,
                        })
                        .collect();
                    conv.convert_rows(rows).map_err(Error::engine)?.remove(0)
                }
            }
        })
    }

    /// Appends one group's state `accs` to `out` in a compact binary form (for a state
    /// store; [`Accumulators::decode`] reads it back): per aggregate a tag byte and its
    /// value, little endian, a row-format value length-prefixed. Distinct sets refuse, as
    /// in snapshots.
    pub fn encode(&self, accs: &[Acc], out: &mut Vec<u8>) -> Result<()> {
        fn opt<const N: usize>(out: &mut Vec<u8>, v: Option<[u8; N]>) {
            match v {
                Some(b) => {
                    out.push(1);
                    out.extend_from_slice(&b);
                }
                None => out.push(0),
            }
        }
        for a in accs {
            match a {
                Acc::Count(n) => {
                    out.push(0);
                    out.extend_from_slice(&n.to_le_bytes());
                }
                Acc::SumI(v) => {
                    out.push(1);
                    opt(out, v.map(i64::to_le_bytes));
                }
                Acc::SumF(v) => {
                    out.push(2);
                    opt(out, v.map(f64::to_le_bytes));
                }
                Acc::SumD(v) => {
                    out.push(3);
                    opt(out, v.map(i128::to_le_bytes));
                }
                Acc::Avg(s, n) => {
                    out.push(4);
                    out.extend_from_slice(&s.to_le_bytes());
                    out.extend_from_slice(&n.to_le_bytes());
                }
                Acc::Int(v) => {
                    out.push(5);
                    opt(out, v.map(i64::to_le_bytes));
                }
                Acc::Row(v) => {
                    out.push(6);
                    match v {
                        Some(r) => {
                            let bytes = r.row();
                            let bytes = bytes.as_ref();
                            out.push(1);
                            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                            out.extend_from_slice(bytes);
                        }
                        None => out.push(0),
                    }
                }
                Acc::Var(n, mean, m2) => {
                    out.push(7);
                    out.extend_from_slice(&n.to_le_bytes());
                    out.extend_from_slice(&mean.to_le_bytes());
                    out.extend_from_slice(&m2.to_le_bytes());
                }
                Acc::Distinct(_) => {
                    return Err(Error::new(
                        &codes::UNSUPPORTED_STREAMING_OP,
                        "count_distinct cannot be checkpointed",
                    ))
                }
            }
        }
        Ok(())
    }

    /// One group's state as [`Accumulators::encode`] wrote it. Bytes of another shape are
    /// `ETL801` (they come from disk).
    pub fn decode(&self, bytes: &[u8]) -> Result<Vec<Acc>> {
        let bad = || {
            corrupt_state(
                "aggregation",
                "a group's accumulators do not fit the aggregation",
            )
        };
        let mut c = Cursor { bytes, at: 0 };
        let mut out = Vec::with_capacity(self.specs.len());
        for conv in &self.converters {
            let acc = match c.byte().ok_or_else(bad)? {
                0 => Acc::Count(c.i64().ok_or_else(bad)?),
                1 => Acc::SumI(c.opt(Cursor::i64).ok_or_else(bad)?),
                2 => Acc::SumF(c.opt(Cursor::f64).ok_or_else(bad)?),
                3 => Acc::SumD(c.opt(Cursor::i128).ok_or_else(bad)?),
                4 => {
                    let sum = c.f64().ok_or_else(bad)?;
                    Acc::Avg(sum, c.i64().ok_or_else(bad)?)
                }
                5 => Acc::Int(c.opt(Cursor::i64).ok_or_else(bad)?),
                7 => {
                    let n = c.i64().ok_or_else(bad)?;
                    let mean = c.f64().ok_or_else(bad)?;
                    Acc::Var(n, mean, c.f64().ok_or_else(bad)?)
                }
                6 => Acc::Row(match c.byte().ok_or_else(bad)? {
                    0 => None,
                    _ => {
                        let len = c.u32().ok_or_else(bad)? as usize;
                        let row = c.take(len).ok_or_else(bad)?;
                        let conv = conv.as_ref().ok_or_else(bad)?;
                        Some(conv.parser().parse(row).owned())
                    }
                }),
                _ => return Err(bad()),
            };
            out.push(acc);
        }
        if c.at != bytes.len() {
            return Err(bad());
        }
        Ok(out)
    }

    /// Rebuilds group states from snapshot columns (as written by `state_columns`). A
    /// missing column or one of another type is `ETL801`: snapshots come from disk.
    pub fn restore(&self, batch: &RecordBatch) -> Result<Vec<Vec<Acc>>> {
        const OP: &str = "aggregation";
        let n = batch.num_rows();
        let mut groups: Vec<Vec<Acc>> = (0..n).map(|_| self.init()).collect();
        let col = |name: &str| {
            batch
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| corrupt_state(OP, format!("no column `{name}`")))
        };
        for (i, s) in self.specs.iter().enumerate() {
            match s.func {
                AggFunc::Average => {
                    let sums: Float64Array = state_column(batch, &format!("{}__sum", s.name), OP)?;
                    let counts: Int64Array =
                        state_column(batch, &format!("{}__count", s.name), OP)?;
                    for (r, g) in groups.iter_mut().enumerate() {
                        g[i] = Acc::Avg(sums.value(r), counts.value(r));
                    }
                }
                f if is_variance(f) => {
                    let counts: Int64Array =
                        state_column(batch, &format!("{}__count", s.name), OP)?;
                    let means: Float64Array =
                        state_column(batch, &format!("{}__mean", s.name), OP)?;
                    let m2s: Float64Array = state_column(batch, &format!("{}__m2", s.name), OP)?;
                    for (r, g) in groups.iter_mut().enumerate() {
                        g[i] = Acc::Var(counts.value(r), means.value(r), m2s.value(r));
                    }
                }
                _ if s.keeps_int() => {
                    let c = col(&s.name)?;
                    // Written in the input type (see `state_columns`).
                    if Some(c.data_type()) != s.input_type.as_ref() {
                        return Err(corrupt_state(
                            OP,
                            format!("column `{}` is {}", s.name, c.data_type()),
                        ));
                    }
                    let values = i64s(&c)?;
                    for (r, g) in groups.iter_mut().enumerate() {
                        g[i] = Acc::Int(values.is_valid(r).then(|| values.value(r)));
                    }
                }
                _ => {
                    let init = match groups.first() {
                        Some(g) => &g[i],
                        None => continue,
                    };
                    match init {
                        Acc::Count(_) => {
                            let a: Int64Array = state_column(batch, &s.name, OP)?;
                            for (r, g) in groups.iter_mut().enumerate() {
                                g[i] = Acc::Count(a.value(r));
                            }
                        }
                        Acc::SumI(_) => {
                            let a: Int64Array = state_column(batch, &s.name, OP)?;
                            for (r, g) in groups.iter_mut().enumerate() {
                                g[i] = Acc::SumI(a.is_valid(r).then(|| a.value(r)));
                            }
                        }
                        Acc::SumF(_) => {
                            let a: Float64Array = state_column(batch, &s.name, OP)?;
                            for (r, g) in groups.iter_mut().enumerate() {
                                g[i] = Acc::SumF(a.is_valid(r).then(|| a.value(r)));
                            }
                        }
                        Acc::SumD(_) => {
                            let a: Decimal128Array = state_column(batch, &s.name, OP)?;
                            for (r, g) in groups.iter_mut().enumerate() {
                                g[i] = Acc::SumD(a.is_valid(r).then(|| a.value(r)));
                            }
                        }
                        _ => {
                            let c = col(&s.name)?;
                            for g in groups.iter_mut() {
                                g[i] = Acc::Row(None);
                            }
                            if s.uses_rows() {
                                let conv = self.converters[i]
                                    .as_ref()
                                    .expect("row aggregates have converters");
                                let rows = conv.convert_columns(std::slice::from_ref(&c)).map_err(
                                    |e| corrupt_state(OP, format!("column `{}`: {e}", s.name)),
                                )?;
                                for (r, g) in groups.iter_mut().enumerate() {
                                    g[i] = Acc::Row(c.is_valid(r).then(|| rows.row(r).owned()));
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(groups)
    }
}

/// Adds row `i` of one prepared input to one accumulator.
#[inline]
fn update_one(acc: &mut Acc, input: &AggInput, spec: &AggSpec, i: usize) -> Result<()> {
    match (acc, input) {
        (Acc::Count(n), AggInput::None) => *n += 1,
        (Acc::Count(n), AggInput::Any(a)) => {
            if a.is_valid(i) {
                *n += 1
            }
        }
        (Acc::SumI(s), AggInput::I64(a)) => {
            if a.is_valid(i) {
                let v = a.value(i);
                *s = Some(match s {
                    Some(x) => x.checked_add(v).ok_or_else(|| {
                        Error::new(
                            &codes::ENGINE_ERROR,
                            format!("sum `{}` overflows a 64-bit integer", spec.name),
                        )
                    })?,
                    None => v,
                });
            }
        }
        (Acc::SumF(s), AggInput::F64(a)) => {
            if a.is_valid(i) {
                *s = Some(s.unwrap_or(0.0) + a.value(i));
            }
        }
        (Acc::SumD(s), AggInput::D128(a)) => {
            if a.is_valid(i) {
                *s = Some(s.unwrap_or(0) + a.value(i));
            }
        }
        (Acc::Avg(sum, n), AggInput::F64(a)) => {
            if a.is_valid(i) {
                *sum += a.value(i);
                *n += 1;
            }
        }
        (Acc::Var(n, mean, m2), AggInput::F64(a)) => {
            if a.is_valid(i) {
                (*n, *mean, *m2) = merge_moments((*n, *mean, *m2), (1, a.value(i), 0.0));
            }
        }
        (Acc::Row(v), AggInput::Rows(arr, rows)) => {
            if arr.is_valid(i) {
                let r = rows.row(i);
                let replace = match (spec.func, v.as_ref()) {
                    (_, None) => true,
                    (AggFunc::Min, Some(cur)) => r < cur.row(),
                    (AggFunc::Max, Some(cur)) => r > cur.row(),
                    (AggFunc::Last, Some(_)) => true,
                    _ => false,
                };
                if replace {
                    *v = Some(r.owned());
                }
            }
        }
        (Acc::Int(v), AggInput::I64(a)) => {
            if a.is_valid(i) {
                *v = Some(pick(spec.func, *v, a.value(i)));
            }
        }
        (Acc::Distinct(set), AggInput::Rows(arr, rows)) => {
            if arr.is_valid(i) {
                set.insert(rows.row(i).as_ref().to_vec());
            }
        }
        _ => {
            return Err(Error::new(
                &codes::ENGINE_ERROR,
                "aggregate input does not match its state",
            ))
        }
    }
    Ok(())
}

/// Count, mean and sum of squared deviations of two parts combined (Chan et al.; with
/// a part of one value it is Welford's update).
fn merge_moments(a: (i64, f64, f64), b: (i64, f64, f64)) -> (i64, f64, f64) {
    let (n1, mean1, m21) = a;
    let (n2, mean2, m22) = b;
    if n2 == 0 {
        return a;
    }
    if n1 == 0 {
        return b;
    }
    let n = n1 + n2;
    let delta = mean2 - mean1;
    let mean = mean1 + delta * n2 as f64 / n as f64;
    let m2 = m21 + m22 + delta * delta * (n1 as f64) * (n2 as f64) / n as f64;
    (n, mean, m2)
}

/// The value a min/max/first/last keeps after `current` when `next` comes.
#[inline]
fn pick(func: AggFunc, current: Option<i64>, next: i64) -> i64 {
    match (func, current) {
        (_, None) => next,
        (AggFunc::Min, Some(c)) => c.min(next),
        (AggFunc::Max, Some(c)) => c.max(next),
        (AggFunc::Last, Some(_)) => next,
        (_, Some(c)) => c,
    }
}

/// [`Accumulators::update_groups`] for one integer min/max/first/last (aggregate `j` of
/// `n`): one loop over the rows, without dispatch per row.
fn update_ints(
    states: &mut [Acc],
    ids: &[usize],
    n: usize,
    j: usize,
    values: &Int64Array,
    func: AggFunc,
) -> Result<()> {
    let mismatch = || Error::engine("aggregate input does not match its state");
    if values.null_count() == 0 {
        for (&g, &v) in ids.iter().zip(values.values()) {
            let Acc::Int(cur) = &mut states[g * n + j] else {
                return Err(mismatch());
            };
            *cur = Some(pick(func, *cur, v));
        }
    } else {
        for (row, &g) in ids.iter().enumerate() {
            if values.is_valid(row) {
                let Acc::Int(cur) = &mut states[g * n + j] else {
                    return Err(mismatch());
                };
                *cur = Some(pick(func, *cur, values.value(row)));
            }
        }
    }
    Ok(())
}

fn i64s(c: &ArrayRef) -> Result<Int64Array> {
    cast_to::<Int64Type>(c)
}

fn add_opt<T: Copy>(a: Option<T>, b: Option<T>, f: impl Fn(T, T) -> T) -> Option<T> {
    match (a, b) {
        (Some(x), Some(y)) => Some(f(x, y)),
        (x, None) => x,
        (None, y) => y,
    }
}

fn f64s(c: &ArrayRef) -> Result<Float64Array> {
    cast_to::<Float64Type>(c)
}

/// The column cast to the primitive type `T`.
fn cast_to<T: ArrowPrimitiveType>(c: &ArrayRef) -> Result<PrimitiveArray<T>> {
    Ok(cast(c, &T::DATA_TYPE)
        .map_err(Error::engine)?
        .as_primitive::<T>()
        .clone())
}

/// Reads what [`Accumulators::encode`] wrote.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn byte(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn f64(&mut self) -> Option<f64> {
        Some(f64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn i128(&mut self) -> Option<i128> {
        Some(i128::from_le_bytes(self.take(16)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    /// A flag byte, then the value when it is 1.
    fn opt<T>(&mut self, value: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        match self.byte()? {
            0 => Some(None),
            _ => value(self).map(Some),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;

    fn spec(name: &str, func: AggFunc, t: Option<DataType>) -> AggSpec {
        AggSpec {
            name: name.into(),
            func,
            input_type: t,
        }
    }

    /// Variances split over micro-batches equal those of all rows at once, and their
    /// state survives encoding and snapshots.
    #[test]
    fn variances_merge_across_batches() {
        let accs = Accumulators::new(vec![
            spec("v", AggFunc::Variance, Some(DataType::Int64)),
            spec("vp", AggFunc::VariancePopulation, Some(DataType::Int64)),
            spec("s", AggFunc::Stddev, Some(DataType::Float64)),
            spec("sp", AggFunc::StddevPopulation, Some(DataType::Float64)),
        ])
        .unwrap();
        let feed = |values: &[Option<i64>]| {
            let col: ArrayRef = Arc::new(Int64Array::from(values.to_vec()));
            let inputs = accs.prepare(&vec![Some(col); 4]).unwrap();
            let mut state = accs.init();
            for i in 0..values.len() {
                accs.update(&mut state, &inputs, i).unwrap();
            }
            state
        };
        let mut split = feed(&[Some(1), None, Some(2)]);
        let mut rest = feed(&[Some(3), Some(4)]);
        accs.merge(&mut split, &mut rest).unwrap();
        let whole = feed(&[Some(1), Some(2), Some(3), Some(4), None]);
        let out = |state: &Vec<Acc>| -> Vec<f64> {
            accs.finish(std::iter::once(state.as_slice()))
                .unwrap()
                .iter()
                .map(|c| c.as_primitive::<Float64Type>().value(0))
                .collect()
        };
        // 1, 2, 3, 4: squared deviations sum to 5.
        let expected = [5.0 / 3.0, 1.25, (5.0f64 / 3.0).sqrt(), 1.25f64.sqrt()];
        for (got, want) in out(&split)
            .iter()
            .zip(expected)
            .chain(out(&whole).iter().zip(expected))
        {
            assert!((got - want).abs() < 1e-12, "{got} != {want}");
        }
        let mut bytes = Vec::new();
        accs.encode(&split, &mut bytes).unwrap();
        assert_eq!(accs.decode(&bytes).unwrap(), split);
        let (fields, columns): (Vec<Field>, Vec<ArrayRef>) = accs
            .state_columns(std::iter::once(split.as_slice()))
            .unwrap()
            .into_iter()
            .unzip();
        let batch =
            RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(fields)), columns).unwrap();
        assert_eq!(accs.restore(&batch).unwrap(), vec![split.clone()]);
        // One value: no sample variance, a population variance of 0.
        let one = feed(&[Some(7)]);
        let c = accs.finish(std::iter::once(one.as_slice())).unwrap();
        assert!(c[0].is_null(0));
        assert_eq!(c[1].as_primitive::<Float64Type>().value(0), 0.0);
    }

    /// Every kind of accumulator state reads back as written; bytes of another shape are
    /// ETL801, never a panic.
    #[test]
    fn group_state_encodes_and_decodes() {
        let accs = Accumulators::new(vec![
            spec("n", AggFunc::CountAll, None),
            spec("s", AggFunc::Sum, Some(DataType::Int64)),
            spec("f", AggFunc::Sum, Some(DataType::Float64)),
            spec("d", AggFunc::Sum, Some(DataType::Decimal128(10, 2))),
            spec("a", AggFunc::Average, Some(DataType::Int64)),
            spec("mi", AggFunc::Min, Some(DataType::Int64)),
            spec("ms", AggFunc::Max, Some(DataType::Utf8)),
        ])
        .unwrap();
        let conv = RowConverter::new(vec![SortField::new(DataType::Utf8)]).unwrap();
        let row = conv
            .convert_columns(&[Arc::new(StringArray::from(vec!["zeta"])) as ArrayRef])
            .unwrap()
            .row(0)
            .owned();
        let groups = [
            accs.init(),
            vec![
                Acc::Count(7),
                Acc::SumI(Some(-3)),
                Acc::SumF(Some(2.5)),
                Acc::SumD(Some(-12_345_678_901_234)),
                Acc::Avg(7.25, 3),
                Acc::Int(Some(i64::MIN)),
                Acc::Row(Some(row)),
            ],
        ];
        for g in &groups {
            let mut bytes = Vec::new();
            accs.encode(g, &mut bytes).unwrap();
            assert_eq!(&accs.decode(&bytes).unwrap(), g);
            for cut in [0, 1, bytes.len() / 2, bytes.len() - 1] {
                assert_eq!(accs.decode(&bytes[..cut]).unwrap_err().code(), "ETL801");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(accs.decode(&longer).unwrap_err().code(), "ETL801");
        }
    }

    #[test]
    fn spark_result_types_and_null_handling() {
        let accs = Accumulators::new(vec![
            spec("n", AggFunc::CountAll, None),
            spec("nv", AggFunc::Count, Some(DataType::Int64)),
            spec("s", AggFunc::Sum, Some(DataType::Int64)),
            spec("a", AggFunc::Average, Some(DataType::Int64)),
            spec("mn", AggFunc::Min, Some(DataType::Utf8)),
            spec("mx", AggFunc::Max, Some(DataType::Utf8)),
        ])
        .unwrap();
        let v: ArrayRef = Arc::new(Int64Array::from(vec![Some(2), None, Some(5)]));
        let s: ArrayRef = Arc::new(StringArray::from(vec![Some("b"), Some("a"), None]));
        let inputs = accs
            .prepare(&[
                None,
                Some(v.clone()),
                Some(v.clone()),
                Some(v),
                Some(s.clone()),
                Some(s),
            ])
            .unwrap();
        let mut g1 = accs.init();
        let mut g2 = accs.init();
        for i in 0..3 {
            accs.update(&mut g1, &inputs, i).unwrap();
        }
        accs.update(&mut g2, &inputs, 1).unwrap();
        let groups = [g1, g2];
        let cols = accs.finish(groups.iter().map(|g| g.as_slice())).unwrap();
        assert_eq!(
            cols[0]
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values(),
            &[3, 1]
        );
        assert_eq!(
            cols[1]
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values(),
            &[2, 0]
        );
        let sums = cols[2].as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!((sums.value(0), sums.is_null(1)), (7, true));
        let avg = cols[3].as_any().downcast_ref::<Float64Array>().unwrap();
        assert_eq!((avg.value(0), avg.is_null(1)), (3.5, true));
        let mn = cols[4].as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!((mn.value(0), mn.value(1)), ("a", "a"));
        let mx = cols[5].as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(mx.value(0), "b");
        // Snapshot and restore.
        let state = accs
            .state_columns(groups.iter().map(|g| g.as_slice()))
            .unwrap();
        let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = state.into_iter().unzip();
        let batch =
            RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(fields)), arrays).unwrap();
        let back = accs.restore(&batch).unwrap();
        assert_eq!(back, groups.to_vec());
    }

    #[test]
    fn integer_min_max_first_last_keep_plain_integers() {
        use arrow::array::{Int32Array, TimestampMillisecondArray};
        let ts = DataType::Timestamp(arrow::datatypes::TimeUnit::Millisecond, Some("UTC".into()));
        let accs = Accumulators::new(vec![
            spec("mn", AggFunc::Min, Some(DataType::Int32)),
            spec("mx", AggFunc::Max, Some(DataType::Int32)),
            spec("first", AggFunc::First, Some(DataType::Int32)),
            spec("last", AggFunc::Last, Some(DataType::Int32)),
            spec("latest", AggFunc::Max, Some(ts.clone())),
        ])
        .unwrap();
        assert!(accs.init().iter().all(|a| matches!(a, Acc::Int(None))));
        let v: ArrayRef = Arc::new(Int32Array::from(vec![Some(4), None, Some(-7), Some(9)]));
        let t: ArrayRef = Arc::new(
            TimestampMillisecondArray::from(vec![Some(30), Some(10), None, Some(20)])
                .with_timezone("UTC"),
        );
        let inputs = accs
            .prepare(&[
                Some(v.clone()),
                Some(v.clone()),
                Some(v.clone()),
                Some(v),
                Some(t),
            ])
            .unwrap();
        // Rows 0 and 2 go to group 0, rows 1 and 3 to group 1; group 2 sees no row.
        let mut states = Vec::new();
        for _ in 0..3 {
            accs.init_into(&mut states);
        }
        accs.update_groups(&mut states, &[0, 1, 0, 1], &inputs)
            .unwrap();
        let ints = |c: &ArrayRef| -> Vec<Option<i32>> {
            c.as_any()
                .downcast_ref::<Int32Array>()
                .unwrap()
                .iter()
                .collect()
        };
        let cols = accs.finish(states.chunks(5)).unwrap();
        assert_eq!(ints(&cols[0]), [Some(-7), Some(9), None]);
        assert_eq!(ints(&cols[1]), [Some(4), Some(9), None]);
        assert_eq!(ints(&cols[2]), [Some(4), Some(9), None]);
        assert_eq!(ints(&cols[3]), [Some(-7), Some(9), None]);
        assert_eq!(cols[4].data_type(), &ts);
        let latest = cols[4]
            .as_any()
            .downcast_ref::<TimestampMillisecondArray>()
            .unwrap();
        assert_eq!(
            latest.iter().collect::<Vec<_>>(),
            [Some(30), Some(20), None]
        );
        // Merging a later state: min/max compare, first keeps, last takes the later value.
        let (earlier, later) = states.split_at_mut(5);
        accs.merge(earlier, &mut later[..5]).unwrap();
        let cols = accs.finish(states.chunks(5).take(1)).unwrap();
        assert_eq!(ints(&cols[0]), [Some(-7)]);
        assert_eq!(ints(&cols[1]), [Some(9)]);
        assert_eq!(ints(&cols[2]), [Some(4)]);
        assert_eq!(ints(&cols[3]), [Some(9)]);
        // Snapshot and restore, in the input types.
        let state = accs.state_columns(states.chunks(5)).unwrap();
        assert_eq!(state[0].0.data_type(), &DataType::Int32);
        let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = state.into_iter().unzip();
        let batch =
            RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(fields)), arrays).unwrap();
        let back = accs.restore(&batch).unwrap();
        assert_eq!(back.concat(), states);
    }
}
