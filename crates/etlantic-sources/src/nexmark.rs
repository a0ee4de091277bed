//! The `nexmark://<stream>` generator: the three streams of the Nexmark auction
//! benchmark (persons, auctions, bids), deterministic and replayable.
//!
//! `nexmark://bids?events_per_batch=100000&max_events=10000000&event_gap_us=100&start_ms=T&seed=0&out_of_order=50`
//!
//! All three streams share one global event sequence, as in Beam's Nexmark generator,
//! whose distributions it follows (`GeneratorConfig` defaults):
//!
//! - of every 50 event ids, 1 is a person, 3 are auctions and 46 are bids;
//! - position `n` of the sequence happens at `start_ms + n * event_gap_us` and carries the
//!   event id Beam's `nextAdjustedEventNumber` gives it: ids are permuted within groups of
//!   `out_of_order` positions (default 50), so events arrive out of order;
//! - persons have ids from 1000 (`id`, `name`, `email_address`, `credit_card`, `city`,
//!   `state` of AZ/CA/ID/OR/WA/WY, `date_time`, `extra`); auctions from 1000 (`id`,
//!   `item_name`, `description`, `initial_bid`, `reserve`, `date_time`, `expires`,
//!   `seller`, `category` 10..14, `extra`); bids (`auction`, `bidder`, `price`, `channel`,
//!   `url`, `date_time`, `extra`);
//! - hot items: half of the bids go to the hot auction (the newest id rounded down to a
//!   multiple of 100), 3 in 4 to the hot bidder, 3 in 4 auctions to the hot seller; the
//!   rest to one of the 100 auctions in flight / 1000 active people (up to 10 ids ahead);
//! - prices are 10^(6u) dollars in cents; an auction lasts up to twice the time in which
//!   100 more auctions open; `extra` pads events to 200/500/100 bytes on average.
//!
//! A stream returns the events of its kind; its offset is the number of *global*
//! positions consumed (a JSON number), so that sources of different streams bound to the
//! same options advance through the same event time. Values come from a random sequence
//! seeded by (`seed`, event id): no state, no wall clock, the same events on every run.
//!
//! Every trigger offers `events_per_batch` more events (default 10 000), up to
//! `max_events` (default unlimited); a `max_records` read limit caps it too. With
//! `realtime=true` it offers only the positions whose event time the wall clock has
//! passed (set `start_ms` near the start of the run and `event_gap_us` to the rate). The
//! contract may hold any subset of a stream's columns (by name); timestamps may use any
//! unit and time zone, integers any integer type. The source is unbounded only.

use arrow::array::{ArrayRef, Int64Array, RecordBatch, RecordBatchOptions};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef};
use etlantic_core::data::Offset;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::guarantee::SourceGuarantee;
use etlantic_core::plugin::{option_names, BindingOption};
use etlantic_core::plugin::{
    ReadLimit, Source, SourceBatch, SourceCapabilities, SourceContext, SourceProvider,
    SourceRegistration,
};
use etlantic_core::uri::BindingUri;
use std::sync::Arc;

/// Events generated per chunk of `read`.
const CHUNK_EVENTS: u64 = 50 * 4096;

/// The provider of `nexmark://` sources.
#[derive(Clone, Copy, Debug, Default)]
pub struct NexmarkSourceProvider;

inventory::submit! { SourceRegistration(&NexmarkSourceProvider) }

/// A Nexmark stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// People registering.
    Persons,
    /// Auctions opening.
    Auctions,
    /// Bids on auctions.
    Bids,
}

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

impl SourceProvider for NexmarkSourceProvider {
    fn options(&self) -> &'static [BindingOption] {
        OPTIONS
    }

    fn scheme(&self) -> &'static str {
        "nexmark"
    }

    fn description(&self) -> &'static str {
        "Deterministic Nexmark generator: nexmark://persons|auctions|bids"
    }

    fn capabilities(&self, uri: &BindingUri) -> Result<SourceCapabilities> {
        NexmarkOptions::from_uri(uri)?;
        Ok(SourceCapabilities {
            bounded: false,
            unbounded: true,
            guarantee: SourceGuarantee::Replayable,
        })
    }

    fn create(&self, ctx: SourceContext) -> Result<Box<dyn Source>> {
        Ok(Box::new(NexmarkSource::new(ctx)?))
    }
}

/// splitmix64: a well-mixed hash of an event number.
fn mix(n: u64, salt: u64) -> u64 {
    let mut z = n
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(salt.wrapping_mul(0xD1B5_4A32_D192_ED03));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The random numbers of one event: a splitmix64 sequence seeded by (seed, event id),
/// as Beam seeds a `java.util.Random` with the event id. The draws are taken in Beam's
/// order, so each field follows Beam's distribution.
struct EventRng(u64);

impl EventRng {
    fn new(seed: u64, id: u64) -> Self {
        EventRng(mix(id, seed ^ 0x6E65_786D_6172_6B21))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0, 0)
    }

    /// Uniform in `0..n` (`n` ≥ 1).
    fn below(&mut self, n: u64) -> u64 {
        // Lemire's multiply-shift: unbiased enough for a benchmark, no division.
        ((self.next() as u128 * n.max(1) as u128) >> 64) as u64
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Beam's `nextPrice`: 10^(6·u) dollars, in cents — most prices are small.
    fn price(&mut self) -> i64 {
        // 10^x as e^(x ln 10): `exp` is cheaper than `powf`.
        ((self.unit() * 6.0 * std::f64::consts::LN_10).exp() * 100.0).round() as i64
    }
}

/// Beam's generator constants (`GeneratorConfig`, `NexmarkConfiguration` defaults).
mod beam {
    /// Of every 50 events: 1 person, 3 auctions, 46 bids.
    pub const PERSON_PROPORTION: u64 = 1;
    pub const AUCTION_PROPORTION: u64 = 3;
    pub const PROPORTION_DENOMINATOR: u64 = 50;
    pub const FIRST_PERSON_ID: i64 = 1000;
    pub const FIRST_AUCTION_ID: i64 = 1000;
    pub const FIRST_CATEGORY_ID: i64 = 10;
    pub const NUM_CATEGORIES: u64 = 5;
    /// People who take part in auctions at any time.
    pub const NUM_ACTIVE_PEOPLE: u64 = 1000;
    /// Auctions that take bids at any time.
    pub const NUM_IN_FLIGHT_AUCTIONS: u64 = 100;
    /// A bid or auction may name a person or auction up to this far ahead.
    pub const PERSON_ID_LEAD: u64 = 10;
    pub const AUCTION_ID_LEAD: u64 = 10;
    /// 1 in `HOT_*_RATIO` of bids / auctions go to the hot auction, bidder, seller...
    pub const HOT_AUCTION_RATIO: u64 = 2;
    pub const HOT_BIDDERS_RATIO: u64 = 4;
    pub const HOT_SELLERS_RATIO: u64 = 4;
    /// ...which is the newest id rounded down to a multiple of this.
    pub const HOT_STRIDE: i64 = 100;
    /// Average sizes of the events in bytes (the `extra` column pads to them).
    pub const AVG_PERSON_BYTES: usize = 200;
    pub const AVG_AUCTION_BYTES: usize = 500;
    pub const AVG_BID_BYTES: usize = 100;
}

const CITIES: &[&str] = &[
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
];
const STATES: &[&str] = &["AZ", "CA", "ID", "OR", "WA", "WY"];
const FIRST_NAMES: &[&str] = &[
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
];
const LAST_NAMES: &[&str] = &[
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris",
];
const HOT_CHANNELS: &[&str] = &["Google", "Facebook", "Baidu", "Apple"];
/// Padding for `extra` and other filler text (sliced, never allocated per character).
static FILLER: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ".repeat(16)
});

/// A piece of filler text of `len` characters (at most the filler's), starting at a
/// place chosen by `h`.
fn filler(h: u64, len: usize) -> &'static str {
    let all: &'static str = FILLER.as_str();
    let len = len.min(all.len() / 2);
    let at = (h % (all.len() - len + 1) as u64) as usize;
    &all[at..at + len]
}

/// The columns of each stream: (name, natural type) — Beam's fields, snake_case.
fn columns(stream: Stream) -> &'static [(&'static str, Kind)] {
    match stream {
        Stream::Persons => &[
            ("id", Kind::Int),
            ("name", Kind::Str),
            ("email_address", Kind::Str),
            ("credit_card", Kind::Str),
            ("city", Kind::Str),
            ("state", Kind::Str),
            ("date_time", Kind::Time),
            ("extra", Kind::Str),
        ],
        Stream::Auctions => &[
            ("id", Kind::Int),
            ("item_name", Kind::Str),
            ("description", Kind::Str),
            ("initial_bid", Kind::Int),
            ("reserve", Kind::Int),
            ("date_time", Kind::Time),
            ("expires", Kind::Time),
            ("seller", Kind::Int),
            ("category", Kind::Int),
            ("extra", Kind::Str),
        ],
        Stream::Bids => &[
            ("auction", Kind::Int),
            ("bidder", Kind::Int),
            ("price", Kind::Int),
            ("channel", Kind::Str),
            ("url", Kind::Str),
            ("date_time", Kind::Time),
            ("extra", Kind::Str),
        ],
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Int,
    Str,
    Time,
}

/// The stream event id `id` belongs to (Beam: by `id % 50`).
fn kind_of(id: u64) -> Stream {
    let rem = id % beam::PROPORTION_DENOMINATOR;
    if rem < beam::PERSON_PROPORTION {
        Stream::Persons
    } else if rem < beam::PERSON_PROPORTION + beam::AUCTION_PROPORTION {
        Stream::Auctions
    } else {
        Stream::Bids
    }
}

/// Beam's `lastBase0PersonId`: the newest person at event `id`. (Kept general in the
/// proportions, which makes the `min` a no-op for Beam's 1 person per epoch.)
#[allow(clippy::unnecessary_min_or_max)]
fn last_person(id: u64) -> i64 {
    let epoch = (id / beam::PROPORTION_DENOMINATOR) as i64;
    let offset = (id % beam::PROPORTION_DENOMINATOR).min(beam::PERSON_PROPORTION - 1) as i64;
    epoch * beam::PERSON_PROPORTION as i64 + offset
}

/// Beam's `lastBase0AuctionId`: the newest auction at event `id` (-1 before the first).
fn last_auction(id: u64) -> i64 {
    let mut epoch = (id / beam::PROPORTION_DENOMINATOR) as i64;
    let mut offset = (id % beam::PROPORTION_DENOMINATOR) as i64;
    let (p, a) = (
        beam::PERSON_PROPORTION as i64,
        beam::AUCTION_PROPORTION as i64,
    );
    if offset < p {
        epoch -= 1;
        offset = a - 1;
    } else if offset >= p + a {
        offset = a - 1;
    } else {
        offset -= p;
    }
    epoch * a + offset
}

/// Beam's `nextBase0PersonId`: one of the active people (or a few ahead).
fn some_person(id: u64, rng: &mut EventRng) -> i64 {
    let people = last_person(id) as u64 + 1;
    let active = people.min(beam::NUM_ACTIVE_PEOPLE);
    let n = rng.below(active + beam::PERSON_ID_LEAD);
    (people - active + n) as i64
}

/// Beam's `nextBase0AuctionId`: one of the auctions in flight (or a few ahead).
fn some_auction(id: u64, rng: &mut EventRng) -> i64 {
    let max = last_auction(id).max(0);
    let min = (max - beam::NUM_IN_FLIGHT_AUCTIONS as i64).max(0);
    min + rng.below((max - min) as u64 + 1 + beam::AUCTION_ID_LEAD) as i64
}

/// The integer fields of one event, drawn in Beam's order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Ints {
    id: i64,
    seller: i64,
    category: i64,
    initial_bid: i64,
    reserve: i64,
    /// Auction length (µs).
    length_us: i64,
    auction: i64,
    bidder: i64,
    price: i64,
    /// Which channel (0..4 hot, else `channel-N`).
    channel: u64,
}

/// A column of a stream, resolved once per batch rather than matched by name per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Column {
    Id,
    Seller,
    Category,
    InitialBid,
    Reserve,
    Auction,
    Bidder,
    Price,
    Name,
    Email,
    CreditCard,
    City,
    State,
    ItemName,
    Description,
    Channel,
    Url,
    Expires,
    DateTime,
    Extra,
}

impl Column {
    fn of(name: &str) -> Column {
        match name {
            "id" => Column::Id,
            "seller" => Column::Seller,
            "category" => Column::Category,
            "initial_bid" => Column::InitialBid,
            "reserve" => Column::Reserve,
            "auction" => Column::Auction,
            "bidder" => Column::Bidder,
            "price" => Column::Price,
            "name" => Column::Name,
            "email_address" => Column::Email,
            "credit_card" => Column::CreditCard,
            "city" => Column::City,
            "state" => Column::State,
            "item_name" => Column::ItemName,
            "description" => Column::Description,
            "channel" => Column::Channel,
            "url" => Column::Url,
            "expires" => Column::Expires,
            "date_time" => Column::DateTime,
            _ => Column::Extra,
        }
    }
}

/// Appends `n` in decimal, zero-padded to `width` digits.
fn push_digits(out: &mut String, mut n: u64, width: usize) {
    let mut buf = [b'0'; 20];
    let mut i = buf.len();
    while n > 0 || buf.len() - i < width {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    out.push_str(std::str::from_utf8(&buf[i..]).expect("ASCII digits"));
}

/// A `nexmark://` source.
#[derive(Debug)]
pub struct NexmarkSource {
    schema: SchemaRef,
    options: NexmarkOptions,
    /// Per schema field: the stream column it takes.
    fields: Vec<(&'static str, Kind)>,
    /// Which positions are this stream's repeats with a period (see [`OwnPositions`]).
    own: OwnPositions,
}

/// The positions of the event sequence that belong to one stream. Position `n + P`
/// holds event id `event_id(n) + P` when `P` is a multiple of the out-of-order group, and
/// that id is of the same stream when `P` is a multiple of the proportion denominator:
/// the pattern repeats every `P = lcm(out_of_order, 50)` positions. Reading a range
/// walks one period's list instead of computing every position's event id and stream
/// (two divisions each; a fifth of the CPU of a query reading two streams).
#[derive(Debug)]
struct OwnPositions {
    /// `P`, or 0 when it is too long to tabulate (a huge `out_of_order`).
    period: u64,
    /// The positions in `0..P` of this stream, ascending.
    offsets: Vec<u32>,
}

/// Periods up to this many positions are tabulated.
const MAX_PERIOD: u64 = 1 << 20;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl NexmarkSource {
    /// Positions whose event time the wall clock has passed (`realtime=true`).
    fn due_by_now(&self) -> u64 {
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        let elapsed = now_us - self.options.start_ms * 1000;
        if elapsed < 0 {
            0
        } else {
            (elapsed / self.options.event_gap_us.max(1)) as u64 + 1
        }
    }

    /// Creates the source, checking that the contract's columns are columns of the
    /// stream with compatible types.
    pub fn new(ctx: SourceContext) -> Result<Self> {
        let options = NexmarkOptions::from_uri(&ctx.uri)?;
        let available = columns(options.stream);
        let mut fields = Vec::new();
        for f in ctx.schema.fields() {
            let col = available.iter().find(|(n, _)| n == f.name());
            let ok = match (col, f.data_type()) {
                (Some((_, Kind::Int)), t) => t.is_integer(),
                (Some((_, Kind::Str)), t) => {
                    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
                }
                (Some((_, Kind::Time)), t) => matches!(t, DataType::Timestamp(..)),
                (None, _) => false,
            };
            if !ok {
                return Err(Error::new(
                    &codes::PORT_TYPE_MISMATCH,
                    format!(
                        "asset `{}`: the Nexmark {:?} stream has the columns {:?}; the contract has `{}` ({})",
                        ctx.asset,
                        options.stream,
                        available.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
                        f.name(),
                        f.data_type()
                    ),
                ));
            }
            fields.push(*col.expect("checked"));
        }
        let g = options.out_of_order;
        let period =
            (g / gcd(g, beam::PROPORTION_DENOMINATOR)).saturating_mul(beam::PROPORTION_DENOMINATOR);
        let mut source = NexmarkSource {
            schema: ctx.schema,
            options,
            fields,
            own: OwnPositions {
                period: 0,
                offsets: Vec::new(),
            },
        };
        if period <= MAX_PERIOD {
            source.own = OwnPositions {
                period,
                offsets: (0..period)
                    .filter(|n| source.is_ours(*n))
                    .map(|n| n as u32)
                    .collect(),
            };
        }
        Ok(source)
    }

    /// The positions in `from..to` that belong to this stream, ascending.
    fn positions(&self, from: u64, to: u64) -> Vec<u64> {
        let OwnPositions { period, offsets } = &self.own;
        if *period == 0 {
            return (from..to).filter(|n| self.is_ours(*n)).collect();
        }
        let per_period = offsets.len() as u64;
        let mut out = Vec::with_capacity(((to - from) * per_period / period + per_period) as usize);
        let mut base = from - from % period;
        while base < to {
            out.extend(
                offsets
                    .iter()
                    .map(|o| base + u64::from(*o))
                    .filter(|n| (from..to).contains(n)),
            );
            base += period;
        }
        out
    }

    /// The event id generated at position `n` of the sequence: Beam's
    /// `nextAdjustedEventNumber`, which permutes each group of `out_of_order` positions
    /// (timestamps follow positions, so ids arrive out of order within a group).
    fn event_id(&self, n: u64) -> u64 {
        let g = self.options.out_of_order;
        (n / g) * g + (n.wrapping_mul(953)) % g
    }

    fn time_us(&self, n: u64) -> i64 {
        self.options.start_ms * 1000 + n as i64 * self.options.event_gap_us
    }

    /// The integer fields of event `id` (which is of this stream).
    fn ints(&self, id: u64) -> Ints {
        let mut rng = EventRng::new(self.options.seed, id);
        let mut e = Ints::default();
        match self.options.stream {
            Stream::Persons => e.id = last_person(id) + beam::FIRST_PERSON_ID,
            Stream::Auctions => {
                e.id = last_auction(id) + beam::FIRST_AUCTION_ID;
                e.seller = if rng.below(beam::HOT_SELLERS_RATIO) > 0 {
                    (last_person(id) / beam::HOT_STRIDE) * beam::HOT_STRIDE
                } else {
                    some_person(id, &mut rng)
                } + beam::FIRST_PERSON_ID;
                e.category = beam::FIRST_CATEGORY_ID + rng.below(beam::NUM_CATEGORIES) as i64;
                e.initial_bid = rng.price();
                e.reserve = e.initial_bid + rng.price();
                // Beam's `nextAuctionLengthMs`: uniform up to twice the time in which
                // `NUM_IN_FLIGHT_AUCTIONS` more auctions open.
                let horizon_events = beam::NUM_IN_FLIGHT_AUCTIONS * beam::PROPORTION_DENOMINATOR
                    / beam::AUCTION_PROPORTION;
                let horizon_us = horizon_events as i64 * self.options.event_gap_us;
                e.length_us = 1 + rng.below((horizon_us * 2).max(1) as u64) as i64;
            }
            Stream::Bids => {
                e.auction = if rng.below(beam::HOT_AUCTION_RATIO) > 0 {
                    (last_auction(id).max(0) / beam::HOT_STRIDE) * beam::HOT_STRIDE
                } else {
                    some_auction(id, &mut rng)
                } + beam::FIRST_AUCTION_ID;
                e.bidder = if rng.below(beam::HOT_BIDDERS_RATIO) > 0 {
                    (last_person(id) / beam::HOT_STRIDE) * beam::HOT_STRIDE + 1
                } else {
                    some_person(id, &mut rng)
                } + beam::FIRST_PERSON_ID;
                e.price = rng.price();
                e.channel = if rng.below(100) > 0 {
                    rng.below(HOT_CHANNELS.len() as u64)
                } else {
                    HOT_CHANNELS.len() as u64 + rng.below(10_000)
                };
            }
        }
        e
    }

    /// Appends the value of the string column `col` of event `id` (`ints` are its
    /// integer fields) to `out`. Written piece by piece, without `fmt`: generation is on
    /// the benchmarks' hot path.
    fn string(&self, col: Column, id: u64, ints: &Ints, out: &mut String) {
        let h = |salt: u64| mix(id, self.options.seed.wrapping_add(salt));
        let pick = |salt: u64, list: &[&'static str]| list[(h(salt) % list.len() as u64) as usize];
        match col {
            Column::Name => {
                out.push_str(pick(1, FIRST_NAMES));
                out.push(' ');
                out.push_str(pick(2, LAST_NAMES));
            }
            Column::Email => {
                out.push_str(filler(h(3), 7));
                out.push('@');
                out.push_str(filler(h(4), 5));
                out.push_str(".com");
            }
            Column::CreditCard => {
                for (i, salt) in (5..9).enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    push_digits(out, h(salt) % 10_000, 4);
                }
            }
            Column::City => out.push_str(pick(9, CITIES)),
            Column::State => out.push_str(pick(10, STATES)),
            Column::ItemName => out.push_str(filler(h(11), 20)),
            Column::Description => out.push_str(filler(h(12), 100)),
            Column::Channel => match HOT_CHANNELS.get(ints.channel as usize) {
                Some(c) => out.push_str(c),
                None => {
                    out.push_str("channel-");
                    push_digits(out, ints.channel, 1);
                }
            },
            Column::Url => {
                out.push_str("https://www.nexmark.com/");
                out.push_str(filler(h(13), 5));
                out.push('/');
                out.push_str(filler(h(14), 5));
                out.push_str("/item.htm?query=1&channel_id=");
                push_digits(out, ints.channel, 1);
            }
            _ => {
                // `extra`: pads the event to Beam's average size (±20%).
                let len =
                    (self.avg_bytes() - self.base_bytes()) * (80 + (h(15) % 41) as usize) / 100;
                out.push_str(filler(h(16), len));
            }
        }
    }

    /// Beam's average size of an event of this stream.
    fn avg_bytes(&self) -> usize {
        match self.options.stream {
            Stream::Persons => beam::AVG_PERSON_BYTES,
            Stream::Auctions => beam::AVG_AUCTION_BYTES,
            Stream::Bids => beam::AVG_BID_BYTES,
        }
    }

    /// The bytes of an event of this stream besides `extra` (roughly).
    fn base_bytes(&self) -> usize {
        match self.options.stream {
            Stream::Persons => 80,
            Stream::Auctions => 170,
            Stream::Bids => 70,
        }
    }

    fn batch(&self, positions: &[u64]) -> Result<RecordBatch> {
        let engine = |e: arrow::error::ArrowError| Error::new(&codes::ENGINE_ERROR, e.to_string());
        let ids: Vec<u64> = positions.iter().map(|n| self.event_id(*n)).collect();
        let ints: Vec<Ints> = ids.iter().map(|id| self.ints(*id)).collect();
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.fields.len());
        for ((name, kind), f) in self.fields.iter().zip(self.schema.fields()) {
            let col = Column::of(name);
            let a: ArrayRef = match kind {
                Kind::Int => {
                    let value: fn(&Ints) -> i64 = match col {
                        Column::Id => |e| e.id,
                        Column::Seller => |e| e.seller,
                        Column::Category => |e| e.category,
                        Column::InitialBid => |e| e.initial_bid,
                        Column::Reserve => |e| e.reserve,
                        Column::Auction => |e| e.auction,
                        Column::Bidder => |e| e.bidder,
                        _ => |e| e.price,
                    };
                    Arc::new(Int64Array::from_iter_values(ints.iter().map(value)))
                }
                Kind::Str => {
                    // Sized up front: growing a buffer of extra text by doubling copies
                    // it over and over.
                    let per_row = match col {
                        Column::Extra => self.avg_bytes() - self.base_bytes() + 8,
                        Column::Description => 100,
                        Column::Url => 72,
                        _ => 24,
                    };
                    let mut b =
                        arrow::array::StringBuilder::with_capacity(ids.len(), ids.len() * per_row);
                    let mut s = String::with_capacity(per_row * 2);
                    for (id, e) in ids.iter().zip(&ints) {
                        s.clear();
                        self.string(col, *id, e, &mut s);
                        b.append_value(&s);
                    }
                    Arc::new(b.finish())
                }
                Kind::Time => {
                    let expires = col == Column::Expires;
                    let us = positions.iter().zip(&ints).map(|(n, e)| {
                        let t = self.time_us(*n);
                        if expires {
                            t + e.length_us
                        } else {
                            t
                        }
                    });
                    let a = arrow::array::TimestampMicrosecondArray::from_iter_values(us)
                        .with_timezone("UTC");
                    Arc::new(a)
                }
            };
            let a = if a.data_type() == f.data_type() {
                a
            } else {
                cast(&a, f.data_type()).map_err(engine)?
            };
            arrays.push(a);
        }
        RecordBatch::try_new_with_options(
            self.schema.clone(),
            arrays,
            &RecordBatchOptions::new().with_row_count(Some(positions.len())),
        )
        .map_err(engine)
    }

    /// Whether the event at position `n` belongs to this stream.
    fn is_ours(&self, n: u64) -> bool {
        kind_of(self.event_id(n)) == self.options.stream
    }
}

fn parse(offset: &Offset) -> Result<u64> {
    offset.0.as_u64().ok_or_else(|| {
        Error::new(
            &codes::CHECKPOINT_CORRUPT,
            format!("`{}` is not an offset of a Nexmark source", offset.0),
        )
    })
}

#[async_trait::async_trait]
impl Source for NexmarkSource {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    async fn latest_offset(
        &mut self,
        start: Option<&Offset>,
        limit: &ReadLimit,
    ) -> Result<Option<Offset>> {
        let from = start.map(parse).transpose()?.unwrap_or(0);
        let mut n = self.options.events_per_batch;
        if let Some(m) = limit.max_records {
            n = n.min(m.max(1));
        }
        let mut end = from.saturating_add(n);
        if let Some(max) = self.options.max_events {
            end = end.min(max);
        }
        if self.options.realtime {
            end = end.min(self.due_by_now());
        }
        if end <= from {
            return Ok(start.cloned());
        }
        Ok(Some(Offset(serde_json::json!(end))))
    }

    async fn read(&mut self, start: Option<&Offset>, end: &Offset) -> Result<SourceBatch> {
        let from = start.map(parse).transpose()?.unwrap_or(0);
        let to = parse(end)?;
        let mut out = SourceBatch::default();
        let mut chunk_start = from;
        while chunk_start < to {
            let chunk_end = (chunk_start + CHUNK_EVENTS).min(to);
            let events = self.positions(chunk_start, chunk_end);
            if !events.is_empty() {
                out.batches.push(self.batch(&events)?);
            }
            chunk_start = chunk_end;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, StringArray};
    use arrow::datatypes::{Field, Schema, TimeUnit};
    use etlantic_core::streaming::ExecutionMode;

    fn source(uri: &str, cols: &[(&str, DataType)]) -> Result<NexmarkSource> {
        let schema = Arc::new(Schema::new(
            cols.iter()
                .map(|(n, t)| Field::new(*n, t.clone(), true))
                .collect::<Vec<_>>(),
        ));
        NexmarkSource::new(SourceContext {
            asset: "a".into(),
            uri: BindingUri::parse(uri).unwrap(),
            schema,
            contract: None,
            root: ".".into(),
            mode: ExecutionMode::Streaming,
            state_dir: None,
        })
    }

    fn ts() -> DataType {
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
    }

    fn ints(b: &RecordBatch, col: usize) -> Vec<i64> {
        b.column(col)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .values()
            .to_vec()
    }

    async fn read_all(s: &mut NexmarkSource) -> Vec<RecordBatch> {
        let end = s
            .latest_offset(None, &ReadLimit::unlimited())
            .await
            .unwrap()
            .unwrap();
        s.read(None, &end).await.unwrap().batches
    }

    #[test]
    fn tabulated_positions_are_those_whose_event_is_of_the_stream() {
        for stream in ["persons", "auctions", "bids"] {
            for g in [1u64, 7, 50, 64, 1_000] {
                let s = source(
                    &format!("nexmark://{stream}?events_per_batch=100&start_ms=0&out_of_order={g}"),
                    &[("date_time", ts())],
                )
                .unwrap();
                assert!(
                    s.own.period > 0
                        && s.own.period.is_multiple_of(g)
                        && s.own.period.is_multiple_of(50)
                );
                for (from, to) in [(0, 1), (0, 5_000), (17, 4_013), (123_456, 130_001), (9, 9)] {
                    let scanned: Vec<u64> = (from..to).filter(|n| s.is_ours(*n)).collect();
                    assert_eq!(
                        s.positions(from, to),
                        scanned,
                        "{stream} g={g} {from}..{to}"
                    );
                }
            }
        }
    }

    #[tokio::test]
    async fn streams_share_one_event_sequence_and_replay() {
        let mut auctions = source(
            "nexmark://auctions?events_per_batch=100&start_ms=0&out_of_order=1",
            &[("id", DataType::Int64), ("date_time", ts())],
        )
        .unwrap();
        let mut bids = source(
            "nexmark://bids?events_per_batch=100&start_ms=0&out_of_order=1",
            &[
                ("auction", DataType::Int64),
                ("date_time", ts()),
                ("price", DataType::Int32),
            ],
        )
        .unwrap();
        let end = auctions
            .latest_offset(None, &ReadLimit::unlimited())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(end.0, serde_json::json!(100));
        let a = auctions.read(None, &end).await.unwrap();
        // Events 1-3 and 51-53 are auctions 1000..1006, at 100 µs per event.
        assert_eq!(a.num_rows(), 6);
        assert_eq!(ints(&a.batches[0], 0), [1000, 1001, 1002, 1003, 1004, 1005]);
        let b = bids.read(None, &end).await.unwrap();
        assert_eq!(b.num_rows(), 92);
        assert_eq!(b.batches[0].column(2).data_type(), &DataType::Int32);
        // Bids go to auctions in flight, or at most 10 ahead of the newest (Beam's lead).
        assert!(ints(&b.batches[0], 0)[..46]
            .iter()
            .all(|x| (1000..=1012).contains(x)));
        // Deterministic: the same range gives the same rows.
        let again = bids.read(None, &end).await.unwrap();
        assert_eq!(again.batches, b.batches);
        // max_events stops the stream.
        let mut capped = source(
            "nexmark://bids?events_per_batch=100&max_events=150",
            &[("price", DataType::Int64)],
        )
        .unwrap();
        let o = capped
            .latest_offset(Some(&end), &ReadLimit::unlimited())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(o.0, serde_json::json!(150));
        assert_eq!(
            capped
                .latest_offset(Some(&o), &ReadLimit::unlimited())
                .await
                .unwrap(),
            Some(o)
        );
    }

    /// Beam's mix, hot items, categories and out-of-order groups, over 100 000 events.
    #[tokio::test]
    async fn the_distributions_are_beams() {
        let opts = "events_per_batch=100000&start_ms=0";
        let mut bids = source(
            &format!("nexmark://bids?{opts}"),
            &[
                ("auction", DataType::Int64),
                ("bidder", DataType::Int64),
                ("price", DataType::Int64),
                ("date_time", ts()),
            ],
        )
        .unwrap();
        let mut auctions = source(
            &format!("nexmark://auctions?{opts}"),
            &[
                ("id", DataType::Int64),
                ("seller", DataType::Int64),
                ("category", DataType::Int64),
            ],
        )
        .unwrap();
        let mut persons = source(
            &format!("nexmark://persons?{opts}"),
            &[
                ("id", DataType::Int64),
                ("state", DataType::Utf8),
                ("extra", DataType::Utf8),
            ],
        )
        .unwrap();
        let count = |b: &[RecordBatch]| b.iter().map(|b| b.num_rows()).sum::<usize>();
        let (b, a, p) = (
            read_all(&mut bids).await,
            read_all(&mut auctions).await,
            read_all(&mut persons).await,
        );
        // 1:3:46 exactly: out-of-order groups permute ids within 50 positions.
        assert_eq!((count(&p), count(&a), count(&b)), (2_000, 6_000, 92_000));
        let all = |batches: &[RecordBatch], col: usize| -> Vec<i64> {
            batches.iter().flat_map(|b| ints(b, col)).collect()
        };
        let share = |v: &[i64], f: &dyn Fn(i64) -> bool| {
            v.iter().filter(|x| f(**x)).count() as f64 / v.len() as f64
        };
        let auction = all(&b, 0);
        let bidder = all(&b, 1);
        let hot_auction = share(&auction, &|x| x % 100 == 0);
        let hot_bidder = share(&bidder, &|x| x % 100 == 1);
        assert!(
            (0.48..0.53).contains(&hot_auction),
            "hot auctions {hot_auction}"
        );
        assert!(
            (0.73..0.77).contains(&hot_bidder),
            "hot bidders {hot_bidder}"
        );
        let seller = all(&a, 1);
        let hot_seller = share(&seller, &|x| x % 100 == 0);
        assert!(
            (0.73..0.77).contains(&hot_seller),
            "hot sellers {hot_seller}"
        );
        let cats = all(&a, 2);
        assert!(cats.iter().all(|c| (10..15).contains(c)));
        // Prices: 10^(6u) dollars, so the median is about $1000.
        let mut prices = all(&b, 2);
        prices.sort();
        let median = prices[prices.len() / 2];
        assert!((50_000..200_000).contains(&median), "median price {median}");
        // Out of order: auction ids do not ascend with time, but every id 1000.. appears
        // once.
        let ids = all(&a, 0);
        assert!(
            ids.windows(2).any(|w| w[1] < w[0]),
            "ids arrive out of order"
        );
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(sorted, (1000..7000).collect::<Vec<i64>>());
        // Persons' states are Beam's six; `extra` pads a person to ~200 bytes.
        let states = p[0]
            .column(1)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert!(states
            .iter()
            .all(|s| ["AZ", "CA", "ID", "OR", "WA", "WY"].contains(&s.unwrap())));
        let extra = p[0]
            .column(2)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        let avg = extra.iter().map(|s| s.unwrap().len()).sum::<usize>() / extra.len();
        assert!((100..140).contains(&avg), "extra {avg}");
        // Another seed, other prices; the same seed, the same.
        let mut other = source(
            &format!("nexmark://bids?{opts}&seed=7"),
            &[("price", DataType::Int64)],
        )
        .unwrap();
        let o = all(&read_all(&mut other).await, 0);
        assert_ne!(o[..100], all(&b, 2)[..100]);
        assert_eq!(all(&read_all(&mut bids).await, 2), all(&b, 2));
    }

    #[test]
    fn bad_bindings_and_columns_are_refused() {
        assert!(source("nexmark://bids?realtime=sometimes", &[]).is_err());
        assert!(source("nexmark://trades", &[]).is_err());
        assert!(source("nexmark://bids?speed=3", &[]).is_err());
        let e = source("nexmark://bids", &[("seller", DataType::Int64)]).unwrap_err();
        assert_eq!(e.code(), "ETL301");
    }

    #[tokio::test]
    async fn realtime_offers_only_the_events_whose_time_has_passed() {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        // Started 1 s ago at one event per ms: about 1000 positions are due, not the
        // 1 000 000 a trigger would otherwise offer.
        let uri = format!(
            "nexmark://bids?events_per_batch=1000000&event_gap_us=1000&start_ms={}&realtime=true",
            now_ms - 1000
        );
        let mut s = source(&uri, &[("date_time", ts())]).unwrap();
        let end = s
            .latest_offset(None, &ReadLimit::unlimited())
            .await
            .unwrap();
        let end = end.map(|o| parse(&o).unwrap()).unwrap();
        assert!((1000..2000).contains(&end), "{end} positions offered");
        // A start in the future offers nothing yet.
        let uri = format!(
            "nexmark://bids?event_gap_us=1000&start_ms={}&realtime=true",
            now_ms + 60_000
        );
        let mut s = source(&uri, &[("date_time", ts())]).unwrap();
        assert_eq!(
            s.latest_offset(None, &ReadLimit::unlimited())
                .await
                .unwrap(),
            None
        );
    }

    #[test]
    fn digits_are_written_zero_padded() {
        let mut s = String::new();
        push_digits(&mut s, 42, 4);
        push_digits(&mut s, 0, 1);
        push_digits(&mut s, 12_345, 1);
        assert_eq!(s, "0042012345");
    }

    #[tokio::test]
    async fn string_columns_have_their_shapes() {
        let mut persons = source(
            "nexmark://persons?events_per_batch=5000&start_ms=0",
            &[
                ("name", DataType::Utf8),
                ("credit_card", DataType::Utf8),
                ("email_address", DataType::Utf8),
            ],
        )
        .unwrap();
        let b = &read_all(&mut persons).await[0];
        let col = |i: usize| {
            b.column(i)
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .clone()
        };
        let (names, cards, emails) = (col(0), col(1), col(2));
        for i in 0..b.num_rows() {
            assert_eq!(names.value(i).split(' ').count(), 2);
            let card = cards.value(i);
            assert_eq!(card.len(), 19, "{card}");
            assert!(card
                .split(' ')
                .all(|g| g.len() == 4 && g.bytes().all(|c| c.is_ascii_digit())));
            assert!(emails.value(i).ends_with(".com"));
        }
        let mut bids = source(
            "nexmark://bids?events_per_batch=5000&start_ms=0",
            &[("channel", DataType::Utf8), ("url", DataType::Utf8)],
        )
        .unwrap();
        let b = &read_all(&mut bids).await[0];
        let channel = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
        let url = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        for i in 0..b.num_rows() {
            assert!(url.value(i).starts_with("https://www.nexmark.com/"));
            let id = url.value(i).rsplit_once("channel_id=").unwrap().1;
            match channel.value(i).strip_prefix("channel-") {
                Some(n) => assert_eq!(n, id),
                None => assert!(HOT_CHANNELS.contains(&channel.value(i))),
            }
        }
    }
}
