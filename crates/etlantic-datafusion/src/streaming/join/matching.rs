//! Matching a micro-batch's rows of one side against the other side's state: keys,
//! time ranges and the join predicate, the rows emitted (with the nulls of an outer
//! join), the keys a unique side repeats.

use super::*;

impl StreamJoinOperator {
    /// Steps 1-3 for one side: filter, join with the other side's state, store.
    /// Adds the joined pairs (left ref, right ref) to `pairs`.
    pub(super) fn run_side(
        &mut self,
        side: usize,
        input: &[RecordBatch],
        ctx: &OpContext,
        pairs: &mut Vec<(Option<RowRef>, Option<RowRef>)>,
    ) -> Result<SideRun> {
        let spec = self.spec(side).clone();
        let other = 1 - side;
        let nonempty: Vec<&RecordBatch> = input.iter().filter(|b| b.num_rows() > 0).collect();
        let batch = match nonempty.as_slice() {
            [] => return Ok(SideRun::default()),
            [one] => (*one).clone(),
            _ => concat_batches(&spec.schema, nonempty).map_err(Error::engine)?,
        };
        // 1. Filter: never-matching rows of a non-preserved side, late rows.
        let null_key = self.null_keys(side, &batch)?;
        // The range, watermark and eviction columns are often one (Nexmark q7's
        // `date_time`): its times are read once.
        let range = Self::times(&batch, self.range_column(side))?;
        let wm_owned;
        let wm_times: &[Option<i64>] =
            if spec.watermark_column.as_deref() == self.range_column(side) {
                &range
            } else {
                wm_owned = Self::times(&batch, spec.watermark_column.as_deref())?;
                &wm_owned
            };
        let mut keep = Vec::with_capacity(batch.num_rows());
        let mut late = Vec::new();
        for i in 0..batch.num_rows() {
            let hopeless = null_key[i] || (self.layout.time_range.is_some() && range[i].is_none());
            if hopeless && !self.preserved[side] {
                keep.push(false);
                continue;
            }
            let is_late = ctx.has_watermark
                && !spec.accept_late
                && wm_times[i].is_some_and(|t| t <= ctx.late_watermark_us);
            if is_late {
                late.push(i as u32);
            }
            keep.push(!is_late);
        }
        let late_batch = if late.is_empty() {
            None
        } else {
            let idx = UInt32Array::from(late.clone());
            let cols = batch
                .columns()
                .iter()
                .map(|c| arrow::compute::take(c, &idx, None))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(Error::engine)?;
            Some(RecordBatch::try_new(batch.schema(), cols).map_err(Error::engine)?)
        };
        let all_kept = keep.iter().all(|k| *k);
        let kept = if all_kept {
            batch
        } else {
            filter_record_batch(&batch, &BooleanArray::from(keep)).map_err(Error::engine)?
        };
        let late_count = late.len() as u64;
        if kept.num_rows() == 0 {
            return Ok(SideRun {
                late: late_batch,
                late_count,
                ..SideRun::default()
            });
        }
        let (rows, null_key) = self.key_rows(side, &kept)?;
        // Each key is hashed once, for both sides' state (they share the hasher).
        let hashes: Vec<u64> = (0..rows.num_rows())
            .map(|i| self.sides[side].hash(rows.row(i).as_ref()))
            .collect();
        let duplicate = if self.unique[side] {
            self.repeated_keys(side, &rows, &hashes, &null_key)
        } else {
            vec![false; kept.num_rows()]
        };
        let duplicates = take_rows(&kept, &duplicate)?;
        let range = if all_kept {
            range
        } else {
            Self::times(&kept, self.range_column(side))?
        };
        let evict_col = self.evictions[side].as_ref().map(|e| e.column.clone());
        let evict_owned;
        let evict_times: &[Option<i64>] = if evict_col.as_deref() == self.range_column(side) {
            &range
        } else {
            evict_owned = Self::times(&kept, evict_col.as_deref())?;
            &evict_owned
        };
        let chunk = self.sides[side].add_chunk(kept.clone());

        // 2./3. Join with the other side's state.
        let (lower, upper) = self
            .layout
            .time_range
            .as_ref()
            .map(|r| (r.lower.as_micros(), r.upper.as_micros()))
            .unwrap_or((0, 0));
        let in_range = |this_t: Option<i64>, that_t: Option<i64>| -> bool {
            if self.layout.time_range.is_none() {
                return true;
            }
            let (Some(a), Some(b)) = (this_t, that_t) else {
                return false;
            };
            let (lt, rt) = if side == LEFT { (a, b) } else { (b, a) };
            lt >= rt - lower && lt <= rt + upper
        };
        // Candidates: (row of this batch, slot of the other side's entry).
        self.sides[other].prepare_probes(kept.num_rows());
        let mut candidates: Vec<(usize, u32)> = Vec::new();
        // Whether the other side holds the row's key, and (when this side is unique) the
        // other side's entries of the keys probed.
        let mut other_holds_key = vec![false; kept.num_rows()];
        let mut probed: Vec<u32> = Vec::new();
        // An empty other side matches nothing (Nexmark q7: the window maxima are evicted
        // soon after they meet the bids, so most bids find none to probe).
        let probes = if self.sides[other].rows == 0 {
            0
        } else {
            kept.num_rows()
        };
        for i in 0..probes {
            if null_key[i] || duplicate[i] {
                continue;
            }
            for (slot, e) in self.sides[other].matches_hashed(hashes[i], rows.row(i).as_ref()) {
                other_holds_key[i] = true;
                if self.unique[side] {
                    probed.push(slot);
                }
                if in_range(range[i], e.range_time.get()) {
                    candidates.push((i, slot));
                }
            }
        }
        let accepted: Vec<bool> = match &self.predicate {
            None => vec![true; candidates.len()],
            Some(_) if candidates.is_empty() => vec![],
            Some((expr, schema)) => {
                let this_refs: Vec<Option<RowRef>> = candidates
                    .iter()
                    .map(|(i, _)| Some((chunk, *i as u32)))
                    .collect();
                let other_refs: Vec<Option<RowRef>> = candidates
                    .iter()
                    .map(|(_, slot)| {
                        let e = self.sides[other].entry(*slot);
                        Some((e.chunk, e.row))
                    })
                    .collect();
                let (lrefs, rrefs) = if side == LEFT {
                    (this_refs, other_refs)
                } else {
                    (other_refs, this_refs)
                };
                let mut cols = self.gather(LEFT, &lrefs)?;
                cols.extend(self.gather(RIGHT, &rrefs)?);
                let joined = RecordBatch::try_new(schema.clone(), cols).map_err(Error::engine)?;
                let v = expr
                    .evaluate(&joined)
                    .and_then(|v| v.into_array(joined.num_rows()))
                    .map_err(Error::engine)?;
                let b = v
                    .as_any()
                    .downcast_ref::<BooleanArray>()
                    .ok_or_else(|| Error::engine("a join predicate must be boolean"))?;
                (0..b.len()).map(|k| b.is_valid(k) && b.value(k)).collect()
            }
        };
        let mut matched = vec![false; kept.num_rows()];
        for ((i, slot), ok) in candidates.iter().zip(accepted) {
            if !ok {
                continue;
            }
            let st = &mut self.sides[other];
            let e = *st.entry(*slot);
            // Only a preserved side's mark is read (its unmatched rows are emitted at
            // eviction); marking a row makes it a change the next checkpoint writes,
            // so an inner join's rows are left as they are (Nexmark q3 wrote each
            // person again in the checkpoint after its first auction).
            if (self.preserved[other] && !e.matched) || self.ttl.is_some() {
                let e = st.entry_mut(*slot);
                e.matched = true;
                if self.ttl.is_some() {
                    // A match keeps the buffered row alive.
                    e.updated_ms = Some(ctx.processing_time_ms).into();
                }
            }
            let that_ref = Some((e.chunk, e.row));
            matched[*i] = true;
            let this_ref = Some((chunk, *i as u32));
            pairs.push(if side == LEFT {
                (this_ref, that_ref)
            } else {
                (that_ref, this_ref)
            });
        }
        // This side is unique: the other side's rows of the keys it met can meet no
        // other row, and go unless they are unmatched rows of a preserved side (emitted
        // when evicted).
        let removed_other = if probed.is_empty() {
            0
        } else {
            let st = &self.sides[other];
            let done: Vec<u32> = probed
                .into_iter()
                .filter(|slot| !self.preserved[other] || st.entry(*slot).matched)
                .collect();
            self.sides[other].remove_slots(&done) as u64
        };
        // Store. Rows of the side that goes first always (they may still meet this
        // batch's rows of the other side); the second side's rows unless they are
        // evicted right away, except unmatched rows of a preserved side, which are
        // emitted at eviction. Neither when the other side is
        // unique and holds the row's key (its one row of that key is the only one the
        // row can ever meet), unless it is an unmatched row of a preserved side;
        // rejected duplicates never.
        let threshold = self.threshold_us(side, ctx);
        // Keys of one schema are mostly of one length: the first one's is the estimate.
        let key_len = if rows.num_rows() > 0 {
            rows.row(0).as_ref().len()
        } else {
            0
        };
        self.sides[side].reserve(kept.num_rows(), kept.num_rows() * key_len);
        let mut added = 0;
        let mut not_kept = 0;
        for i in 0..kept.num_rows() {
            let evicting_now = threshold.is_some_and(|th| evict_times[i].is_some_and(|t| t <= th));
            let waits_outer = self.preserved[side] && !matched[i];
            let met_its_match = self.unique[other] && other_holds_key[i];
            let released = met_its_match && !waits_outer;
            not_kept += u64::from(released);
            let add = !duplicate[i]
                && !released
                && (side == self.first_side() || !evicting_now || waits_outer);
            if add {
                self.sides[side].insert_hashed(
                    hashes[i],
                    rows.row(i).as_ref(),
                    Entry {
                        seq: 0,
                        chunk,
                        row: i as u32,
                        range_time: range[i].into(),
                        evict_time: evict_times[i].into(),
                        matched: matched[i],
                        updated_ms: Some(ctx.processing_time_ms).into(),
                    },
                );
                added += 1;
            }
        }
        Ok(SideRun {
            late: late_batch,
            late_count,
            added,
            removed_other,
            not_kept,
            duplicates,
        })
    }

    /// The side whose input meets the state first in a micro-batch (the other side's
    /// input then meets the state with this batch's rows of the first in it): the left,
    /// as in Spark, unless only the right side is unique. Its rows then go first, so
    /// that the left rows of the same batch find their right row in state and are not
    /// kept, instead of being kept and dropped again when it comes (Nexmark q4: most bids
    /// arrive in the micro-batch of their auction). The output holds the same pairs
    /// either way, in another order.
    pub(super) fn first_side(&self) -> usize {
        if self.unique[RIGHT] && !self.unique[LEFT] {
            RIGHT
        } else {
            LEFT
        }
    }

    /// Which rows repeat a key of this (unique) side: one it holds, or one an earlier
    /// row of the batch has. `hashes` are the rows' key hashes ([`SideState::hash`]).
    pub(super) fn repeated_keys(
        &mut self,
        side: usize,
        rows: &Rows,
        hashes: &[u64],
        null_key: &[bool],
    ) -> Vec<bool> {
        let state = &mut self.sides[side];
        state.prepare_probes(rows.num_rows());
        // The batch's keys so far, by row, hashed with the state's hashes.
        let mut seen: hashbrown::HashTable<u32> =
            hashbrown::HashTable::with_capacity(rows.num_rows());
        (0..rows.num_rows())
            .map(|i| {
                if null_key[i] {
                    return false;
                }
                let (hash, key) = (hashes[i], rows.row(i));
                let earlier = match seen.entry(
                    hash,
                    |&j| rows.row(j as usize) == key,
                    |&j| hashes[j as usize],
                ) {
                    hashbrown::hash_table::Entry::Occupied(_) => true,
                    hashbrown::hash_table::Entry::Vacant(v) => {
                        v.insert(i as u32);
                        false
                    }
                };
                earlier || state.matches_hashed(hash, key.as_ref()).next().is_some()
            })
            .collect()
    }

    /// The columns of `side` for `refs` (`None`: nulls).
    ///
    /// Changelogs and snapshots gather the rows of whole micro-batches in arrival order:
    /// when `refs` are few runs of consecutive rows of one chunk, the runs are sliced
    /// (no copy for one run, one copy for several) instead of interleaved row by row.
    pub(super) fn gather(&self, side: usize, refs: &[Option<RowRef>]) -> Result<Vec<ArrayRef>> {
        if let Some(runs) = row_runs(refs) {
            return self.gather_runs(side, &runs);
        }
        let state = &self.sides[side];
        let mut order: Vec<u32> = Vec::new();
        let mut pos: FastMap<u32, usize> = FastMap::default();
        // Consecutive refs are mostly of one chunk: its position is remembered, so the
        // map is looked up once per change of chunk, not once per row.
        let mut last: Option<(u32, usize)> = None;
        let indices: Vec<(usize, usize)> = refs
            .iter()
            .map(|r| match r {
                None => (0, 0),
                Some((c, row)) => {
                    let p = match last {
                        Some((lc, lp)) if lc == *c => lp,
                        _ => {
                            let p = *pos.entry(*c).or_insert_with(|| {
                                order.push(*c);
                                order.len()
                            });
                            last = Some((*c, p));
                            p
                        }
                    };
                    (p, *row as usize)
                }
            })
            .collect();
        let batches: Vec<&RecordBatch> = order
            .iter()
            .map(|c| {
                state
                    .chunks
                    .get(c)
                    .ok_or_else(|| Error::engine(format!("join state chunk {c} is gone")))
            })
            .collect::<Result<_>>()?;
        let n = self.spec(side).schema.fields().len();
        (0..n)
            .map(|j| {
                let mut arrays: Vec<&dyn Array> = vec![self.nulls[side][j].as_ref()];
                arrays.extend(batches.iter().map(|b| b.column(j).as_ref()));
                interleave(&arrays, &indices).map_err(Error::engine)
            })
            .collect()
    }

    /// The columns of `side` for runs of rows (chunk, first row, length).
    pub(super) fn gather_runs(
        &self,
        side: usize,
        runs: &[(u32, u32, u32)],
    ) -> Result<Vec<ArrayRef>> {
        let state = &self.sides[side];
        let slices: Vec<RecordBatch> = runs
            .iter()
            .map(|(c, row, len)| {
                state
                    .chunks
                    .get(c)
                    .map(|b| b.slice(*row as usize, *len as usize))
                    .ok_or_else(|| Error::engine(format!("join state chunk {c} is gone")))
            })
            .collect::<Result<_>>()?;
        let schema = &self.spec(side).schema;
        match slices.as_slice() {
            [one] => Ok(one.columns().to_vec()),
            many => Ok(concat_batches(schema, many)
                .map_err(Error::engine)?
                .columns()
                .to_vec()),
        }
    }

    pub(super) fn emit(&self, pairs: &[(Option<RowRef>, Option<RowRef>)]) -> Result<RecordBatch> {
        let schema = self.layout.output_schema.clone();
        if pairs.is_empty() {
            return Ok(RecordBatch::new_empty(schema));
        }
        let lrefs: Vec<Option<RowRef>> = pairs.iter().map(|p| p.0).collect();
        let rrefs: Vec<Option<RowRef>> = pairs.iter().map(|p| p.1).collect();
        let lcols = self.gather(LEFT, &lrefs)?;
        let rcols = self.gather(RIGHT, &rrefs)?;
        let mut cols = Vec::with_capacity(self.out_cols.len());
        for (oc, f) in self.out_cols.iter().zip(schema.fields()) {
            let to = |a: &ArrayRef| -> Result<ArrayRef> {
                if a.data_type() == f.data_type() {
                    Ok(a.clone())
                } else {
                    cast(a, f.data_type()).map_err(Error::engine)
                }
            };
            cols.push(match oc {
                OutCol::Left(j) => to(&lcols[*j])?,
                OutCol::Right(j) => to(&rcols[*j])?,
                OutCol::Merged(lj, rj) => {
                    let (l, r) = (to(&lcols[*lj])?, to(&rcols[*rj])?);
                    let mask = is_not_null(&l).map_err(Error::engine)?;
                    zip(&mask, &l, &r).map_err(Error::engine)?
                }
            });
        }
        RecordBatch::try_new(schema, cols).map_err(Error::engine)
    }
}

/// `refs` as runs of consecutive rows of one chunk (chunk, first row, length), when none
/// is `None` and the runs are long enough (64 rows on average) for slicing to beat
/// interleaving.
pub(super) fn row_runs(refs: &[Option<RowRef>]) -> Option<Vec<(u32, u32, u32)>> {
    let mut runs: Vec<(u32, u32, u32)> = Vec::new();
    for r in refs {
        let (chunk, row) = (*r)?;
        match runs.last_mut() {
            Some((c, first, len)) if *c == chunk && *first + *len == row => *len += 1,
            _ => {
                if runs.len() * 64 > refs.len() {
                    return None;
                }
                runs.push((chunk, row, 1));
            }
        }
    }
    Some(runs)
}

/// Compiles a join predicate over `left ++ right` columns (each column by its plain
/// name, the left one first when both sides have it, as in the batch join).
pub(super) fn compile_joined_predicate(
    p: &Expr,
    left: &SchemaRef,
    right: &SchemaRef,
) -> Result<(Arc<dyn PhysicalExpr>, SchemaRef)> {
    let l = DFSchema::try_from_qualified_schema(QUALIFIERS[LEFT], left).map_err(Error::engine)?;
    let r = DFSchema::try_from_qualified_schema(QUALIFIERS[RIGHT], right).map_err(Error::engine)?;
    let mut both = l.clone();
    both.merge(&r);
    let both = Arc::new(both);
    let mut bindings: IndexMap<String, DfExpr> = IndexMap::new();
    for (q, s) in [(QUALIFIERS[LEFT], left), (QUALIFIERS[RIGHT], right)] {
        for f in s.fields() {
            bindings.entry(f.name().clone()).or_insert_with(|| {
                DfExpr::Column(Column::new(Some(TableReference::bare(q)), f.name()))
            });
        }
    }
    let scope = Scope::with_columns(both.clone(), bindings);
    let logical = compile_predicate(p, &scope)?;
    let state = crate::session::new_context().state();
    let physical = state
        .create_physical_expr(logical, &both)
        .map_err(Error::engine)?;
    let arrow_schema: SchemaRef = Arc::new(Schema::new(
        left.fields()
            .iter()
            .map(|f| f.as_ref().clone().with_name(format!("l.{}", f.name())))
            .chain(
                right
                    .fields()
                    .iter()
                    .map(|f| f.as_ref().clone().with_name(format!("r.{}", f.name()))),
            )
            .collect::<Vec<Field>>(),
    ));
    Ok((physical, arrow_schema))
}
