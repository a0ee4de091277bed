//! Delivery guarantees: what each source and sink declares, and what a source/sink pair
//! gives end to end.
//!
//! | source | sink | end-to-end |
//! |---|---|---|
//! | replayable | idempotent by batch id, or transactional | exactly-once |
//! | replayable | plain append | at-least-once |
//! | not replayable | any | at-most-once |

use serde::{Deserialize, Serialize};
use std::fmt;

/// An end-to-end delivery guarantee. Ordered from weakest to strongest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryGuarantee {
    /// A failure may lose records; none is written twice.
    AtMostOnce,
    /// No record is lost; a failure may write some twice.
    AtLeastOnce,
    /// Every record affects the output exactly once, across failures and restarts.
    ExactlyOnce,
}

impl DeliveryGuarantee {
    /// Snake-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryGuarantee::AtMostOnce => "at_most_once",
            DeliveryGuarantee::AtLeastOnce => "at_least_once",
            DeliveryGuarantee::ExactlyOnce => "exactly_once",
        }
    }
}

impl fmt::Display for DeliveryGuarantee {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a source promises about re-reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceGuarantee {
    /// Reading the same offset range again returns the same records.
    Replayable,
    /// Records cannot be read again once read (e.g. a socket).
    NotReplayable,
}

/// How a sink makes a batch's write durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SinkCommitProtocol {
    /// Writing the batch `(query id, batch id)` a second time has no effect: the sink
    /// records the last committed batch id atomically with the data.
    IdempotentByBatch,
    /// The batch is written in one transaction of the target system, and a replayed batch
    /// is recognised and not committed twice.
    Transactional,
    /// The batch is appended; a replay appends again.
    PlainAppend,
}

/// A sink's declaration: its protocol and, when it only holds under a condition, the
/// condition (e.g. "with a transactional Kafka broker").
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SinkGuarantee {
    /// How batches are made durable.
    pub protocol: SinkCommitProtocol,
    /// A condition the guarantee depends on, stated in the plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
}

impl SinkGuarantee {
    /// An unconditional declaration.
    pub fn new(protocol: SinkCommitProtocol) -> Self {
        SinkGuarantee {
            protocol,
            condition: None,
        }
    }
}

/// The end-to-end guarantee of a source/sink pair (the table in the module docs).
pub fn end_to_end(source: SourceGuarantee, sink: SinkCommitProtocol) -> DeliveryGuarantee {
    match (source, sink) {
        (SourceGuarantee::NotReplayable, _) => DeliveryGuarantee::AtMostOnce,
        (SourceGuarantee::Replayable, SinkCommitProtocol::PlainAppend) => {
            DeliveryGuarantee::AtLeastOnce
        }
        (SourceGuarantee::Replayable, _) => DeliveryGuarantee::ExactlyOnce,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        use SinkCommitProtocol::*;
        use SourceGuarantee::*;
        assert_eq!(
            end_to_end(Replayable, IdempotentByBatch),
            DeliveryGuarantee::ExactlyOnce
        );
        assert_eq!(
            end_to_end(Replayable, Transactional),
            DeliveryGuarantee::ExactlyOnce
        );
        assert_eq!(
            end_to_end(Replayable, PlainAppend),
            DeliveryGuarantee::AtLeastOnce
        );
        assert_eq!(
            end_to_end(NotReplayable, Transactional),
            DeliveryGuarantee::AtMostOnce
        );
        assert!(DeliveryGuarantee::ExactlyOnce > DeliveryGuarantee::AtLeastOnce);
    }
}
