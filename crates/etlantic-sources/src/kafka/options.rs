//! The binding of a `kafka://` source: its query parameters, parsed and checked into
//! [`KafkaSourceOptions`], and their documentation ([`OPTIONS`]).

use super::PartitionOffsets;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::plugin::{option_names, BindingOption};
use etlantic_core::uri::BindingUri;
use std::collections::BTreeMap;
use std::time::Duration;

/// Where a new query starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartingOffsets {
    /// Every partition's low watermark.
    Earliest,
    /// Every partition's high watermark when the query starts.
    Latest,
    /// Per partition: an offset, `-2` (earliest) or `-1` (latest); others earliest.
    Specific(PartitionOffsets),
}

/// How record values are turned into rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueFormat {
    /// Spark's Kafka columns (`key`, `value`, `topic`, ...).
    Raw,
    /// The value is a JSON object decoded against the contract.
    Json,
}

/// The options of a `kafka://` source binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaSourceOptions {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// The topics read.
    pub topics: Vec<String>,
    /// Only these partitions, when given.
    pub partitions: Option<Vec<i32>>,
    /// `startingOffsets`.
    pub starting: StartingOffsets,
    /// `maxOffsetsPerTrigger`.
    pub max_offsets_per_trigger: Option<u64>,
    /// `format`.
    pub format: ValueFormat,
    /// `readTimeoutMs`.
    pub read_timeout: Duration,
    /// `failOnDataLoss`.
    pub fail_on_data_loss: bool,
    /// `kafka.*` properties passed to librdkafka.
    pub client: BTreeMap<String, String>,
}

fn bad_param(uri: &BindingUri, key: &str, value: &str, expected: &str) -> Error {
    Error::new(
        &codes::BAD_URI,
        format!(
            "binding `{}`: parameter `{key}={value}` is invalid, expected {expected}",
            uri.redacted()
        ),
    )
}

/// Splits `<bootstrap>/<topics>` and checks both are present (`ETL007` otherwise).
pub(crate) fn split_location(uri: &BindingUri) -> Result<(String, Vec<String>)> {
    let (servers, topics) = uri.location.split_once('/').unwrap_or((&uri.location, ""));
    let topics: Vec<String> = topics
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(String::from)
        .collect();
    if servers.trim().is_empty() || topics.is_empty() {
        return Err(Error::new(
            &codes::BAD_URI,
            format!(
                "binding `{}`: expected kafka://<host:port[,host:port]>/<topic>[,<topic>]",
                uri.redacted()
            ),
        ));
    }
    Ok((servers.trim().to_string(), topics))
}

impl KafkaSourceOptions {
    /// Parses a `kafka://` source URI. Unknown parameters and bad values are `ETL007`.
    pub fn from_uri(uri: &BindingUri) -> Result<Self> {
        let (bootstrap, topics) = split_location(uri)?;
        let mut o = KafkaSourceOptions {
            bootstrap,
            topics,
            partitions: None,
            starting: StartingOffsets::Earliest,
            max_offsets_per_trigger: None,
            format: ValueFormat::Raw,
            read_timeout: Duration::from_secs(30),
            fail_on_data_loss: true,
            client: BTreeMap::new(),
        };
        for (key, value) in &uri.params {
            match key.as_str() {
                "startingOffsets" | "starting_offsets" => {
                    o.starting = match value.as_str() {
                        "earliest" => StartingOffsets::Earliest,
                        "latest" => StartingOffsets::Latest,
                        json => {
                            StartingOffsets::Specific(serde_json::from_str(json).map_err(|_| {
                                bad_param(
                                    uri,
                                    key,
                                    value,
                                    "`earliest`, `latest` or JSON like {\"topic\":{\"0\":42}}",
                                )
                            })?)
                        }
                    }
                }
                "maxOffsetsPerTrigger" | "max_offsets_per_trigger" => {
                    o.max_offsets_per_trigger = Some(
                        value
                            .parse::<u64>()
                            .ok()
                            .filter(|n| *n > 0)
                            .ok_or_else(|| bad_param(uri, key, value, "a positive integer"))?,
                    )
                }
                "format" => {
                    o.format = match value.as_str() {
                        "raw" => ValueFormat::Raw,
                        "json" => ValueFormat::Json,
                        _ => return Err(bad_param(uri, key, value, "`raw` or `json`")),
                    }
                }
                "partitions" => {
                    o.partitions = Some(
                        value
                            .split(',')
                            .map(|p| p.trim().parse::<i32>().ok().filter(|p| *p >= 0))
                            .collect::<Option<Vec<_>>>()
                            .ok_or_else(|| {
                                bad_param(uri, key, value, "partition numbers like 0,1,2")
                            })?,
                    )
                }
                "readTimeoutMs" | "read_timeout_ms" => {
                    o.read_timeout = Duration::from_millis(
                        value
                            .parse::<u64>()
                            .ok()
                            .filter(|n| *n > 0)
                            .ok_or_else(|| bad_param(uri, key, value, "milliseconds"))?,
                    )
                }
                "failOnDataLoss" | "fail_on_data_loss" => {
                    o.fail_on_data_loss = match value.to_ascii_lowercase().as_str() {
                        "true" => true,
                        "false" => false,
                        _ => return Err(bad_param(uri, key, value, "`true` or `false`")),
                    }
                }
                k if k.starts_with("kafka.") => {
                    o.client
                        .insert(k["kafka.".len()..].to_string(), value.clone());
                }
                _ => {
                    return Err(Error::new(
                        &codes::BAD_URI,
                        format!(
                        "binding `{}`: unknown parameter `{key}` for the Kafka source (known: {})",
                        uri.redacted(),
                        option_names(OPTIONS)
                    ),
                    ))
                }
            }
        }
        Ok(o)
    }
}

/// The query parameters of a `kafka://` source binding.
pub const OPTIONS: &[BindingOption] = &[
    BindingOption {
        name: "startingOffsets",
        default: "earliest",
        meaning: "Where a new query starts: `earliest`, `latest`, or JSON such as `{\"topic\":{\"0\":42}}` (-2 earliest, -1 latest); a restarted query resumes from its checkpoint (also `starting_offsets`).",
    },
    BindingOption {
        name: "maxOffsetsPerTrigger",
        default: "unlimited",
        meaning: "At most this many offsets per micro-batch, split over the partitions by backlog; the pipeline's `read_limit.max_records` also applies (also `max_offsets_per_trigger`).",
    },
    BindingOption {
        name: "format",
        default: "raw",
        meaning: "`raw` gives Spark's Kafka columns (`key`, `value`, `topic`, ...); `json` decodes each value as a JSON object against the contract.",
    },
    BindingOption {
        name: "partitions",
        default: "all",
        meaning: "Read only these partitions of every topic, e.g. `0,1`.",
    },
    BindingOption {
        name: "readTimeoutMs",
        default: "30000",
        meaning: "How long a read waits for its records before failing with ETL706 (also `read_timeout_ms`).",
    },
    BindingOption {
        name: "failOnDataLoss",
        default: "true",
        meaning: "Fail with ETL712 when retention deleted records not yet read; `false` skips the gap and reports it (also `fail_on_data_loss`).",
    },
    BindingOption {
        name: "kafka.<property>",
        default: "",
        meaning: "Passed to librdkafka as is (e.g. `kafka.security.protocol=SSL`); it can override the source's own settings.",
    },
];
