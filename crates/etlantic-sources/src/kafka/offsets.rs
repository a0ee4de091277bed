//! Where reads start and end: the Kafka source's offsets (Spark's JSON map), the
//! partitions and watermarks asked of the cluster, the starting positions of a new query
//! kept in the checkpoint, and the split of a micro-batch's budget over the partitions.

use super::{kafka_error, KafkaSource, PartitionOffsets, StartingOffsets};
use super::{INITIAL_FILE, META_TIMEOUT};
use etlantic_core::data::Offset;
use etlantic_core::diagnostics::{codes, Error, Result};
use rdkafka::consumer::Consumer;
use rdkafka::topic_partition_list::{Offset as KOffset, TopicPartitionList};
use serde_json::Value;
use std::collections::BTreeMap;

pub(super) fn parse_offset(offset: &Offset) -> Result<PartitionOffsets> {
    serde_json::from_value(offset.0.clone()).map_err(|_| {
        Error::new(
            &codes::CHECKPOINT_CORRUPT,
            format!(
                "`{}` is not a Kafka source offset (expected {{\"topic\":{{\"0\":42}}}})",
                offset.0
            ),
        )
    })
}

pub(super) fn to_offset(map: &PartitionOffsets) -> Offset {
    Offset(serde_json::to_value(map).unwrap_or(Value::Null))
}

/// Splits a micro-batch's `budget` of offsets over the partitions' backlogs `wants` the
/// way Spark's Kafka source does (`KafkaMicroBatchStream.rateLimit`): in proportion to
/// each backlog, rounded down, except that a partition whose share is below one offset
/// gets one (Spark does not starve small partitions, so the total may exceed the budget by
/// at most the number of such partitions). Proportional shares keep the partitions'
/// event times moving together: an equal split of a skewed topic lets the small
/// partitions run ahead, drag the watermark forward and make the big ones' rows late.
pub fn proportional_split(wants: &[u64], budget: u64) -> Vec<u64> {
    let total: u64 = wants.iter().sum();
    if total <= budget {
        return wants.to_vec();
    }
    wants
        .iter()
        .map(|&want| {
            if want == 0 {
                return 0;
            }
            let share = budget as f64 * (want as f64 / total as f64);
            let share = if share < 1.0 {
                share.ceil()
            } else {
                share.floor()
            };
            (share as u64).min(want)
        })
        .collect()
}

impl KafkaSource {
    /// The partitions of the topics now (metadata fetch), in `(topic, partition)` order.
    pub(super) fn partitions(&self) -> Result<Vec<(String, i32)>> {
        let mut out = Vec::new();
        for topic in &self.options.topics {
            let md = self
                .meta
                .fetch_metadata(Some(topic), META_TIMEOUT)
                .map_err(|e| kafka_error(&format!("fetch the metadata of `{topic}`"), e))?;
            for t in md.topics() {
                if t.name() != topic || t.error().is_some() {
                    continue; // unknown topic: no partitions yet
                }
                let mut ps: Vec<i32> = t
                    .partitions()
                    .iter()
                    .map(|p| p.id())
                    .filter(|p| {
                        self.options
                            .partitions
                            .as_ref()
                            .is_none_or(|l| l.contains(p))
                    })
                    .collect();
                ps.sort_unstable();
                out.extend(ps.into_iter().map(|p| (topic.clone(), p)));
            }
        }
        Ok(out)
    }

    fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64)> {
        self.meta
            .fetch_watermarks(topic, partition, META_TIMEOUT)
            .map_err(|e| kafka_error(&format!("fetch the watermarks of {topic}/{partition}"), e))
    }

    /// The low (`KOffset::Beginning`) or high (`KOffset::End`) watermarks of `parts`, in
    /// one request per partition leader rather than one round trip per partition (the
    /// same `ListOffsets` request, with the consumer's isolation level).
    pub(super) fn edge_offsets(
        &self,
        parts: &[(String, i32)],
        edge: KOffset,
    ) -> Result<BTreeMap<(String, i32), i64>> {
        let mut out = BTreeMap::new();
        if parts.is_empty() {
            return Ok(out);
        }
        let mut tpl = TopicPartitionList::new();
        for (t, p) in parts {
            tpl.add_partition_offset(t, *p, edge)
                .map_err(|e| kafka_error("build the offsets request", e))?;
        }
        let which = if edge == KOffset::End { "high" } else { "low" };
        let answered = self
            .meta
            .offsets_for_times(tpl, META_TIMEOUT)
            .map_err(|e| kafka_error(&format!("fetch the {which} watermarks"), e))?;
        for e in answered.elements() {
            let (t, p) = (e.topic(), e.partition());
            match (e.error(), e.offset()) {
                (Ok(()), KOffset::Offset(o)) => {
                    out.insert((t.to_string(), p), o);
                }
                (Err(err), _) => {
                    return Err(kafka_error(
                        &format!("fetch the {which} watermark of {t}/{p}"),
                        err,
                    ))
                }
                (Ok(()), other) => {
                    return Err(kafka_error(
                        &format!("fetch the {which} watermark of {t}/{p}"),
                        format!("the broker answered {other:?}"),
                    ))
                }
            }
        }
        for (t, p) in parts {
            if !out.contains_key(&(t.clone(), *p)) {
                return Err(kafka_error(
                    &format!("fetch the {which} watermark of {t}/{p}"),
                    "the broker did not answer for it",
                ));
            }
        }
        Ok(out)
    }

    /// The starting positions of a new query, resolved once and persisted.
    fn initial(&mut self, parts: &[(String, i32)]) -> Result<PartitionOffsets> {
        if let Some(i) = &self.initial {
            return Ok(i.clone());
        }
        let mut map = PartitionOffsets::new();
        for (t, p) in parts {
            let wanted = match &self.options.starting {
                StartingOffsets::Earliest => -2,
                StartingOffsets::Latest => -1,
                StartingOffsets::Specific(m) => {
                    m.get(t).and_then(|ps| ps.get(p)).copied().unwrap_or(-2)
                }
            };
            let (lo, hi) = self.watermarks(t, *p)?;
            let pos = match wanted {
                -2 => lo,
                -1 => hi,
                // Below the earliest offset: kept, so that the first read reports the
                // records retention took as lost (see Data loss).
                n => n.clamp(0, hi),
            };
            map.entry(t.clone()).or_default().insert(*p, pos);
        }
        if let Some(state) = &self.state {
            etlantic_core::storage::put_bytes(
                state.as_ref(),
                INITIAL_FILE,
                &serde_json::to_vec(&map).unwrap_or_default(),
            )?;
        }
        self.initial = Some(map.clone());
        Ok(map)
    }

    /// Where each partition starts after `start` (a partition it lacks: the initial
    /// position, or the earliest offset for partitions discovered later).
    pub(super) fn begin(
        &mut self,
        start: Option<&Offset>,
        parts: &[(String, i32)],
    ) -> Result<PartitionOffsets> {
        let mut begin = match start {
            Some(o) => parse_offset(o)?,
            None => self.initial(parts)?,
        };
        for (t, p) in parts {
            if begin.get(t).and_then(|m| m.get(p)).is_none() {
                let (lo, _) = self.watermarks(t, *p)?;
                begin.entry(t.clone()).or_default().insert(*p, lo);
            }
        }
        Ok(begin)
    }
}
