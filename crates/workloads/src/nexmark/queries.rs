//! The Nexmark queries of the Koala paper (§5) over the embedded generator: Q1–Q8 and the
//! variants Q4* and Q6* (the artifact's `_modified` queries, over pre-joined closed auctions).
//! Every query also reads the topics `koala produce` writes (`input = "kafka"`: the bid queries
//! `<prefix>-bid`, Q3 and Q8 `-person` and `-auction`, …, [`KafkaStream`]); this crate knows no
//! Kafka, so the caller passes those sources in ([`NexmarkParams::kafka_source`], which
//! `koala run` fills from `[params.kafka]`).
//! Operator names are part of the contract: configs and reconfiguration requests name them.
//!
//! Every query's sink rows carry the key of the operator that produced them as `key`, so outputs
//! can be compared per key. Sources split the generator's event sequence over their tasks
//! (producer `i` of `n`, [`super::NexmarkConfig::for_producer`]), so a run's input is the same for any
//! source parallelism.

use koala_dataflow::ListState;
use koala_dataflow::{
    Data, Dataflow, DataflowError, Generator, JobGraph, KeyContext, KeyedStream, Stream, TaskInstance,
    ValueState, Window, WindowSpec,
};
use serde::{Deserialize, Serialize};

use super::operators::{
    AuctionClosing, ClosedAuction, NewUserState, close_auctions, closed_auction_of, new_users,
};
use super::params::{KafkaStream, NexmarkInput, NexmarkParams};
use super::{Auction, Bid, Event, NexmarkGenerator, Person};
use crate::params::SinkKind;

/// Q1's output: a bid with its price converted.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ConvertedBid {
    /// The auction.
    pub key: u64,
    /// The bidder.
    pub bidder: u64,
    /// The converted price.
    pub price: u64,
    /// Event time.
    pub date_time: u64,
}

/// Q2's output: a bid on one of the chosen auctions.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AuctionBid {
    /// The auction.
    pub key: u64,
    /// The price.
    pub price: u64,
}

/// Q3's output: a seller (not in Oregon) and one of its auctions (not in category 10).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SellerAuction {
    /// The seller's person id.
    pub key: u64,
    /// The seller's name.
    pub name: String,
    /// The seller's city.
    pub city: String,
    /// The seller's state.
    pub state: String,
    /// The auction.
    pub auction: u64,
}

/// Q4's and Q4*'s output: a category's running average closing price after one more auction.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CategoryAverage {
    /// The category.
    pub key: u64,
    /// Closed auctions of the category so far.
    pub count: u64,
    /// Sum of their closing prices.
    pub sum: u64,
    /// `sum / count`.
    pub average: u64,
    /// The auction that closed.
    pub auction: u64,
    /// Its closing price.
    pub price: u64,
}

/// Q5's output: the auction with the most bids in the sliding window ending at `key`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HotAuction {
    /// The window's end.
    pub key: u64,
    /// The auction (the smallest id among ties).
    pub auction: u64,
    /// Its bids in the window.
    pub count: u64,
}

/// Q6's and Q6*'s output: a seller's average over its last closing prices after one more.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SellerAverage {
    /// The seller.
    pub key: u64,
    /// Closed auctions of the seller so far.
    pub count: u64,
    /// The auction that closed.
    pub auction: u64,
    /// Its closing price.
    pub price: u64,
    /// Average of the seller's last `last_prices` closing prices.
    pub average: u64,
}

/// Q7's output: the highest bid in the tumbling window ending at `key`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HighestBid {
    /// The window's end.
    pub key: u64,
    /// The price.
    pub price: u64,
    /// Its bidder (the smallest among ties).
    pub bidder: u64,
    /// Its auction (the smallest among ties of the bidder).
    pub auction: u64,
}

/// Q8's output: a new person and an auction it opened within `new_user_period_ms`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NewSeller {
    /// The person.
    pub key: u64,
    /// Its name.
    pub name: String,
    /// The auction.
    pub auction: u64,
}

/// Builds one Nexmark query's graph from (validated) parameters.
type Builder = fn(&NexmarkParams) -> Result<JobGraph, DataflowError>;

/// Every Nexmark query: name, what it computes with its operators named, builder.
pub const QUERIES: &[(&str, &str, Builder)] = &[
    ("nexmark-q1", "Nexmark Q1: \"bids\" → \"convert\" (stateless: price × q1_price_factor) → sink", q1),
    ("nexmark-q2", "Nexmark Q2: \"bids\" → \"filter\" (stateless: bids on the q2_auctions) → sink", q2),
    (
        "nexmark-q3",
        "Nexmark Q3: \"events\" (people, auctions) → \"filter\" (stateless: people not in OR, auctions not in category 10) → \"join\" (person by id with auctions by seller; the person and pending auctions as state) → sink",
        q3,
    ),
    (
        "nexmark-q4",
        "Nexmark Q4: \"events\" (auctions, bids) → \"closed_auction\" (per auction: highest bid ≥ reserve before expiry, a timer at `expires`) → \"category\" (running average closing price per category) → sink",
        q4,
    ),
    (
        "nexmark-q5",
        "Nexmark Q5: \"bids\" → \"count\" (bids per auction and sliding window_ms / slide_ms window) → \"hottest\" (the auction with most bids per window) → sink",
        q5,
    ),
    (
        "nexmark-q6",
        "Nexmark Q6: \"events\" (auctions, bids) → \"closed_auction\" (as Q4) → \"seller\" (average of the seller's last `last_prices` closing prices) → sink",
        q6,
    ),
    (
        "nexmark-q7",
        "Nexmark Q7: \"bids\" → \"max_bid\" (highest bid per bidder and tumbling window_ms window) → \"highest\" (highest bid per window) → sink",
        q7,
    ),
    (
        "nexmark-q8",
        "Nexmark Q8: \"events\" (people, auctions) → \"new_users\" (person by id with the auctions it opens within new_user_period_ms of registering, emitted by a timer at the period's end) → sink",
        q8,
    ),
    (
        "nexmark-q4star",
        "Nexmark Q4* (paper §5): \"closed_auctions\" (pre-joined closed auctions) → \"category\" (running average per category, state padded by state_padding_bytes) → sink",
        q4_star,
    ),
    (
        "nexmark-q6star",
        "Nexmark Q6* (paper §5, its microbenchmark): \"closed_auctions\" (pre-joined closed auctions) → \"seller\" (average of the last `last_prices` closing prices per seller, state padded by state_padding_bytes) → sink",
        q6_star,
    ),
];

/// Builds the Nexmark query `name`, or `None` if no Nexmark query has that name.
///
/// With `input = "kafka"` a query builds only with the Kafka sources given in
/// [`NexmarkParams::kafka_source`].
pub fn build(name: &str, params: &NexmarkParams) -> Option<Result<JobGraph, String>> {
    let (_, _, builder) = QUERIES.iter().find(|(n, _, _)| *n == name)?;
    if params.input == NexmarkInput::Kafka && params.kafka_source.0.is_none() {
        return Some(Err(format!(
            "input = \"kafka\": {name}'s Kafka source is built by koala-connectors from [params.kafka] (koala run does this); this caller gave none"
        )));
    }
    Some(params.validate().and_then(|()| builder(params).map_err(|e| e.to_string())))
}

/// The generator's events of one source task that `pick` keeps, as `T`.
struct Picked<T> {
    generator: Option<NexmarkGenerator>,
    seq: u64,
    pick: fn(Event) -> Option<T>,
}

impl<T> Generator<T> for Picked<T> {
    fn next(&mut self) -> Option<(T, u64)> {
        loop {
            let event = self.generator.as_ref()?.event(self.seq)?;
            self.seq += 1;
            let time = event.date_time();
            if let Some(t) = (self.pick)(event) {
                return Some((t, time));
            }
        }
    }
}

/// A source `name` of the generator's events that `pick` keeps; task `i` of `n` generates
/// producer `i`'s share of the sequence. With `input = "kafka"`, the Kafka source of `stream`
/// instead (its records are what `pick` keeps of the same events).
fn source<T: Data>(
    df: &Dataflow,
    name: &str,
    p: &NexmarkParams,
    stream: KafkaStream,
    pick: fn(Event) -> Option<T>,
) -> Stream<T> {
    if let (NexmarkInput::Kafka, Some(kafka)) = (p.input, &p.kafka_source.0) {
        return df.source_from(name, p.source.clone(), kafka(stream));
    }
    let config = p.nexmark.clone();
    df.source(name, p.source.clone(), move |task: TaskInstance| {
        let share = config.for_producer(task.index, task.parallelism.max(1));
        // The config was validated for one producer; should the split be refused, the task says
        // so and produces nothing rather than bringing its worker down.
        let generator =
            NexmarkGenerator::new(share).map_err(|e| tracing_free_log(task.index, &e.to_string())).ok();
        Picked { generator, seq: 0, pick }
    })
}

/// Reports a refused generator share on standard error (this crate has no logger).
fn tracing_free_log(task: u32, error: &str) {
    eprintln!("nexmark source task {task}: generator refused its share: {error}");
}

/// The bid queries' source "bids".
fn bids(df: &Dataflow, p: &NexmarkParams) -> Stream<Bid> {
    source(df, "bids", p, KafkaStream::Bids, bid)
}

fn bid(e: Event) -> Option<Bid> {
    if let Event::Bid(b) = e { Some(b) } else { None }
}

/// People and auctions (Q3, Q8).
fn person_or_auction(e: Event) -> Option<Event> {
    matches!(e, Event::Person(_) | Event::Auction(_)).then_some(e)
}

/// Auctions and bids (Q4, Q6).
fn auction_or_bid(e: Event) -> Option<Event> {
    matches!(e, Event::Auction(_) | Event::Bid(_)).then_some(e)
}

/// The pre-joined closed auction of every auction event (Q4*, Q6*).
fn closed(e: Event) -> Option<ClosedAuction> {
    if let Event::Auction(a) = e { Some(closed_auction_of(&a)) } else { None }
}

/// The sink "sink" of the configured kind.
fn sink<T: Data>(stream: &Stream<T>, kind: SinkKind) {
    match kind {
        SinkKind::Jsonl => stream.sink_json_lines("sink"),
        SinkKind::Stdout => stream.sink_stdout("sink"),
        SinkKind::Discard => stream.sink_discard("sink"),
    }
}

/// Q1: "bids" → "convert" → sink.
fn q1(p: &NexmarkParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let factor = p.q1_price_factor;
    let converted = bids(&df, p).map("convert", move |b: Bid| ConvertedBid {
        key: b.auction,
        bidder: b.bidder,
        price: (b.price as f64 * factor).round() as u64,
        date_time: b.date_time,
    });
    sink(&converted, p.sink);
    df.build()
}

/// Q2: "bids" → "filter" → sink.
fn q2(p: &NexmarkParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let auctions = p.q2_auctions.clone();
    let kept = bids(&df, p).flat_map("filter", move |b: Bid| {
        auctions.contains(&b.auction).then_some(AuctionBid { key: b.auction, price: b.price })
    });
    sink(&kept, p.sink);
    df.build()
}

/// Q3's person state: what the output needs, padded.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SellerInfo {
    name: String,
    city: String,
    state: String,
    padding: String,
}

/// The person id a Q3 / Q8 event is keyed by: the person's id, or the auction's seller.
fn person_key(e: &Event) -> u64 {
    match e {
        Event::Person(p) => p.id,
        Event::Auction(a) => a.seller,
        Event::Bid(b) => b.bidder,
    }
}

/// Q3: "events" → "filter" → "join" → sink. A person is kept for good (the paper inverts the
/// standard predicates so that state grows); an auction that arrives before its seller waits in
/// the seller's list, cleared when the seller arrives.
fn q3(p: &NexmarkParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let padding = "x".repeat(p.state_padding_bytes);
    let joined = source(&df, "events", p, KafkaStream::PeopleAndAuctions, person_or_auction)
        .filter("filter", |e: &Event| match e {
            Event::Person(p) => p.state != "OR",
            Event::Auction(a) => a.category != 10,
            Event::Bid(_) => false,
        })
        .key_by(person_key)
        .stateful_flat_map2(
            "join",
            move |seller: &u64,
                  e: Event,
                  person: &mut ValueState<SellerInfo>,
                  pending: &mut ListState<u64>,
                  out: &mut Vec<SellerAuction>| {
                let row = |s: &SellerInfo, auction| SellerAuction {
                    key: *seller,
                    name: s.name.clone(),
                    city: s.city.clone(),
                    state: s.state.clone(),
                    auction,
                };
                match e {
                    Event::Person(Person { name, city, state, .. }) => {
                        let info = SellerInfo { name, city, state, padding: padding.clone() };
                        out.extend(pending.items().iter().map(|a| row(&info, *a)));
                        pending.clear();
                        person.set(info);
                    }
                    Event::Auction(Auction { id, .. }) => match person.get() {
                        Some(info) => out.push(row(info, id)),
                        None => pending.push(id),
                    },
                    Event::Bid(_) => {}
                }
            },
        );
    sink(&joined, p.sink);
    df.build()
}

/// "closed_auction" over "events": Q4's and Q6's first stage.
fn closed_auctions(df: &Dataflow, p: &NexmarkParams) -> Stream<ClosedAuction> {
    source(df, "events", p, KafkaStream::AuctionsAndBids, auction_or_bid)
        .key_by(|e: &Event| match e {
            Event::Auction(a) => a.id,
            Event::Bid(b) => b.auction,
            Event::Person(person) => person.id,
        })
        .process_with_timers(
            "closed_auction",
            |_: &u64, e: Event, c: &mut KeyContext<AuctionClosing, (u64, u64)>, out: &mut Vec<_>| {
                close_auctions::on_event(e, c, out)
            },
            |_: &u64, time, c: &mut KeyContext<AuctionClosing, (u64, u64)>, out: &mut Vec<_>| {
                close_auctions::on_timer(time, c, out)
            },
        )
}

/// A category's running count and sum, padded.
type CategoryState = (u64, u64, String);

/// "category": the running average closing price per category (Q4, Q4*).
fn category_averages(closed: &Stream<ClosedAuction>, padding: usize) -> Stream<CategoryAverage> {
    closed.key_by(|c: &ClosedAuction| c.category).stateful_map(
        "category",
        move |category: &u64, c: ClosedAuction, state: &mut ValueState<CategoryState>| {
            let (count, sum) = state.update(|(count, sum, pad)| {
                if pad.len() != padding {
                    *pad = "x".repeat(padding);
                }
                *count += 1;
                *sum = sum.wrapping_add(c.price);
                (*count, *sum)
            });
            CategoryAverage {
                key: *category,
                count,
                sum,
                average: sum / count,
                auction: c.auction,
                price: c.price,
            }
        },
    )
}

/// A seller's closed auctions so far, its last closing prices, padding.
type SellerState = (u64, Vec<u64>, String);

/// "seller": the average of each seller's last `n` closing prices (Q6, Q6*).
fn seller_averages(closed: &Stream<ClosedAuction>, n: usize, padding: usize) -> Stream<SellerAverage> {
    closed.key_by(|c: &ClosedAuction| c.seller).stateful_map(
        "seller",
        move |seller: &u64, c: ClosedAuction, state: &mut ValueState<SellerState>| {
            state.update(|(count, prices, pad)| {
                if pad.len() != padding {
                    *pad = "x".repeat(padding); // created on first sight, as the paper's Q6*
                }
                *count += 1;
                prices.push(c.price);
                if prices.len() > n {
                    prices.remove(0);
                }
                let average = prices.iter().sum::<u64>() / prices.len() as u64;
                SellerAverage { key: *seller, count: *count, auction: c.auction, price: c.price, average }
            })
        },
    )
}

/// Q4: "events" → "closed_auction" → "category" → sink.
fn q4(p: &NexmarkParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    sink(&category_averages(&closed_auctions(&df, p), p.state_padding_bytes), p.sink);
    df.build()
}

/// Q6: "events" → "closed_auction" → "seller" → sink.
fn q6(p: &NexmarkParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    sink(&seller_averages(&closed_auctions(&df, p), p.last_prices, p.state_padding_bytes), p.sink);
    df.build()
}

/// Q4*: "closed_auctions" → "category" → sink.
fn q4_star(p: &NexmarkParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let closed = source(&df, "closed_auctions", p, KafkaStream::ClosedAuctions, closed);
    sink(&category_averages(&closed, p.state_padding_bytes), p.sink);
    df.build()
}

/// Q6*: "closed_auctions" → "seller" → sink.
fn q6_star(p: &NexmarkParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let closed = source(&df, "closed_auctions", p, KafkaStream::ClosedAuctions, closed);
    sink(&seller_averages(&closed, p.last_prices, p.state_padding_bytes), p.sink);
    df.build()
}

/// The larger of two (value, tie-break) candidates: the higher value, then the smaller id.
fn better<T: Ord + Copy>(a: (u64, T), b: (u64, T)) -> (u64, T) {
    if b.0 > a.0 || (b.0 == a.0 && b.1 < a.1) { b } else { a }
}

/// Q5: "bids" → "count" (sliding) → "hottest" (tumbling of the slide, keyed by window end) → sink.
fn q5(p: &NexmarkParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let counts = bids(&df, p)
        .key_by(|b: &Bid| b.auction)
        .window(WindowSpec::sliding(p.window_ms, p.slide_ms))
        .aggregate(
            "count",
            || 0u64,
            |n: &mut u64, _b: &Bid| *n += 1,
            |auction: &u64, w: Window, n: u64| (w.end, *auction, n),
        );
    let hottest = hottest_per_window(&counts.key_by(|(end, _, _): &(u64, u64, u64)| *end), p.slide_ms);
    sink(&hottest, p.sink);
    df.build()
}

/// "hottest": per window end, the auction with most bids (first-stage results carry event time
/// `end - 1`, so each lands in the tumbling window of the slide that ends at `end`).
fn hottest_per_window(counts: &KeyedStream<u64, (u64, u64, u64)>, slide_ms: u64) -> Stream<HotAuction> {
    counts.window(WindowSpec::tumbling(slide_ms)).aggregate(
        "hottest",
        || None::<(u64, std::cmp::Reverse<u64>)>,
        |best: &mut Option<(u64, std::cmp::Reverse<u64>)>, (_, auction, n): &(u64, u64, u64)| {
            let candidate = (*n, std::cmp::Reverse(*auction));
            *best = Some(best.map_or(candidate, |b| b.max(candidate)));
        },
        |end: &u64, _w: Window, best: Option<(u64, std::cmp::Reverse<u64>)>| {
            let (count, std::cmp::Reverse(auction)) = best.unwrap_or((0, std::cmp::Reverse(0)));
            HotAuction { key: *end, auction, count }
        },
    )
}

/// Q7: "bids" → "max_bid" (per bidder, tumbling) → "highest" (per window) → sink.
fn q7(p: &NexmarkParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let spec = WindowSpec::tumbling(p.window_ms);
    let per_bidder = bids(&df, p).key_by(|b: &Bid| b.bidder).window(spec).aggregate(
        "max_bid",
        || None::<(u64, u64)>,
        |best: &mut Option<(u64, u64)>, b: &Bid| {
            *best = Some(best.map_or((b.price, b.auction), |x| better(x, (b.price, b.auction))));
        },
        |bidder: &u64, w: Window, best: Option<(u64, u64)>| {
            let (price, auction) = best.unwrap_or_default();
            (w.end, price, *bidder, auction)
        },
    );
    let highest = per_bidder.key_by(|(end, ..): &(u64, u64, u64, u64)| *end).window(spec).aggregate(
        "highest",
        || None::<(u64, (u64, u64))>,
        |best: &mut Option<(u64, (u64, u64))>, (_, price, bidder, auction): &(u64, u64, u64, u64)| {
            let candidate = (*price, (*bidder, *auction));
            *best = Some(best.map_or(candidate, |b| better(b, candidate)));
        },
        |end: &u64, _w: Window, best: Option<(u64, (u64, u64))>| {
            let (price, (bidder, auction)) = best.unwrap_or_default();
            HighestBid { key: *end, price, bidder, auction }
        },
    );
    sink(&highest, p.sink);
    df.build()
}

/// Q8: "events" → "new_users" → sink.
fn q8(p: &NexmarkParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let period = p.new_user_period_ms;
    let out = source(&df, "events", p, KafkaStream::PeopleAndAuctions, person_or_auction)
        .key_by(person_key)
        .process_with_timers(
            "new_users",
            move |_person: &u64,
                  e: Event,
                  c: &mut KeyContext<NewUserState, (u64, u64)>,
                  out: &mut Vec<NewSeller>| { new_users::on_event(e, period, c, out) },
            move |person: &u64,
                  time,
                  c: &mut KeyContext<NewUserState, (u64, u64)>,
                  out: &mut Vec<NewSeller>| {
                new_users::on_timer(*person, time, period, c, out)
            },
        );
    sink(&out, p.sink);
    df.build()
}
