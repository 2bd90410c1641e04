//! The Nexmark auction workload (docs/architecture.md §12): event types, the generator configuration and
//! a deterministic generator shared by `koala produce` (which writes the person / auction / bid
//! topics) and by embedded generator sources.

mod config;
mod generator;
mod model;
mod operators;
mod params;
mod queries;
#[cfg(test)]
mod reference_tests;

pub use config::{NexmarkConfig, NexmarkConfigError};
pub use generator::{
    AUCTION_PROPORTION, BID_PROPORTION, FIRST_AUCTION_ID, FIRST_CATEGORY_ID, FIRST_PERSON_ID,
    NexmarkGenerator, PERSON_PROPORTION, TOTAL_PROPORTION,
};
pub use model::{Auction, Bid, Event, EventKind, Person};
pub use operators::{ClosedAuction, closed_auction_of};
pub use params::{
    ExternalSource, KafkaSourceBuilder, KafkaStream, NexmarkInput, NexmarkKafka, NexmarkParams,
    kafka_stream_of,
};
pub use queries::{
    AuctionBid, CategoryAverage, ConvertedBid, HighestBid, HotAuction, NewSeller, QUERIES, SellerAuction,
    SellerAverage, build,
};

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use super::*;

    fn generator(config: NexmarkConfig) -> NexmarkGenerator {
        NexmarkGenerator::new(config).expect("valid config")
    }

    #[test]
    fn proportions_are_1_3_46() {
        let g = generator(NexmarkConfig { events: Some(5_000), ..Default::default() });
        let mut counts = BTreeMap::new();
        for e in g.events() {
            *counts.entry(e.kind()).or_insert(0u64) += 1;
        }
        assert_eq!(counts[&EventKind::Person], 100);
        assert_eq!(counts[&EventKind::Auction], 300);
        assert_eq!(counts[&EventKind::Bid], 4_600);
    }

    #[test]
    fn producers_split_the_sequence_disjointly() {
        let base = NexmarkConfig { events: Some(1_003), hot_ratio: 0.3, ..Default::default() };
        let single: Vec<Event> = generator(base.clone()).events().collect();
        let mut merged = BTreeMap::new();
        let mut total = 0;
        for i in 0..4 {
            let g = generator(base.for_producer(i, 4));
            let expected = g.events_of_producer().expect("bounded");
            let mut seq = 0;
            while let Some(n) = g.event_number(seq) {
                assert_eq!(n % 4, u64::from(i));
                assert!(merged.insert(n, g.event_at(n)).is_none(), "event {n} generated twice");
                seq += 1;
            }
            assert_eq!(seq, expected);
            total += seq;
        }
        assert_eq!(total, 1_003);
        assert_eq!(merged.into_values().collect::<Vec<_>>(), single);
    }

    #[test]
    fn ids_are_dense_and_references_point_into_the_active_window() {
        let config = NexmarkConfig { events: Some(20_000), active_people: 10, ..Default::default() };
        let g = generator(config);
        let (mut next_person, mut next_auction) = (FIRST_PERSON_ID, FIRST_AUCTION_ID);
        for e in g.events() {
            match e {
                Event::Person(p) => {
                    assert_eq!(p.id, next_person);
                    next_person += 1;
                }
                Event::Auction(a) => {
                    assert_eq!(a.id, next_auction);
                    next_auction += 1;
                    assert!(a.seller < next_person && a.seller + 10 >= next_person);
                    assert!(a.expires >= a.date_time);
                    assert!((FIRST_CATEGORY_ID..FIRST_CATEGORY_ID + 10).contains(&a.category));
                }
                Event::Bid(b) => {
                    assert!(b.auction < next_auction && b.auction >= FIRST_AUCTION_ID);
                    assert!(b.bidder < next_person && b.bidder + 10 >= next_person);
                }
            }
        }
    }

    #[test]
    fn hot_ratio_one_makes_every_seller_the_hot_key_of_its_block() {
        let config =
            NexmarkConfig { events: Some(10_000), hot_ratio: 1.0, hot_range: 50, ..Default::default() };
        for e in generator(config).events() {
            if let Event::Auction(a) = e {
                assert_eq!((a.seller - FIRST_PERSON_ID) % 50, 0);
            }
        }
    }

    #[test]
    fn warmup_emits_a_new_key_per_event() {
        let config = NexmarkConfig { events: Some(2_000), warmup: true, ..Default::default() };
        let mut sellers = HashSet::new();
        let mut bidders = HashSet::new();
        for e in generator(config).events() {
            match e {
                Event::Auction(a) => assert!(sellers.insert(a.seller)),
                Event::Bid(b) => assert!(bidders.insert(b.bidder)),
                Event::Person(_) => {}
            }
        }
        assert_eq!(sellers.len(), 120);
        assert_eq!(bidders.len(), 1_840);
    }

    #[test]
    fn extra_payload_and_event_time_follow_the_config() {
        let config = NexmarkConfig {
            extra_payload_bytes: 64,
            base_time_ms: 5_000,
            inter_event_delay_us: 2_500,
            ..Default::default()
        };
        let g = generator(config);
        let e = g.event_at(10);
        assert_eq!(e.date_time(), 5_025);
        let Event::Bid(b) = e else { panic!("event 10 is a bid") };
        assert_eq!(b.extra.len(), 64);
    }

    #[test]
    fn bad_configs_are_rejected_with_the_field_named() {
        let err = |c: NexmarkConfig| NexmarkGenerator::new(c).expect_err("must be rejected").0;
        assert!(err(NexmarkConfig { hot_ratio: 1.5, ..Default::default() }).contains("hot_ratio"));
        assert!(
            err(NexmarkConfig { producers: 2, producer_index: 2, ..Default::default() })
                .contains("producer_index")
        );
        assert!(err(NexmarkConfig { active_people: 0, ..Default::default() }).contains("active_people"));
        let unknown = serde_json::from_str::<NexmarkConfig>(r#"{"hot_ration": 0.5}"#);
        assert!(unknown.is_err_and(|e| e.to_string().contains("hot_ration")));
        let ok: NexmarkConfig =
            serde_json::from_str(r#"{"hot_ratio": 0.5, "rate": [{"at_ms": 0, "records_per_sec": 10}]}"#)
                .expect("valid json config");
        assert_eq!(ok.hot_ratio, 0.5);
        assert_eq!(ok.active_people, 100);
    }

    /// `kafka_stream_of` names the stream each query's source asks the Kafka builder for.
    #[test]
    fn every_query_reads_from_kafka_the_stream_kafka_stream_of_names() {
        use std::sync::{Arc, Mutex};
        let asked: Arc<Mutex<Vec<KafkaStream>>> = Arc::default();
        let record = asked.clone();
        let builder: KafkaSourceBuilder = Arc::new(move |stream| {
            record.lock().expect("lock").push(stream);
            Arc::new(|_| -> Box<dyn koala_dataflow::SourceLogic> { unreachable!("never deployed") })
        });
        for (name, _, _) in QUERIES {
            let params = NexmarkParams {
                input: NexmarkInput::Kafka,
                kafka_source: ExternalSource(Some(builder.clone())),
                ..Default::default()
            };
            build(name, &params).expect("a nexmark query").expect("builds over kafka");
            let streams = std::mem::take(&mut *asked.lock().expect("lock"));
            assert_eq!(streams, vec![kafka_stream_of(name).expect("a stream")], "{name}");
        }
        let none = NexmarkParams { input: NexmarkInput::Kafka, ..Default::default() };
        let Some(Err(err)) = build("nexmark-q3", &none) else { panic!("q3 built without a kafka source") };
        assert!(err.contains("[params.kafka]"), "{err}");
    }
}
