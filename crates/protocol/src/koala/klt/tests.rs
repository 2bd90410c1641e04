//! Unit tests of the key lookup table: hand-over chains, filters, entries, the local-first memo
//! and batch lookups.

use super::*;
use crate::koala::key_hash::key_hash;
use koala_types::OperatorId;

fn t(i: u32) -> TaskId {
    TaskId::new(OperatorId(1), i)
}

fn cands(table: &KeyLookupTable, bucket: BucketId, key: &[u8]) -> Vec<TaskId> {
    let mut out = Vec::new();
    table.candidates(bucket, key_hash(key), &mut out).expect("owned");
    out
}

#[test]
fn hand_over_chain_keeps_one_hop_and_filters_settle_new_keys() {
    // Fig. 5: d1 owns everything; bucket 1 moves to d2; d2 fetches "2"; then 1 moves d2 -> d3.
    let mut d1 = KeyLookupTable::new(t(1), [0, 1]);
    let mut d2 = KeyLookupTable::new(t(2), []);
    let mut d3 = KeyLookupTable::new(t(3), []);
    let pending = d2.install(d1.take(&[1], 1)).expect("install");
    assert_eq!(pending, vec![PendingFilter { location: t(1), bucket: 1, since: 1 }]);
    assert!(!d1.owns(1));
    assert_eq!(cands(&d2, 1, b"2"), vec![t(1)], "no filter yet: any key may be at d1");
    // d1 held "2" and "3" when it built its filter; "new" was never there.
    let f1 = KeyFilter::build(vec![key_hash(b"2"), key_hash(b"3")]);
    assert!(d2.filter_arrived(t(1), 1, 1, f1.clone()));
    assert!(!d2.filter_arrived(t(1), 1, 1, f1), "a second copy is not installed");
    assert_eq!(cands(&d2, 1, b"3"), vec![t(1)]);
    assert!(cands(&d2, 1, b"new").is_empty(), "outside the filter: new, no round trip");
    // "2" was fetched (d2's store answers first); d2 hands over to d3 before its filter exists.
    let pending = d3.install(d2.take(&[1], 2)).expect("install");
    assert_eq!(pending, vec![PendingFilter { location: t(2), bucket: 1, since: 2 }]);
    assert_eq!(cands(&d3, 1, b"3"), vec![t(2), t(1)], "one round, both asked");
    assert_eq!(cands(&d3, 1, b"new"), vec![t(2)]);
    assert!(d3.filter_arrived(t(2), 1, 2, KeyFilter::build(vec![key_hash(b"2"), key_hash(b"new")])));
    assert_eq!(cands(&d3, 1, b"3"), vec![t(1)], "one hop: still points at d1");
    assert_eq!(cands(&d3, 1, b"2"), vec![t(2), t(1)]);
    assert_eq!(d3.buckets_at(t(1)), vec![1]);
    d3.exhausted(1, t(1));
    assert!(cands(&d3, 1, b"3").is_empty());
    assert_eq!(cands(&d3, 1, b"2"), vec![t(2)]);
    d3.exhausted(1, t(2));
    assert!(d3.is_settled(1));
    assert_eq!(d3.entries(), 0);
    assert!(!d3.references(t(2)));
}

/// A key every candidate answered "not here" for is local from then on, also at the next
/// owner, and the entry goes once the filters answer as well.
#[test]
fn misses_become_entries_until_filters_answer() {
    let mut d1 = KeyLookupTable::new(t(1), [1]);
    let mut d2 = KeyLookupTable::new(t(2), []);
    let mut d3 = KeyLookupTable::new(t(3), []);
    d2.install(d1.take(&[1], 1)).expect("install");
    d2.mark_local(1, key_hash(b"k"));
    assert_eq!(d2.entries(), 1, "d1's filter is not there yet");
    assert!(cands(&d2, 1, b"k").is_empty());
    d3.install(d2.take(&[1], 2)).expect("install");
    assert_eq!(cands(&d3, 1, b"k"), vec![t(2)], "here or nowhere at d2");
    assert!(d3.filter_arrived(t(1), 1, 1, KeyFilter::build(vec![key_hash(b"x")])));
    assert!(d3.filter_arrived(t(2), 1, 2, KeyFilter::build(vec![])));
    assert_eq!(d3.entries(), 1, "an entry naming another task stays");
    // Back to d1, which drops its own layer: its store answers first.
    let pending = d1.install(d3.take(&[1], 3)).expect("install");
    assert_eq!(pending, vec![PendingFilter { location: t(3), bucket: 1, since: 3 }]);
    assert_eq!(cands(&d1, 1, b"k"), vec![t(2)]);
    assert_eq!(cands(&d1, 1, b"x"), vec![t(3)], "d1's own layer is gone");
    assert!(d1.filter_arrived(t(3), 1, 3, KeyFilter::build(vec![])));
    d1.exhausted(1, t(2));
    assert!(!d1.is_settled(1));
    d1.exhausted(1, t(3));
    assert!(d1.is_settled(1));
    assert_eq!(d1.entries(), 0);
    // With every filter there, a false positive costs a round trip but no entry.
    let mut d4 = KeyLookupTable::new(t(4), []);
    d4.install(d1.take(&[1], 4)).expect("install");
    assert!(d4.filter_arrived(t(1), 1, 4, KeyFilter::build(vec![key_hash(b"k")])));
    d4.mark_local(1, key_hash(b"k"));
    assert_eq!(d4.entries(), 0);
}

/// Within an event the memo answers for every key noted (a fetched key is local before the
/// runtime installs it), however many; between events it goes back to its bound, room
/// included, so the next batches do not probe a table sized for the fullest event.
#[test]
fn the_memo_holds_an_event_then_shrinks_back() {
    let mut d1 = KeyLookupTable::new(t(1), [1]);
    let mut d2 = KeyLookupTable::new(t(2), []);
    d2.install(d1.take(&[1], 1)).expect("install");
    let bound = d2.approx_bytes();
    let hashes: Vec<u64> = (0..20 * LOCAL_MEMO_MAX as u64).map(|i| key_hash(&i.to_le_bytes())).collect();
    for &h in &hashes {
        d2.note_local(1, h);
    }
    assert!(hashes.iter().all(|&h| d2.known_local(h)), "every key noted in the event");
    let mut batch = BatchLookup::default();
    for &h in hashes.iter().take(64) {
        batch.push(1, h);
    }
    d2.lookup_batch(&mut batch);
    assert_eq!(batch.named().count(), 0, "the filter is still to come, the memo answers");
    assert!(d2.approx_bytes() > 10 * bound);
    d2.trim_memo();
    assert!(!d2.known_local(hashes[0]));
    assert!(d2.approx_bytes() <= 2 * bound, "{} bytes after the trim, {bound} before", d2.approx_bytes());
    d2.lookup_batch(&mut batch);
    assert_eq!(batch.named().count(), 64, "unknown again: every key may be at the old location");
}

/// The common shapes are held inline (see [`Slot`]), and every change goes back and forth
/// between the forms without changing an answer.
#[test]
fn one_hand_over_with_its_filter_is_held_inline() {
    let mut d1 = KeyLookupTable::new(t(1), [1, 2]);
    let mut d2 = KeyLookupTable::new(t(2), [0]);
    assert!(matches!(d2.slot(0), Slot::Local));
    assert!(matches!(d2.slot(1), Slot::NotOwned));
    d2.install(d1.take(&[1, 2], 1)).expect("install");
    assert!(matches!(d2.slot(1), Slot::Layered(_)), "waiting for its filter");
    d2.mark_local(1, key_hash(b"new"));
    assert!(d2.filter_arrived(t(1), 1, 1, KeyFilter::build(vec![key_hash(b"old")])));
    assert!(d2.filter_arrived(t(1), 2, 1, KeyFilter::build(vec![key_hash(b"old")])));
    assert!(matches!(d2.slot(1), Slot::Filtered { .. }), "the entry went with the last filter");
    assert_eq!(d2.entries(), 0);
    assert_eq!(cands(&d2, 1, b"old"), vec![t(1)]);
    assert!(cands(&d2, 1, b"new").is_empty());
    // The memo answers only for a key the filter names.
    let mut out = Vec::new();
    d2.note_local(1, key_hash(b"old"));
    d2.lookup(1, key_hash(b"old"), &mut out).expect("owned");
    assert!(out.is_empty(), "known local");
    assert_eq!(cands(&d2, 1, b"old"), vec![t(1)], "candidates do not read the memo");
    assert_eq!(d2.buckets_at(t(1)), vec![1, 2]);
    assert_eq!(d2.locations_named(), BTreeSet::from([t(1)]));
    assert_eq!(d2.owned().collect::<Vec<_>>(), vec![0, 1, 2]);
    d2.exhausted(2, t(1));
    assert!(matches!(d2.slot(2), Slot::Local));
    // Handed on, the inline layer travels like any other.
    let mut d3 = KeyLookupTable::new(t(3), []);
    d3.install(d2.take(&[1], 2)).expect("install");
    assert!(!d2.known_local(key_hash(b"old")), "the memo goes with the bucket");
    assert!(matches!(d2.slot(1), Slot::NotOwned));
    assert_eq!(cands(&d3, 1, b"old"), vec![t(2), t(1)]);
    assert!(d3.filter_arrived(t(2), 1, 2, KeyFilter::build(vec![])));
    assert!(matches!(d3.slot(1), Slot::Layered(_)), "two layers");
    d3.exhausted(1, t(2));
    assert!(matches!(d3.slot(1), Slot::Filtered { .. }));
    assert_eq!(cands(&d3, 1, b"old"), vec![t(1)]);
    assert!(d3.lookup(7, 0, &mut out).is_none(), "not owned");
}

/// The batch form answers as key-by-key lookups do, in every shape of bucket: owned
/// outright, one filtered layer (members, strangers, a member known local), a layer waiting
/// for its filter, two layers.
#[test]
fn a_batch_lookup_answers_as_single_lookups() {
    let mut d1 = KeyLookupTable::new(t(1), [1, 2, 3]);
    let mut d2 = KeyLookupTable::new(t(2), [0]);
    d2.install(d1.take(&[1, 2, 3], 1)).expect("install");
    let members: Vec<u64> = (0..100u32).map(|i| key_hash(&i.to_le_bytes())).collect();
    assert!(d2.filter_arrived(t(1), 1, 1, KeyFilter::build(members.clone())));
    assert!(d2.filter_arrived(t(1), 3, 1, KeyFilter::build(members.clone())));
    let mut d3 = KeyLookupTable::new(t(3), []);
    d3.install(d2.take(&[3], 2)).expect("install");
    assert!(d3.filter_arrived(t(2), 3, 2, KeyFilter::build(members[..10].to_vec())));
    d2.note_local(1, members[5]);
    let strangers: Vec<u64> = (1000..1100u32).map(|i| key_hash(&i.to_le_bytes())).collect();
    for table in [&d2, &d3] {
        let mut batch = BatchLookup::default();
        let mut expected = Vec::new();
        for (i, &hash) in members.iter().chain(&strangers).enumerate() {
            let bucket = [0, 1, 2, 3][i % 4];
            if !table.owns(bucket) {
                continue;
            }
            let mut out = Vec::new();
            table.lookup(bucket, hash, &mut out).expect("owned");
            if !out.is_empty() {
                expected.push((batch.keys().len(), out));
            }
            batch.push(bucket, hash);
        }
        table.lookup_batch(&mut batch);
        let got: Vec<(usize, Vec<TaskId>)> = batch.named().map(|(i, l)| (i, l.to_vec())).collect();
        assert_eq!(got, expected);
        assert!(!got.is_empty() && got.len() < batch.keys().len(), "some keys named, not all");
    }
}

#[test]
fn bad_hand_over_is_rejected_whole() {
    let mut a = KeyLookupTable::new(t(1), [3]);
    let mut h = KeyLookupTable::new(t(2), [4]).take(&[4], 1);
    h.buckets.push(BucketLocations { bucket: 3, layers: vec![], keys: vec![] });
    assert!(a.install(h).is_err());
    assert!(!a.owns(4));
    let mut h = KeyLookupTable::new(t(2), [4]).take(&[4], 1);
    h.buckets[0].layers[0].location = 7;
    assert!(a.install(h).is_err());
}

#[test]
fn a_late_or_stale_filter_is_dropped() {
    let mut d1 = KeyLookupTable::new(t(1), [1]);
    let mut d2 = KeyLookupTable::new(t(2), []);
    d2.install(d1.take(&[1], 1)).expect("install");
    assert!(!d2.filter_arrived(t(1), 1, 0, KeyFilter::build(vec![])), "another hand-over's");
    assert!(!d2.filter_arrived(t(3), 1, 1, KeyFilter::build(vec![])), "another location's");
    d1.install(d2.take(&[1], 2)).expect("install");
    assert!(!d2.filter_arrived(t(1), 1, 1, KeyFilter::build(vec![])), "bucket handed on");
}

#[test]
fn bytes_per_entry_at_ten_million_keys() {
    // 10 M keys over 128 buckets, every key with an explicit entry (the worst case).
    let per_bucket = 10_000_000 / 128;
    let mut table = KeyLookupTable::new(t(1), []);
    let mut h = KeyLookupTable::new(t(2), [0]).take(&[0], 1);
    h.locations.push(t(3));
    h.buckets[0].keys = (0..per_bucket as u64).map(|i| (key_hash(&i.to_le_bytes()), 1)).collect();
    table.install(h).expect("install");
    let per_key = table.approx_bytes() as f64 / per_bucket as f64;
    println!("KLT: {per_key:.1} bytes per explicit entry at 10 M keys / 128 buckets");
    assert!((17.0..40.0).contains(&per_key), "{per_key} bytes per key");
    assert_eq!(table.entries(), per_bucket);
}
