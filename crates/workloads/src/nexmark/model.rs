//! The Nexmark event types (the Beam/Flink Nexmark model, as the Koala artifact uses it): people
//! register, people open auctions, people bid on auctions.

use serde::{Deserialize, Serialize};

/// A person registering with the auction site. Keyed by `id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Person {
    /// Person id (the key of the person topic; sellers and bidders refer to it).
    pub id: u64,
    /// Full name.
    pub name: String,
    /// E-mail address.
    pub email_address: String,
    /// Credit card number.
    pub credit_card: String,
    /// City.
    pub city: String,
    /// US state (two letters).
    pub state: String,
    /// Event time in milliseconds.
    pub date_time: u64,
    /// Padding of `extra_payload_bytes` characters to make records and state larger.
    pub extra: String,
}

/// An auction opened by a seller. Keyed by `id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auction {
    /// Auction id.
    pub id: u64,
    /// Name of the item sold.
    pub item_name: String,
    /// Description of the item.
    pub description: String,
    /// Opening bid (cents).
    pub initial_bid: u64,
    /// Reserve price (cents).
    pub reserve: u64,
    /// Event time in milliseconds.
    pub date_time: u64,
    /// Event time (ms) at which the auction closes.
    pub expires: u64,
    /// Person id of the seller.
    pub seller: u64,
    /// Category id.
    pub category: u64,
    /// Padding of `extra_payload_bytes` characters.
    pub extra: String,
}

/// A bid on an auction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bid {
    /// Auction id bid on.
    pub auction: u64,
    /// Person id of the bidder.
    pub bidder: u64,
    /// Price (cents).
    pub price: u64,
    /// Channel the bid came through.
    pub channel: String,
    /// URL of the bid page.
    pub url: String,
    /// Event time in milliseconds.
    pub date_time: u64,
    /// Padding of `extra_payload_bytes` characters.
    pub extra: String,
}

/// One generated Nexmark event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// A new person.
    Person(Person),
    /// A new auction.
    Auction(Auction),
    /// A bid.
    Bid(Bid),
}

/// The three kinds of events; each goes to its own topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// [`Person`] events.
    Person,
    /// [`Auction`] events.
    Auction,
    /// [`Bid`] events.
    Bid,
}

impl EventKind {
    /// All kinds, in topic order.
    pub const ALL: [EventKind; 3] = [EventKind::Person, EventKind::Auction, EventKind::Bid];

    /// The lower-case name (`person`, `auction`, `bid`), used in topic names.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Person => "person",
            EventKind::Auction => "auction",
            EventKind::Bid => "bid",
        }
    }
}

impl Event {
    /// Which kind of event this is.
    pub fn kind(&self) -> EventKind {
        match self {
            Event::Person(_) => EventKind::Person,
            Event::Auction(_) => EventKind::Auction,
            Event::Bid(_) => EventKind::Bid,
        }
    }

    /// The event time in milliseconds.
    pub fn date_time(&self) -> u64 {
        match self {
            Event::Person(p) => p.date_time,
            Event::Auction(a) => a.date_time,
            Event::Bid(b) => b.date_time,
        }
    }

    /// Overwrites the event time (a producer stamping wall-clock time); an auction keeps its
    /// duration, so `expires` moves with it.
    pub fn set_date_time(&mut self, ms: u64) {
        match self {
            Event::Person(p) => p.date_time = ms,
            Event::Auction(a) => {
                let duration = a.expires.saturating_sub(a.date_time);
                a.date_time = ms;
                a.expires = ms.saturating_add(duration);
            }
            Event::Bid(b) => b.date_time = ms,
        }
    }

    /// The natural key of the event's topic: person id, auction id, or the auction a bid is for.
    pub fn key(&self) -> u64 {
        match self {
            Event::Person(p) => p.id,
            Event::Auction(a) => a.id,
            Event::Bid(b) => b.auction,
        }
    }
}
