//! The per-key logic of the Nexmark operators with timers: Q4's and Q6's "closed_auction" and
//! Q8's "new_users" (both joins whose state a timer ends), and the pre-joined closed auctions of
//! Q4* and Q6*.
//!
//! Both joins key people, auctions and bids by a person or auction id, and the two sides of a key
//! may come from different source tasks, so either side can arrive first. A record of the second
//! side that arrives before the first waits in the key's list with a clean-up timer just after its
//! own event time: the first side is never later than it in event time, so once the watermark
//! passes it the first side has arrived or never will (its state already ended), and the waiting
//! records are dropped. When the first side arrives it takes the waiting records and deletes their
//! clean-up timers.

use koala_dataflow::KeyContext;
use serde::{Deserialize, Serialize};

use super::{Auction, Event};

/// A closed auction: its winning price (Q4, Q6), or the pre-joined input of Q4* and Q6*.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClosedAuction {
    /// The auction.
    pub auction: u64,
    /// Its seller.
    pub seller: u64,
    /// Its category.
    pub category: u64,
    /// The closing price.
    pub price: u64,
}

/// The pre-joined closed auction of an auction event (Q4*, Q6*): it closes at its reserve.
pub fn closed_auction_of(a: &Auction) -> ClosedAuction {
    ClosedAuction { auction: a.id, seller: a.seller, category: a.category, price: a.reserve }
}

/// An open auction as "closed_auction" keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenAuction {
    id: u64,
    seller: u64,
    category: u64,
    reserve: u64,
    expires: u64,
}

/// "closed_auction"'s value per auction: the auction once it arrived, and its best valid bid.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuctionClosing {
    auction: Option<OpenAuction>,
    best: Option<u64>,
}

/// Q4's and Q6's "closed_auction": per auction, the highest bid at or above the reserve placed
/// before `expires`, emitted when the watermark reaches `expires` (a timer); auctions without
/// such a bid close without output.
pub mod close_auctions {
    use super::*;

    /// A bid (price, event time) that arrived before its auction.
    pub type Waiting = (u64, u64);

    fn valid(open: &OpenAuction, price: u64, time: u64) -> bool {
        time < open.expires && price >= open.reserve
    }

    /// An auction or bid of the key's auction.
    pub fn on_event(e: Event, c: &mut KeyContext<AuctionClosing, Waiting>, _out: &mut Vec<ClosedAuction>) {
        match e {
            Event::Auction(a) => {
                let open = OpenAuction {
                    id: a.id,
                    seller: a.seller,
                    category: a.category,
                    reserve: a.reserve,
                    expires: a.expires,
                };
                let mut best = None;
                for &(price, time) in c.list.items() {
                    c.timers.delete(time + 1);
                    if valid(&open, price, time) {
                        best = best.max(Some(price));
                    }
                }
                c.list.clear();
                c.timers.register(open.expires);
                c.value.set(AuctionClosing { auction: Some(open), best });
            }
            Event::Bid(b) => {
                let known = c.value.get().and_then(|s| s.auction.as_ref()).is_some();
                if known {
                    let state = c.value.get_or_insert_default();
                    if state.auction.as_ref().is_some_and(|open| valid(open, b.price, b.date_time)) {
                        state.best = state.best.max(Some(b.price));
                    }
                } else {
                    c.list.push((b.price, b.date_time));
                    c.timers.register(b.date_time + 1);
                }
            }
            Event::Person(_) => {}
        }
    }

    /// A timer of the key: the auction's expiry, or the clean-up of bids waiting for it.
    pub fn on_timer(time: u64, c: &mut KeyContext<AuctionClosing, Waiting>, out: &mut Vec<ClosedAuction>) {
        let expiry = c.value.get().and_then(|s| s.auction.as_ref()).map(|open| open.expires);
        match expiry {
            Some(expires) if expires == time => {
                if let Some(AuctionClosing { auction: Some(open), best: Some(price) }) = c.value.take() {
                    out.push(ClosedAuction {
                        auction: open.id,
                        seller: open.seller,
                        category: open.category,
                        price,
                    });
                }
                c.value.clear();
                c.list.clear();
                c.timers.delete_all();
            }
            Some(_) => {}
            None => {
                // Bids of an auction that closed before they arrived (or never came): drop them.
                c.list.clear();
                c.timers.delete_all();
            }
        }
    }
}

/// "new_users"'s value per person: its name and registration time, once it arrived.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewUserState {
    person: Option<(String, u64)>,
}

/// Q8's "new_users": a person joined with the auctions it opens within `period` ms of
/// registering, as the paper's window join: the auctions collect in the person's list and are
/// emitted when the period ends (a timer at registration + `period`), which also ends the
/// person's state.
pub mod new_users {
    use super::*;
    use crate::nexmark::queries::NewSeller;

    /// An auction (id, event time): waiting for its seller, or matched to it once it is here.
    pub type Listed = (u64, u64);

    /// A person or an auction of the key's person.
    pub fn on_event(
        e: Event,
        period: u64,
        c: &mut KeyContext<NewUserState, Listed>,
        _out: &mut Vec<NewSeller>,
    ) {
        match e {
            Event::Person(p) => {
                let since = p.date_time;
                let waiting: Vec<Listed> = c.list.items().to_vec();
                c.list.clear();
                for (auction, time) in waiting {
                    c.timers.delete(time + 1);
                    if (since..since + period).contains(&time) {
                        c.list.push((auction, time));
                    }
                }
                c.timers.register(since + period);
                c.value.set(NewUserState { person: Some((p.name, since)) });
            }
            Event::Auction(a) => match c.value.get().and_then(|s| s.person.as_ref()) {
                Some((_, since)) => {
                    if (*since..since + period).contains(&a.date_time) {
                        c.list.push((a.id, a.date_time));
                    }
                }
                None => {
                    c.list.push((a.id, a.date_time));
                    c.timers.register(a.date_time + 1);
                }
            },
            Event::Bid(_) => {}
        }
    }

    /// A timer of the key: the end of the person's period (emit its auctions), or the clean-up
    /// of auctions that waited for a seller whose period had ended.
    pub fn on_timer(
        person: u64,
        time: u64,
        period: u64,
        c: &mut KeyContext<NewUserState, Listed>,
        out: &mut Vec<NewSeller>,
    ) {
        let registered = c.value.get().and_then(|s| s.person.clone());
        match registered {
            // With the person here, its only timer is the end of its period (the clean-up
            // timers of waiting auctions were deleted when it arrived).
            Some((name, since)) if since + period == time => {
                out.extend(c.list.items().iter().map(|(auction, _)| NewSeller {
                    key: person,
                    name: name.clone(),
                    auction: *auction,
                }));
            }
            Some(_) => return,
            None => {}
        }
        c.value.clear();
        c.list.clear();
        c.timers.delete_all();
    }
}
