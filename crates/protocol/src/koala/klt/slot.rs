//! What the lookup table holds for one bucket, laid out for the lookup path: an inline slot
//! for the common shapes, a table of layers and entries behind a pointer for the rest.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use koala_types::{Epoch, TaskId};

use crate::koala::filter::KeyFilter;
use crate::koala::key_hash::Prehashed;

pub(super) type ExceptionMap = HashMap<u64, u16, BuildHasherDefault<Prehashed>>;

/// A location that may hold state of an owned bucket (see [`Layer`]).
#[derive(Clone, Debug)]
pub(super) struct TableLayer {
    pub(super) location: u16,
    pub(super) since: Epoch,
    pub(super) filter: Option<KeyFilter>,
}

impl TableLayer {
    pub(super) fn may_hold(&self, hash: u64) -> bool {
        self.filter.as_ref().is_none_or(|f| f.contains(hash))
    }
}

/// Locations of the keys of one owned bucket, in the general form (see [`Slot`]).
#[derive(Clone, Debug, Default)]
pub(super) struct BucketTable {
    pub(super) layers: Vec<TableLayer>,
    pub(super) keys: ExceptionMap,
}

impl BucketTable {
    /// The locations to ask for the key with hash `hash` (see [`KeyLookupTable::candidates`]).
    pub(super) fn candidates(&self, hash: u64, locations: &[TaskId], out: &mut Vec<TaskId>) {
        if let Some(&idx) = self.keys.get(&hash) {
            if idx != 0 {
                out.extend(locations.get(usize::from(idx)));
            }
            return;
        }
        for layer in &self.layers {
            if layer.may_hold(hash) {
                out.extend(locations.get(usize::from(layer.location)));
            }
        }
    }
}

/// What the table knows of one bucket, in the form a lookup reads fastest: the table is an
/// array of slots indexed by bucket (buckets are `0..num_buckets`), and the two common shapes —
/// a bucket whose state is all here, and a bucket after one hand-over once its filter arrived —
/// are held inline, so a lookup in them reads the slot and at most one cache line of the
/// filter. Every other shape is a [`BucketTable`] behind a pointer.
/// [`Slot::of`] picks the form; every change of a bucket's layers or entries goes through it.
#[derive(Clone, Debug, Default)]
pub(super) enum Slot {
    /// Not owned.
    #[default]
    NotOwned,
    /// Owned, no layer: every key is local.
    Local,
    /// Owned, one layer whose filter arrived, no explicit entry.
    Filtered { location: u16, since: Epoch, filter: KeyFilter },
    /// Owned, any other shape (a layer waiting for its filter, several layers, entries).
    Layered(Box<BucketTable>),
}

impl Slot {
    /// The form of an owned bucket's table. No layer left: every key is local, entries are moot.
    pub(super) fn of(mut table: BucketTable) -> Self {
        if table.layers.is_empty() {
            return Slot::Local;
        }
        if table.keys.is_empty()
            && let [layer] = table.layers.as_mut_slice()
            && let Some(filter) = layer.filter.take()
        {
            return Slot::Filtered { location: layer.location, since: layer.since, filter };
        }
        Slot::Layered(Box::new(table))
    }

    /// Back in the form [`Slot::of`] picks, after a change of a general table.
    pub(super) fn normalize(&mut self) {
        if let Slot::Layered(table) = self {
            let table = std::mem::take(table.as_mut());
            *self = Slot::of(table);
        }
    }

    /// Whether a layer of the bucket is at location `idx`.
    pub(super) fn names(&self, idx: u16) -> bool {
        match self {
            Slot::NotOwned | Slot::Local => false,
            Slot::Filtered { location, .. } => *location == idx,
            Slot::Layered(t) => t.layers.iter().any(|l| l.location == idx),
        }
    }

    /// The locations of the bucket's layers, newest first.
    pub(super) fn layer_locations(&self) -> impl Iterator<Item = u16> + '_ {
        let (one, many) = match self {
            Slot::NotOwned | Slot::Local => (None, &[][..]),
            Slot::Filtered { location, .. } => (Some(*location), &[][..]),
            Slot::Layered(t) => (None, t.layers.as_slice()),
        };
        one.into_iter().chain(many.iter().map(|l| l.location))
    }
}
