//! Streaming semantics as data: durations, event time, watermarks, late-event policies,
//! triggers and output modes. The runtime interprets them; the model only states them.

use crate::diagnostics::{codes, Diagnostic, Error, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A non-negative duration with millisecond precision, written `"<integer> <unit>"`.
///
/// Units: `milliseconds`, `seconds`, `minutes`, `hours`, `days` (singular forms and
/// `ms`, `s`, `min`, `h`, `d` are accepted too). Serialised in the largest unit that
/// represents it exactly, so `"60 seconds"` and `"1 minute"` produce the same plan bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration {
    millis: i64,
}

impl Duration {
    /// Zero.
    pub const ZERO: Duration = Duration { millis: 0 };

    /// A duration of `millis` milliseconds (must be >= 0).
    pub const fn from_millis(millis: i64) -> Self {
        Duration { millis }
    }

    /// A duration of `secs` seconds.
    pub const fn from_secs(secs: i64) -> Self {
        Duration {
            millis: secs * 1000,
        }
    }

    /// Milliseconds.
    pub const fn as_millis(&self) -> i64 {
        self.millis
    }

    /// Microseconds.
    pub const fn as_micros(&self) -> i64 {
        self.millis * 1000
    }

    /// As a `std::time::Duration`.
    pub fn to_std(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.millis.max(0) as u64)
    }
}

const UNITS: &[(&str, i64)] = &[
    ("days", 86_400_000),
    ("hours", 3_600_000),
    ("minutes", 60_000),
    ("seconds", 1000),
    ("milliseconds", 1),
];

impl FromStr for Duration {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        let bad = || {
            Error::from(Diagnostic::new(
                &codes::BAD_DURATION,
                format!("cannot parse duration `{text}`"),
            ))
        };
        let t = text.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let (num, unit) = t.split_at(split);
        let n: i64 = num.parse().map_err(|_| bad())?;
        let unit = unit.trim().to_ascii_lowercase();
        let factor = match unit.as_str() {
            "ms" | "millisecond" | "milliseconds" => 1,
            "s" | "sec" | "secs" | "second" | "seconds" => 1000,
            "m" | "min" | "mins" | "minute" | "minutes" => 60_000,
            "h" | "hour" | "hours" => 3_600_000,
            "d" | "day" | "days" => 86_400_000,
            _ => return Err(bad()),
        };
        n.checked_mul(factor)
            .map(Duration::from_millis)
            .ok_or_else(bad)
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.millis == 0 {
            return write!(f, "0 seconds");
        }
        for (name, factor) in UNITS {
            if self.millis % factor == 0 {
                let n = self.millis / factor;
                let name = if n == 1 {
                    &name[..name.len() - 1]
                } else {
                    name
                };
                return write!(f, "{n} {name}");
            }
        }
        unreachable!("milliseconds divide everything")
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(|e: Error| serde::de::Error::custom(e))
    }
}

/// A size in bytes, written `"<integer> <unit>"`: `B`, `KB`/`MB`/`GB` (powers of 1000)
/// or `KiB`/`MiB`/`GiB` (powers of 1024); a bare integer is bytes. Serialised as it was
/// written in the largest exact unit (`"256 MB"`, `"1 GiB"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize {
    bytes: u64,
}

const SIZE_UNITS: &[(&str, u64)] = &[
    ("GiB", 1 << 30),
    ("GB", 1_000_000_000),
    ("MiB", 1 << 20),
    ("MB", 1_000_000),
    ("KiB", 1 << 10),
    ("KB", 1000),
    ("B", 1),
];

impl ByteSize {
    /// A size of `bytes` bytes.
    pub const fn from_bytes(bytes: u64) -> Self {
        ByteSize { bytes }
    }

    /// Bytes.
    pub const fn as_bytes(&self) -> u64 {
        self.bytes
    }
}

impl FromStr for ByteSize {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        let bad = || {
            Error::from(Diagnostic::new(
                &codes::BAD_BYTE_SIZE,
                format!("cannot parse size `{text}`"),
            ))
        };
        let t = text.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| bad())?;
        let unit = unit.trim();
        let factor = match unit {
            "" => 1,
            u => SIZE_UNITS
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(u))
                .map(|(_, f)| *f)
                .ok_or_else(bad)?,
        };
        n.checked_mul(factor)
            .map(ByteSize::from_bytes)
            .ok_or_else(bad)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, factor) = SIZE_UNITS
            .iter()
            .find(|(_, factor)| self.bytes > 0 && self.bytes.is_multiple_of(*factor))
            .copied()
            .unwrap_or(("B", 1));
        write!(f, "{} {name}", self.bytes / factor)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        // A YAML integer is bytes.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Text {
            Number(u64),
            Text(String),
        }
        match Text::deserialize(d)? {
            Text::Number(n) => Ok(ByteSize::from_bytes(n)),
            Text::Text(s) => s.parse().map_err(|e: Error| serde::de::Error::custom(e)),
        }
    }
}

/// The event-time column of a source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventTime {
    /// A timestamp column of the source contract.
    pub column: String,
    /// Time zone for interpreting timestamps without an offset (default `UTC`).
    #[serde(default = "utc", skip_serializing_if = "is_utc")]
    pub timezone: String,
}

fn utc() -> String {
    "UTC".into()
}
fn is_utc(s: &String) -> bool {
    s == "UTC"
}

/// What happens to an event that arrives behind the watermark (its window or state is
/// already closed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "policy", deny_unknown_fields)]
pub enum LatePolicy {
    /// Spark's behaviour: late rows are dropped and counted (`numRowsDroppedByWatermark`).
    #[default]
    Drop,
    /// Late rows are processed as if on time. Stateful operators whose state was already
    /// evicted start a new state for them.
    Accept,
    /// Late rows go to the quarantine output with reason code `ETL708`.
    Quarantine,
    /// Late rows go to the named sink.
    SideOutput {
        /// Id of a sink of the pipeline.
        sink: String,
    },
}

impl LatePolicy {
    /// The policy's name as YAML spells it (`drop`, `accept`, `quarantine`,
    /// `side_output`).
    pub fn name(&self) -> &'static str {
        match self {
            LatePolicy::Drop => "drop",
            LatePolicy::Accept => "accept",
            LatePolicy::Quarantine => "quarantine",
            LatePolicy::SideOutput { .. } => "side_output",
        }
    }
}

/// A source of a streaming pipeline that is read as a bounded table (the static side of
/// a stream-static join), and how often it is read again.
///
/// YAML: `static_refresh: per_batch` or `static_refresh: {interval: 10 minutes}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaticRefresh {
    /// Read the whole table for every micro-batch (Spark's behaviour for a static
    /// DataFrame: each micro-batch sees the table as it is then).
    PerBatch,
    /// Read it once and keep it; read it again for the first micro-batch that starts
    /// when the copy is older than the interval.
    Interval(Duration),
}

impl fmt::Display for StaticRefresh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StaticRefresh::PerBatch => f.write_str("per_batch"),
            StaticRefresh::Interval(d) => write!(f, "every {d}"),
        }
    }
}

impl Serialize for StaticRefresh {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            StaticRefresh::PerBatch => s.serialize_str("per_batch"),
            StaticRefresh::Interval(d) => {
                use serde::ser::SerializeMap;
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("interval", d)?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for StaticRefresh {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        let expected = "`static_refresh` is `per_batch` or `{interval: <duration>}`";
        let v = serde_json::Value::deserialize(d)?;
        match &v {
            serde_json::Value::String(s) if matches!(s.as_str(), "per_batch" | "per-batch") => {
                Ok(StaticRefresh::PerBatch)
            }
            serde_json::Value::Object(m) if m.len() == 1 && m.contains_key("interval") => {
                let text = m["interval"]
                    .as_str()
                    .ok_or_else(|| D::Error::custom(expected))?;
                let d: Duration = text.parse().map_err(|e: Error| D::Error::custom(e))?;
                if d.as_millis() <= 0 {
                    return Err(D::Error::custom(
                        "the `static_refresh` interval must be positive",
                    ));
                }
                Ok(StaticRefresh::Interval(d))
            }
            _ => Err(D::Error::custom(format!("{expected}, got {v}"))),
        }
    }
}

/// How global watermarks combine across inputs (Spark `multipleWatermarkPolicy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum WatermarkPolicy {
    /// The slowest input decides (safe, Spark's default).
    #[default]
    Min,
    /// The fastest input decides (drops more from slow inputs).
    Max,
}

/// When micro-batches run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Trigger {
    /// Process everything available now, in as many micro-batches as read limits
    /// require, then stop.
    #[default]
    AvailableNow,
    /// Process everything available in a single micro-batch, then stop.
    Once,
    /// Start a micro-batch every interval (immediately if the previous one overran).
    ProcessingTime(Duration),
    /// Continuous processing with the given checkpoint interval. Only backends that
    /// declare it run it; others fall back to micro-batches (diagnostic `ETL405`).
    Continuous(Duration),
}

impl FromStr for Trigger {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        let lower = t.to_ascii_lowercase();
        let bad = || {
            Error::from(
                Diagnostic::new(&codes::BAD_DURATION, format!("cannot parse trigger `{s}`")).help(
                    "Write `available_now`, `once`, `processing_time <duration>` or `continuous <duration>`.",
                ),
            )
        };
        match lower.as_str() {
            "available_now" | "availablenow" => return Ok(Trigger::AvailableNow),
            "once" => return Ok(Trigger::Once),
            _ => {}
        }
        if let Some(rest) = lower.strip_prefix("processing_time") {
            return Ok(Trigger::ProcessingTime(
                rest.trim().parse().map_err(|_| bad())?,
            ));
        }
        if let Some(rest) = lower.strip_prefix("continuous") {
            return Ok(Trigger::Continuous(rest.trim().parse().map_err(|_| bad())?));
        }
        Err(bad())
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trigger::AvailableNow => write!(f, "available_now"),
            Trigger::Once => write!(f, "once"),
            Trigger::ProcessingTime(d) => write!(f, "processing_time {d}"),
            Trigger::Continuous(d) => write!(f, "continuous {d}"),
        }
    }
}

impl Serialize for Trigger {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Trigger {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(|e: Error| serde::de::Error::custom(e))
    }
}

/// What a streaming sink receives each micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OutputMode {
    /// Only new rows that will never change again.
    #[default]
    Append,
    /// Rows that changed in this micro-batch (new versions of aggregates).
    Update,
    /// The whole result table, every micro-batch.
    Complete,
}

impl OutputMode {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputMode::Append => "append",
            OutputMode::Update => "update",
            OutputMode::Complete => "complete",
        }
    }
}

/// Which clock the timers of a custom stateful processor follow (Spark's `TimeMode` of
/// `transformWithState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TimeMode {
    /// No timers.
    #[default]
    None,
    /// Timers fire when the micro-batch's processing time (batch timestamp) passes them.
    ProcessingTime,
    /// Timers fire when the event-time watermark passes them (needs a watermark).
    EventTime,
}

impl TimeMode {
    /// Snake-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            TimeMode::None => "none",
            TimeMode::ProcessingTime => "processing_time",
            TimeMode::EventTime => "event_time",
        }
    }

    /// Parses `none`, `processing_time` or `event_time` (Spark's camel case too).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "none" => Some(TimeMode::None),
            "processing_time" | "processingtime" => Some(TimeMode::ProcessingTime),
            "event_time" | "eventtime" => Some(TimeMode::EventTime),
            _ => None,
        }
    }
}

/// Whether a run is bounded (batch) or unbounded (micro-batch streaming).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionMode {
    /// Read every input once, to its end.
    #[default]
    Batch,
    /// Read inputs incrementally, in micro-batches, forever or until the trigger stops.
    Streaming,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_normalise() {
        let d: Duration = "60 seconds".parse().unwrap();
        assert_eq!(d.as_millis(), 60_000);
        assert_eq!(d.to_string(), "1 minute");
        assert_eq!("0 seconds".parse::<Duration>().unwrap(), Duration::ZERO);
        assert_eq!("250ms".parse::<Duration>().unwrap().as_millis(), 250);
        assert_eq!(
            "1500 milliseconds".parse::<Duration>().unwrap().to_string(),
            "1500 milliseconds"
        );
        assert_eq!(
            "2 hours".parse::<Duration>().unwrap().as_millis(),
            7_200_000
        );
        assert_eq!("x".parse::<Duration>().unwrap_err().code(), "ETL008");
        assert!("-5 seconds".parse::<Duration>().is_err());
        assert!("5 fortnights".parse::<Duration>().is_err());
    }

    #[test]
    fn byte_sizes_parse_and_round_trip() {
        let parse = |t: &str| t.parse::<ByteSize>().map(|b| b.as_bytes());
        assert_eq!(parse("256 MB").unwrap(), 256_000_000);
        assert_eq!(parse("256MiB").unwrap(), 256 << 20);
        assert_eq!(parse("1 gib").unwrap(), 1 << 30);
        assert_eq!(parse("4096").unwrap(), 4096);
        assert_eq!(parse("12 B").unwrap(), 12);
        assert_eq!(parse("x").unwrap_err().code(), "ETL011");
        assert!(parse("-1 MB").is_err());
        assert!(parse("5 furlongs").is_err());
        assert!(parse("99999999999999 GB").is_err(), "overflow");
        for text in ["256 MB", "1 GiB", "3 KiB", "1001 B", "0 B"] {
            let size: ByteSize = text.parse().unwrap();
            assert_eq!(size.to_string(), text);
        }
        let from_yaml: ByteSize = serde_yaml::from_str("1048576").unwrap();
        assert_eq!(from_yaml.to_string(), "1 MiB");
    }

    #[test]
    fn triggers_parse() {
        assert_eq!("once".parse::<Trigger>().unwrap(), Trigger::Once);
        assert_eq!(
            "processing_time 30 seconds".parse::<Trigger>().unwrap(),
            Trigger::ProcessingTime(Duration::from_secs(30))
        );
        assert_eq!(
            Trigger::ProcessingTime(Duration::from_secs(30)).to_string(),
            "processing_time 30 seconds"
        );
        assert!("sometimes".parse::<Trigger>().is_err());
    }

    #[test]
    fn late_policy_yaml() {
        let p: LatePolicy = serde_yaml::from_str("policy: side_output\nsink: late").unwrap();
        assert_eq!(
            p,
            LatePolicy::SideOutput {
                sink: "late".into()
            }
        );
        let p: LatePolicy = serde_yaml::from_str("policy: drop").unwrap();
        assert_eq!(p, LatePolicy::Drop);
    }
}
