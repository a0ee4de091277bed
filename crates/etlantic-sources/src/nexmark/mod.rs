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
use etlantic_core::plugin::BindingOption;
use etlantic_core::plugin::{
    ReadLimit, Source, SourceBatch, SourceCapabilities, SourceContext, SourceProvider,
    SourceRegistration,
};
use etlantic_core::uri::BindingUri;
use std::sync::Arc;

mod events;
mod options;
#[cfg(test)]
mod tests;

use events::{
    beam, filler, kind_of, last_auction, last_person, mix, some_auction, some_person, EventRng,
    CITIES, FIRST_NAMES, HOT_CHANNELS, LAST_NAMES, STATES,
};
pub use options::{NexmarkOptions, OPTIONS};

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
