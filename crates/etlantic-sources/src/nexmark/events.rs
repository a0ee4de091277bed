//! What an event is generated from, after Beam's Nexmark generator: the random draws
//! seeded by the event id, Beam's constants, the word lists and filler text of the string
//! fields, and the arithmetic of event ids (which stream an id is, the newest person and
//! auction at an id, the person or auction a bid or auction names).

use super::Stream;

/// splitmix64: a well-mixed hash of an event number.
pub(super) fn mix(n: u64, salt: u64) -> u64 {
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
pub(super) struct EventRng(u64);

impl EventRng {
    pub(super) fn new(seed: u64, id: u64) -> Self {
        EventRng(mix(id, seed ^ 0x6E65_786D_6172_6B21))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0, 0)
    }

    /// Uniform in `0..n` (`n` ≥ 1).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        // Lemire's multiply-shift: unbiased enough for a benchmark, no division.
        ((self.next() as u128 * n.max(1) as u128) >> 64) as u64
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Beam's `nextPrice`: 10^(6·u) dollars, in cents — most prices are small.
    pub(super) fn price(&mut self) -> i64 {
        // 10^x as e^(x ln 10): `exp` is cheaper than `powf`.
        ((self.unit() * 6.0 * std::f64::consts::LN_10).exp() * 100.0).round() as i64
    }
}

/// Beam's generator constants (`GeneratorConfig`, `NexmarkConfiguration` defaults).
pub(super) mod beam {
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

pub(super) const CITIES: &[&str] = &[
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
pub(super) const STATES: &[&str] = &["AZ", "CA", "ID", "OR", "WA", "WY"];
pub(super) const FIRST_NAMES: &[&str] = &[
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
];
pub(super) const LAST_NAMES: &[&str] = &[
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris",
];
pub(super) const HOT_CHANNELS: &[&str] = &["Google", "Facebook", "Baidu", "Apple"];
/// Padding for `extra` and other filler text (sliced, never allocated per character).
static FILLER: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ".repeat(16)
});

/// A piece of filler text of `len` characters (at most the filler's), starting at a
/// place chosen by `h`.
pub(super) fn filler(h: u64, len: usize) -> &'static str {
    let all: &'static str = FILLER.as_str();
    let len = len.min(all.len() / 2);
    let at = (h % (all.len() - len + 1) as u64) as usize;
    &all[at..at + len]
}

/// The stream event id `id` belongs to (Beam: by `id % 50`).
pub(super) fn kind_of(id: u64) -> Stream {
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
pub(super) fn last_person(id: u64) -> i64 {
    let epoch = (id / beam::PROPORTION_DENOMINATOR) as i64;
    let offset = (id % beam::PROPORTION_DENOMINATOR).min(beam::PERSON_PROPORTION - 1) as i64;
    epoch * beam::PERSON_PROPORTION as i64 + offset
}

/// Beam's `lastBase0AuctionId`: the newest auction at event `id` (-1 before the first).
pub(super) fn last_auction(id: u64) -> i64 {
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
pub(super) fn some_person(id: u64, rng: &mut EventRng) -> i64 {
    let people = last_person(id) as u64 + 1;
    let active = people.min(beam::NUM_ACTIVE_PEOPLE);
    let n = rng.below(active + beam::PERSON_ID_LEAD);
    (people - active + n) as i64
}

/// Beam's `nextBase0AuctionId`: one of the auctions in flight (or a few ahead).
pub(super) fn some_auction(id: u64, rng: &mut EventRng) -> i64 {
    let max = last_auction(id).max(0);
    let min = (max - beam::NUM_IN_FLIGHT_AUCTIONS as i64).max(0);
    min + rng.below((max - min) as u64 + 1 + beam::AUCTION_ID_LEAD) as i64
}
