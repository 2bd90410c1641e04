//! Every Nexmark query against a plain single-threaded computation of what it means, over the
//! same generated events: the query runs on the local executor (one task per operator), the
//! reference is a few loops over the generator's events. Rows are compared as sorted multisets
//! (running aggregates carry their count and sum, so a lost, duplicated or misordered input
//! changes a row).

use std::collections::{BTreeMap, BTreeSet};

use koala_dataflow::local::{LocalOptions, run_with};
use serde::de::DeserializeOwned;

use super::*;

/// Enough events for matches in every query: short auctions, few active people and auctions.
fn params() -> NexmarkParams {
    NexmarkParams {
        nexmark: NexmarkConfig {
            events: Some(20_000),
            active_people: 20,
            active_auctions: 40,
            auction_duration_ms: 400,
            hot_ratio: 0.2,
            ..Default::default()
        },
        q2_auctions: (1000..1400).step_by(7).collect(),
        state_padding_bytes: 16,
        window_ms: 200,
        slide_ms: 50,
        last_prices: 3,
        new_user_period_ms: 300,
        ..Default::default()
    }
}

fn events(p: &NexmarkParams) -> Vec<Event> {
    NexmarkGenerator::new(p.nexmark.clone()).expect("valid").events().collect()
}

/// The query's sink rows, sorted.
fn run<T: DeserializeOwned + Ord>(name: &str, p: &NexmarkParams) -> Vec<T> {
    let graph = build(name, p).expect("registered").expect("builds");
    let out = run_with(&graph, &LocalOptions { batch_size: 16, ..Default::default() }).expect("runs");
    let mut rows: Vec<T> = out["sink"]
        .iter()
        .map(|v| serde_json::from_value(v.clone()).expect("row of the query's output type"))
        .collect();
    rows.sort();
    rows
}

fn check<T: DeserializeOwned + Ord + std::fmt::Debug>(name: &str, p: &NexmarkParams, mut expected: Vec<T>) {
    expected.sort();
    assert!(expected.len() >= 5, "{name}: only {} expected rows; the test proves little", expected.len());
    let got = run::<T>(name, p);
    if got != expected {
        let missing: Vec<&T> = expected.iter().filter(|r| !got.contains(r)).take(3).collect();
        let extra: Vec<&T> = got.iter().filter(|r| !expected.contains(r)).take(3).collect();
        panic!(
            "{name}: {} rows, expected {}; missing {missing:?}; extra {extra:?}",
            got.len(),
            expected.len()
        );
    }
}

fn bids(events: &[Event]) -> impl Iterator<Item = &Bid> {
    events.iter().filter_map(|e| if let Event::Bid(b) = e { Some(b) } else { None })
}

fn auctions(events: &[Event]) -> impl Iterator<Item = &Auction> {
    events.iter().filter_map(|e| if let Event::Auction(a) = e { Some(a) } else { None })
}

fn people(events: &[Event]) -> impl Iterator<Item = &Person> {
    events.iter().filter_map(|e| if let Event::Person(p) = e { Some(p) } else { None })
}

/// The encoded key's bytes (postcard: LEB128), the order in which timers of one time fire.
fn key_bytes(mut id: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (id & 0x7f) as u8;
        id >>= 7;
        if id == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// Q4/Q6's closed auctions in the order their timers fire: by expiry, then encoded auction id.
fn closed_auctions(events: &[Event]) -> Vec<ClosedAuction> {
    let mut best: BTreeMap<u64, u64> = BTreeMap::new();
    let by_id: BTreeMap<u64, &Auction> = auctions(events).map(|a| (a.id, a)).collect();
    for b in bids(events) {
        let a = by_id[&b.auction];
        if b.date_time < a.expires && b.price >= a.reserve {
            let e = best.entry(a.id).or_default();
            *e = (*e).max(b.price);
        }
    }
    let mut closed: Vec<(u64, Vec<u8>, ClosedAuction)> = best
        .into_iter()
        .map(|(id, price)| {
            let a = by_id[&id];
            (
                a.expires,
                key_bytes(id),
                ClosedAuction { auction: id, seller: a.seller, category: a.category, price },
            )
        })
        .collect();
    closed.sort();
    closed.into_iter().map(|(.., c)| c).collect()
}

fn category_averages(closed: &[ClosedAuction]) -> Vec<CategoryAverage> {
    let mut totals: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    closed
        .iter()
        .map(|c| {
            let t = totals.entry(c.category).or_default();
            t.0 += 1;
            t.1 += c.price;
            CategoryAverage {
                key: c.category,
                count: t.0,
                sum: t.1,
                average: t.1 / t.0,
                auction: c.auction,
                price: c.price,
            }
        })
        .collect()
}

fn seller_averages(closed: &[ClosedAuction], n: usize) -> Vec<SellerAverage> {
    let mut rings: BTreeMap<u64, (u64, Vec<u64>)> = BTreeMap::new();
    closed
        .iter()
        .map(|c| {
            let (count, prices) = rings.entry(c.seller).or_default();
            *count += 1;
            prices.push(c.price);
            if prices.len() > n {
                prices.remove(0);
            }
            let average = prices.iter().sum::<u64>() / prices.len() as u64;
            SellerAverage { key: c.seller, count: *count, auction: c.auction, price: c.price, average }
        })
        .collect()
}

#[test]
fn q1_converts_every_bid() {
    let p = params();
    let expected = bids(&events(&p))
        .map(|b| ConvertedBid {
            key: b.auction,
            bidder: b.bidder,
            price: (b.price as f64 * 0.85).round() as u64,
            date_time: b.date_time,
        })
        .collect();
    check("nexmark-q1", &p, expected);
}

#[test]
fn q2_keeps_the_bids_of_the_chosen_auctions() {
    let p = params();
    let chosen: BTreeSet<u64> = p.q2_auctions.iter().copied().collect();
    let expected = bids(&events(&p))
        .filter(|b| chosen.contains(&b.auction))
        .map(|b| AuctionBid { key: b.auction, price: b.price })
        .collect();
    check("nexmark-q2", &p, expected);
}

#[test]
fn q3_joins_sellers_outside_oregon_with_their_auctions_outside_category_10() {
    let p = params();
    let ev = events(&p);
    let sellers: BTreeMap<u64, &Person> =
        people(&ev).filter(|p| p.state != "OR").map(|p| (p.id, p)).collect();
    let expected = auctions(&ev)
        .filter(|a| a.category != 10)
        .filter_map(|a| {
            let s = sellers.get(&a.seller)?;
            Some(SellerAuction {
                key: s.id,
                name: s.name.clone(),
                city: s.city.clone(),
                state: s.state.clone(),
                auction: a.id,
            })
        })
        .collect();
    check("nexmark-q3", &p, expected);
}

#[test]
fn q4_averages_closing_prices_per_category() {
    let p = params();
    check("nexmark-q4", &p, category_averages(&closed_auctions(&events(&p))));
}

#[test]
fn q4star_averages_pre_joined_closing_prices_per_category() {
    let p = params();
    let closed: Vec<ClosedAuction> = auctions(&events(&p)).map(closed_auction_of).collect();
    check("nexmark-q4star", &p, category_averages(&closed));
}

#[test]
fn q5_finds_the_auction_with_most_bids_per_sliding_window() {
    let p = params();
    let (size, slide) = (p.window_ms, p.slide_ms);
    let mut counts: BTreeMap<(u64, u64), u64> = BTreeMap::new(); // (window end, auction)
    for b in bids(&events(&p)) {
        let mut start = b.date_time / slide * slide;
        loop {
            if start + size <= b.date_time {
                break;
            }
            *counts.entry((start + size, b.auction)).or_default() += 1;
            if start < slide {
                break;
            }
            start -= slide;
        }
    }
    let mut hottest: BTreeMap<u64, (u64, u64)> = BTreeMap::new(); // end → (count, auction)
    for ((end, auction), n) in counts {
        let e = hottest.entry(end).or_insert((n, auction));
        if n > e.0 {
            *e = (n, auction); // auctions come in ascending order: ties keep the smallest
        }
    }
    let expected =
        hottest.into_iter().map(|(end, (count, auction))| HotAuction { key: end, auction, count }).collect();
    check("nexmark-q5", &p, expected);
}

#[test]
fn q6_averages_the_last_closing_prices_per_seller() {
    let p = params();
    check("nexmark-q6", &p, seller_averages(&closed_auctions(&events(&p)), p.last_prices));
}

#[test]
fn q6star_averages_the_last_pre_joined_closing_prices_per_seller() {
    let p = params();
    let closed: Vec<ClosedAuction> = auctions(&events(&p)).map(closed_auction_of).collect();
    check("nexmark-q6star", &p, seller_averages(&closed, p.last_prices));
}

#[test]
fn q7_finds_the_highest_bid_per_tumbling_window() {
    let p = params();
    let mut best: BTreeMap<u64, (u64, std::cmp::Reverse<(u64, u64)>)> = BTreeMap::new();
    for b in bids(&events(&p)) {
        let end = b.date_time / p.window_ms * p.window_ms + p.window_ms;
        let candidate = (b.price, std::cmp::Reverse((b.bidder, b.auction)));
        let e = best.entry(end).or_insert(candidate);
        if candidate > *e {
            *e = candidate;
        }
    }
    let expected = best
        .into_iter()
        .map(|(end, (price, std::cmp::Reverse((bidder, auction))))| HighestBid {
            key: end,
            price,
            bidder,
            auction,
        })
        .collect();
    check("nexmark-q7", &p, expected);
}

#[test]
fn q8_joins_new_people_with_the_auctions_they_open_in_their_first_period() {
    let p = params();
    let ev = events(&p);
    let registered: BTreeMap<u64, &Person> = people(&ev).map(|p| (p.id, p)).collect();
    let expected = auctions(&ev)
        .filter_map(|a| {
            let s = registered.get(&a.seller)?;
            (s.date_time..s.date_time + p.new_user_period_ms).contains(&a.date_time).then(|| NewSeller {
                key: s.id,
                name: s.name.clone(),
                auction: a.id,
            })
        })
        .collect();
    check("nexmark-q8", &p, expected);
}

#[test]
fn bad_params_are_rejected_with_the_field_named() {
    let bad = |p: NexmarkParams| build("nexmark-q5", &p).expect("registered").err().unwrap_or_default();
    assert!(bad(NexmarkParams { slide_ms: 0, ..params() }).contains("slide_ms"));
    assert!(bad(NexmarkParams { q1_price_factor: f64::NAN, ..params() }).contains("q1_price_factor"));
    let mut p = params();
    p.nexmark.hot_ratio = 2.0;
    assert!(bad(p).contains("params.nexmark"));
    assert!(build("nexmark-q9", &params()).is_none());
}
