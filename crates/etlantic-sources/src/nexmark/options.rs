//! The binding of a `nexmark://` source: the stream and the generator's parameters,
//! parsed and checked into [`NexmarkOptions`], and their documentation ([`OPTIONS`]).

use super::Stream;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::plugin::{option_names, BindingOption};
use etlantic_core::uri::BindingUri;

/// The options of a `nexmark://` binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NexmarkOptions {
    /// Which stream.
    pub stream: Stream,
    /// Global events offered per trigger.
    pub events_per_batch: u64,
    /// Global events in all (`None`: unlimited).
    pub max_events: Option<u64>,
    /// Event time between consecutive global events (µs).
    pub event_gap_us: i64,
    /// Event time of event 0 (epoch ms).
    pub start_ms: i64,
    /// Seed of the random fields (same seed, same events).
    pub seed: u64,
    /// Beam's `outOfOrderGroupSize`: ids are permuted within groups of this many events.
    pub out_of_order: u64,
    /// Paced by the wall clock: a position is offered only once its event time has
    /// passed (`realtime=true`), so event time doubles as arrival time and the delay
    /// from `date_time` to a sink is the end-to-end latency.
    pub realtime: bool,
}

impl NexmarkOptions {
    /// Parses the stream (`persons`, `auctions`, `bids`) and the parameters; anything
    /// else is an error (`ETL007`).
    pub fn from_uri(uri: &BindingUri) -> Result<Self> {
        let stream = match uri.location.trim_matches('/') {
            "persons" | "person" => Stream::Persons,
            "auctions" | "auction" => Stream::Auctions,
            "bids" | "bid" => Stream::Bids,
            other => {
                return Err(Error::new(
                    &codes::BAD_URI,
                    format!(
                        "`{uri}`: unknown Nexmark stream `{other}` (persons, auctions or bids)"
                    ),
                ))
            }
        };
        let mut o = NexmarkOptions {
            stream,
            events_per_batch: 10_000,
            max_events: None,
            event_gap_us: 100,
            start_ms: 1_704_067_200_000,
            seed: 0,
            out_of_order: 50,
            realtime: false,
        };
        let bad = |k: &str, v: &str, what: &str| {
            Error::new(
                &codes::BAD_URI,
                format!("`{uri}`: parameter `{k}={v}` is invalid, expected {what}"),
            )
        };
        for (k, v) in &uri.params {
            let positive = || {
                v.parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad(k, v, "a positive integer"))
            };
            match k.as_str() {
                "events_per_batch" => o.events_per_batch = positive()?,
                "max_events" => o.max_events = Some(positive()?),
                "event_gap_us" => o.event_gap_us = positive()? as i64,
                "seed" => o.seed = v.parse().map_err(|_| bad(k, v, "an unsigned integer"))?,
                "out_of_order" => o.out_of_order = positive()?,
                "realtime" => o.realtime = v.parse().map_err(|_| bad(k, v, "true or false"))?,
                "start_ms" => {
                    o.start_ms = v.parse().map_err(|_| bad(k, v, "epoch milliseconds"))?
                }
                other => {
                    return Err(Error::new(
                        &codes::BAD_URI,
                        format!(
                        "`{uri}`: unknown parameter `{other}` for the Nexmark source (known: {})",
                        option_names(OPTIONS)
                    ),
                    ))
                }
            }
        }
        Ok(o)
    }
}

/// The query parameters of a `nexmark://` source binding.
pub const OPTIONS: &[BindingOption] = &[
    BindingOption {
        name: "events_per_batch",
        default: "10000",
        meaning: "Events (of all three streams) offered per trigger.",
    },
    BindingOption {
        name: "max_events",
        default: "unlimited",
        meaning: "Events generated in all before the stream stops growing.",
    },
    BindingOption {
        name: "event_gap_us",
        default: "100",
        meaning: "Event time between consecutive events, in microseconds.",
    },
    BindingOption {
        name: "start_ms",
        default: "1704067200000 (2024-01-01T00:00:00Z)",
        meaning: "The event time of event 0, in epoch milliseconds.",
    },
    BindingOption {
        name: "seed",
        default: "0",
        meaning: "Seed of the random fields: the same seed gives the same events.",
    },
    BindingOption {
        name: "out_of_order",
        default: "50",
        meaning: "Event ids are permuted within groups of this many events (Beam's `outOfOrderGroupSize`).",
    },
    BindingOption {
        name: "realtime",
        default: "false",
        meaning: "Offer an event only once the wall clock has passed its event time.",
    },
];
