//! Deterministic Nexmark event generation: event number `n` alone (with the config) decides the
//! event, so any producer or source task can regenerate any part of the stream, and a replay after
//! recovery sees the same events.
//!
//! Proportions are 1 person : 3 auctions : 46 bids per block of 50 event numbers
//! (docs/architecture.md §12). Ids are dense: the `b`-th block creates person `1000 + b` and
//! auctions `1000 + 3b .. 1000 + 3b + 2`, so "the newest person/auction at event `n`" is a
//! formula, not state.

use super::config::{NexmarkConfig, NexmarkConfigError};
use super::model::{Auction, Bid, Event, Person};

/// Persons per block of [`TOTAL_PROPORTION`] events.
pub const PERSON_PROPORTION: u64 = 1;
/// Auctions per block.
pub const AUCTION_PROPORTION: u64 = 3;
/// Bids per block.
pub const BID_PROPORTION: u64 = 46;
/// Events per block.
pub const TOTAL_PROPORTION: u64 = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION;
/// Id of the first person (as Beam's Nexmark; Q2's auction ids assume these offsets).
pub const FIRST_PERSON_ID: u64 = 1000;
/// Id of the first auction.
pub const FIRST_AUCTION_ID: u64 = 1000;
/// Id of the first category.
pub const FIRST_CATEGORY_ID: u64 = 10;

const FIRST_NAMES: [&str; 8] = ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie"];
const LAST_NAMES: [&str; 8] = ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones"];
const CITIES: [&str; 10] = [
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
const STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
const CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];
const ITEMS: [&str; 8] = ["lamp", "chair", "bike", "clock", "vase", "radio", "camera", "guitar"];

/// Generates the events of one producer (or one embedded source task).
///
/// ```
/// use koala_workloads::nexmark::{Event, NexmarkConfig, NexmarkGenerator};
/// let g = NexmarkGenerator::new(NexmarkConfig { events: Some(100), ..Default::default() })?;
/// let events: Vec<Event> = g.events().collect();
/// assert_eq!(events.len(), 100);
/// assert!(matches!(events[0], Event::Person(_)));
/// assert_eq!(g.event(7), g.event(7)); // deterministic
/// # Ok::<(), koala_workloads::nexmark::NexmarkConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct NexmarkGenerator {
    config: NexmarkConfig,
    extra: String,
}

impl NexmarkGenerator {
    /// Validates the config and builds the generator.
    pub fn new(config: NexmarkConfig) -> Result<Self, NexmarkConfigError> {
        config.validate()?;
        let extra = (0..config.extra_payload_bytes).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        Ok(Self { config, extra })
    }

    /// The configuration.
    pub fn config(&self) -> &NexmarkConfig {
        &self.config
    }

    /// The global event number of this producer's `seq`-th event (0-based), or `None` once the
    /// configured number of events is exhausted.
    pub fn event_number(&self, seq: u64) -> Option<u64> {
        let c = &self.config;
        let offset = seq.checked_mul(u64::from(c.producers))?.checked_add(u64::from(c.producer_index))?;
        if c.events.is_some_and(|limit| offset >= limit) {
            return None;
        }
        c.first_event.checked_add(offset)
    }

    /// How many events this producer generates in total, or `None` when unbounded.
    pub fn events_of_producer(&self) -> Option<u64> {
        let c = &self.config;
        let k = u64::from(c.producers);
        c.events.map(|limit| limit.saturating_sub(u64::from(c.producer_index)).div_ceil(k))
    }

    /// This producer's `seq`-th event, or `None` past the end.
    pub fn event(&self, seq: u64) -> Option<Event> {
        self.event_number(seq).map(|n| self.event_at(n))
    }

    /// This producer's events in order.
    pub fn events(&self) -> impl Iterator<Item = Event> + '_ {
        (0..).map_while(|seq| self.event(seq))
    }

    /// The event with global event number `n` (whichever producer owns it).
    pub fn event_at(&self, n: u64) -> Event {
        let mut rng = SplitMix64::new(self.config.seed, n);
        let block = n / TOTAL_PROPORTION;
        let rem = n % TOTAL_PROPORTION;
        let date_time = self.date_time(n);
        if rem < PERSON_PROPORTION {
            Event::Person(self.person(FIRST_PERSON_ID + block, date_time, &mut rng))
        } else if rem < PERSON_PROPORTION + AUCTION_PROPORTION {
            let id = FIRST_AUCTION_ID + block * AUCTION_PROPORTION + (rem - PERSON_PROPORTION);
            Event::Auction(self.auction(n, id, date_time, &mut rng))
        } else {
            Event::Bid(self.bid(n, date_time, &mut rng))
        }
    }

    /// Event time of event number `n`: `base_time_ms + n · inter_event_delay_us / 1000`.
    pub fn date_time(&self, n: u64) -> u64 {
        let offset_us = u128::from(n) * u128::from(self.config.inter_event_delay_us);
        let offset_ms = u64::try_from(offset_us / 1000).unwrap_or(u64::MAX);
        self.config.base_time_ms.saturating_add(offset_ms)
    }

    fn person(&self, id: u64, date_time: u64, rng: &mut SplitMix64) -> Person {
        let first = FIRST_NAMES[rng.below(FIRST_NAMES.len() as u64) as usize];
        let last = LAST_NAMES[rng.below(LAST_NAMES.len() as u64) as usize];
        let card: Vec<String> = (0..4).map(|_| format!("{:04}", rng.below(10_000))).collect();
        Person {
            id,
            name: format!("{first} {last}"),
            email_address: format!("{}{id}@example.com", last.to_lowercase()),
            credit_card: card.join(" "),
            city: CITIES[rng.below(CITIES.len() as u64) as usize].to_string(),
            state: STATES[rng.below(STATES.len() as u64) as usize].to_string(),
            date_time,
            extra: self.extra.clone(),
        }
    }

    fn auction(&self, n: u64, id: u64, date_time: u64, rng: &mut SplitMix64) -> Auction {
        let c = &self.config;
        let seller = if c.warmup {
            FIRST_PERSON_ID + n
        } else {
            self.reference(rng, newest_person(n), FIRST_PERSON_ID, c.active_people)
        };
        let initial_bid = next_price(rng);
        let item = ITEMS[rng.below(ITEMS.len() as u64) as usize];
        let d = c.auction_duration_ms;
        Auction {
            id,
            item_name: format!("{item} {id}"),
            description: format!("a fine {item}"),
            initial_bid,
            reserve: initial_bid + next_price(rng),
            date_time,
            expires: date_time.saturating_add(d / 2 + rng.below(d)),
            seller,
            category: FIRST_CATEGORY_ID + rng.below(c.num_categories),
            extra: self.extra.clone(),
        }
    }

    fn bid(&self, n: u64, date_time: u64, rng: &mut SplitMix64) -> Bid {
        let c = &self.config;
        let (auction, bidder) = if c.warmup {
            (FIRST_AUCTION_ID + n, FIRST_PERSON_ID + n)
        } else {
            let auction = self.reference(rng, newest_auction(n), FIRST_AUCTION_ID, c.active_auctions);
            (auction, self.reference(rng, newest_person(n), FIRST_PERSON_ID, c.active_people))
        };
        let channel = CHANNELS[rng.below(CHANNELS.len() as u64) as usize];
        Bid {
            auction,
            bidder,
            price: next_price(rng),
            channel: channel.to_string(),
            url: format!("https://www.nexmark.com/{}/item.htm?query=1", channel.to_lowercase()),
            date_time,
            extra: self.extra.clone(),
        }
    }

    /// A reference to an existing id: with probability `hot_ratio` the hot key of the newest id's
    /// block, otherwise uniform over the newest `window` ids.
    fn reference(&self, rng: &mut SplitMix64, newest: u64, first: u64, window: u64) -> u64 {
        let base0 = newest - first;
        if self.config.hot_ratio > 0.0 && rng.unit() < self.config.hot_ratio {
            let range = self.config.hot_range;
            return first + base0 / range * range;
        }
        newest - rng.below(window.min(base0 + 1))
    }
}

/// The newest person id that exists at event `n` (the person of `n`'s block comes first).
fn newest_person(n: u64) -> u64 {
    FIRST_PERSON_ID + n / TOTAL_PROPORTION
}

/// The newest auction id that exists at event `n` (or the first id before any exists).
fn newest_auction(n: u64) -> u64 {
    let rem = n % TOTAL_PROPORTION;
    let in_block = rem.saturating_sub(PERSON_PROPORTION).min(AUCTION_PROPORTION);
    let created = n / TOTAL_PROPORTION * AUCTION_PROPORTION + in_block;
    FIRST_AUCTION_ID + created.saturating_sub(1)
}

/// A price in cents, log-uniform between $1 and $1M (as Beam's Nexmark).
fn next_price(rng: &mut SplitMix64) -> u64 {
    (10f64.powf(rng.unit() * 6.0) * 100.0).round() as u64
}

/// SplitMix64, seeded per event so that event `n` never depends on any other event.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64, n: u64) -> Self {
        let mut s = Self(seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        s.next();
        s
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound > 0`; the modulo bias is negligible for our bounds).
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}
