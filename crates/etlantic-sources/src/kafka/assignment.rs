//! The consumer's assignment and the polling of a read's ranges: partitions assigned with
//! a queue each, kept from one read to the next so that librdkafka reads ahead, and
//! polled partition by partition in offset order up to the end of each range.

use super::rows::{PartitionDecode, Record};
use super::{data_lost, kafka_error, KafkaSource};
use crate::decode::BatchBuilder;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::plugin::SourceBatch;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{Consumer, DefaultConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset as KOffset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The consumer's assignment, kept from one read to the next. A micro-batch usually
/// starts where the previous one ended; meanwhile librdkafka goes on fetching each
/// partition's next records (up to `queued.max.messages.kbytes` per partition), so the
/// next read finds them waiting instead of starting new fetches.
pub(super) struct Assignment {
    parts: BTreeMap<(String, i32), AssignedPartition>,
}

struct AssignedPartition {
    /// The partition's own queue, split off the consumer's, so that a read takes each
    /// partition's records in offset order and leaves later ones in librdkafka.
    queue: PartitionQueue<DefaultConsumerContext>,
    /// Every record below this offset has been polled.
    next: i64,
    /// Records polled but not yet read, in offset order, before anything on `queue`: one
    /// past the end of a range (offsets have gaps), or records fetched before the queue
    /// was split off the consumer's.
    held: std::collections::VecDeque<Record>,
}

impl KafkaSource {
    /// Assigns the partitions of `ranges` at their beginnings, each with its own queue.
    fn assign(&self, ranges: &BTreeMap<(String, i32), (i64, i64)>) -> Result<Assignment> {
        let mut tpl = TopicPartitionList::new();
        for ((t, p), (b, _)) in ranges {
            tpl.add_partition_offset(t, *p, KOffset::Offset(*b))
                .map_err(|e| kafka_error("build the assignment", e))?;
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| kafka_error("assign partitions", e))?;
        let mut parts = BTreeMap::new();
        for ((t, p), (b, _)) in ranges {
            let queue = self.consumer.split_partition_queue(t, *p).ok_or_else(|| {
                kafka_error(
                    &format!("give {t}/{p} its own queue"),
                    "librdkafka does not know the partition",
                )
            })?;
            let part = AssignedPartition {
                queue,
                next: *b,
                held: std::collections::VecDeque::new(),
            };
            parts.insert((t.clone(), *p), part);
        }
        // Records fetched before a partition's queue was split off went to the consumer's
        // queue: they come before anything on the partition's own queue.
        while let Some(polled) = self.consumer.poll(Duration::ZERO) {
            let m = polled.map_err(|e| kafka_error("read records", e))?;
            if let Some(part) = parts.get_mut(&(m.topic().to_string(), m.partition())) {
                part.held.push_back(Record::of(&m));
            }
        }
        Ok(Assignment { parts })
    }

    /// Reads `ranges` (per partition `[begin, end)`; every partition of the read, empty
    /// ranges included, so that the assignment can serve the next read too) and decodes
    /// the records as they are polled, partition by partition in offset order.
    pub(super) fn read_ranges(
        &mut self,
        ranges: &BTreeMap<(String, i32), (i64, i64)>,
    ) -> Result<SourceBatch> {
        let kept = self.assignment.take().filter(|a| {
            a.parts.len() == ranges.len()
                && ranges
                    .iter()
                    .all(|(k, (b, _))| a.parts.get(k).is_some_and(|part| part.next == *b))
        });
        let reused = kept.is_some();
        let mut assignment = match kept {
            Some(a) => a,
            None => self.assign(ranges)?,
        };
        let mut decoded = SourceBatch::default();
        match self.poll_ranges(ranges, &mut assignment, &mut decoded) {
            Ok(()) => {
                self.assignment = Some(assignment);
                Ok(decoded)
            }
            // A kept assignment can hold an error a partition met while reading ahead
            // (say, offsets deleted since): the read is made again from a new assignment,
            // which reports what is still wrong.
            Err(_) if reused => {
                drop(assignment);
                self.read_ranges(ranges)
            }
            Err(e) => Err(e),
        }
    }

    fn poll_ranges(
        &self,
        ranges: &BTreeMap<(String, i32), (i64, i64)>,
        assignment: &mut Assignment,
        out: &mut SourceBatch,
    ) -> Result<()> {
        let deadline = Instant::now() + self.options.read_timeout;
        let mut builder: BatchBuilder = self.decoder.builder();
        for ((topic, partition), &(b, e)) in ranges {
            if e <= b {
                continue;
            }
            let part = assignment
                .parts
                .get_mut(&(topic.clone(), *partition))
                .expect("every partition of the read is assigned");
            let mut decode = PartitionDecode {
                source: self,
                topic,
                partition: *partition,
                run: None,
            };
            // Good records with consecutive offsets make one origin run.
            let done = loop {
                let Some(r) = part.held.front() else {
                    break false;
                };
                if r.offset >= e {
                    break true;
                }
                let r = part.held.pop_front().expect("a front");
                if r.offset >= b {
                    decode.owned(&mut builder, out, &r)?;
                }
                if r.offset + 1 >= e {
                    break true;
                }
            };
            // Then the partition's own queue, up to the end of the range.
            if !done {
                loop {
                    match part.queue.poll(Duration::from_millis(100)) {
                        Some(Ok(m)) => {
                            let off = m.offset();
                            if off >= e {
                                part.held.push_back(Record::of(&m));
                                break;
                            }
                            if off >= b {
                                decode.borrowed(&mut builder, out, &m)?;
                            }
                            if off + 1 >= e {
                                break;
                            }
                        }
                        Some(Err(KafkaError::MessageConsumption(
                            rdkafka::types::RDKafkaErrorCode::AutoOffsetReset,
                        ))) => {
                            // Deleted between the low-watermark check and the fetch: the next
                            // read of the range finds the gap and reports it (see Data loss).
                            return Err(data_lost(&self.asset, topic, *partition, b, e));
                        }
                        Some(Err(KafkaError::PartitionEOF(_))) | None => {
                            match self.consumer.poll(Duration::ZERO) {
                                Some(Err(err)) => return Err(kafka_error("read records", err)),
                                Some(Ok(m)) => {
                                    return Err(kafka_error(
                                        "read records",
                                        format!(
                                            "a record of {}/{} arrived on the consumer's queue after its partition had its own",
                                            m.topic(),
                                            m.partition()
                                        ),
                                    ))
                                }
                                None => {}
                            }
                            // Offsets may have gaps (transaction markers, compaction): a
                            // partition whose consumer position passed the end is done.
                            if self.position_of(topic, *partition) >= e {
                                break;
                            }
                        }
                        Some(Err(err)) => return Err(kafka_error("read records", err)),
                    }
                    if Instant::now() > deadline {
                        return Err(Error::new(
                            &codes::IO_ERROR,
                            format!(
                                "kafka: reading offsets {b}..{e} of {topic}/{partition} did not complete within {:?} (records deleted by retention, or the broker is unreachable)",
                                self.options.read_timeout
                            ),
                        ));
                    }
                }
            }
            part.next = e;
            decode.close(out);
        }
        out.batches.extend(builder.finish()?);
        Ok(())
    }

    /// The consumer's position in a partition (the offset after the last record it
    /// returned, past any gap), or -1 when it has none.
    fn position_of(&self, topic: &str, partition: i32) -> i64 {
        let Ok(pos) = self.consumer.position() else {
            return -1;
        };
        pos.elements()
            .iter()
            .find(|e| e.topic() == topic && e.partition() == partition)
            .and_then(|e| match e.offset() {
                KOffset::Offset(o) => Some(o),
                _ => None,
            })
            .unwrap_or(-1)
    }
}
