//! Typed per-key state handed to keyed operators: [`ValueState`] (one value) and [`ListState`]
//! (an ordered list). Both wrap the byte-level [`KeyedStateAccess`] of the runtime
//! (docs/architecture.md §5): they are decoded once per key and batch, and written back at the
//! end of the batch only if the operator changed them.

use koala_types::{decode, encode_into};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::logic::{DataflowError, KeyedStateAccess, StateId};

/// State id of the value state of keyed operators.
pub const VALUE_STATE: StateId = 0;
/// State id of the list state of keyed operators.
pub const LIST_STATE: StateId = 1;

/// One value per key, e.g. a running count.
///
/// ```
/// use koala_dataflow::ValueState;
///
/// let mut state = ValueState::<u64>::new(None);
/// assert_eq!(state.get(), None);
/// assert_eq!(state.update(|n| { *n += 5; *n }), 5);
/// state.set(7);
/// assert_eq!(state.get(), Some(&7));
/// state.clear();
/// assert_eq!(state.take(), None);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ValueState<S> {
    value: Option<S>,
    dirty: bool,
}

impl<S> ValueState<S> {
    /// A state holding `value`, unchanged so far (for testing operator closures directly).
    pub fn new(value: Option<S>) -> Self {
        Self { value, dirty: false }
    }

    /// The current value, if any.
    pub fn get(&self) -> Option<&S> {
        self.value.as_ref()
    }

    /// Replaces the value.
    pub fn set(&mut self, value: S) {
        self.value = Some(value);
        self.dirty = true;
    }

    /// Removes the value (the key's state is deleted at the end of the batch).
    pub fn clear(&mut self) {
        if self.value.is_some() {
            self.value = None;
            self.dirty = true;
        }
    }

    /// Removes and returns the value.
    pub fn take(&mut self) -> Option<S> {
        let value = self.value.take();
        self.dirty |= value.is_some();
        value
    }

    /// Changes the value in place, starting from `S::default()` if there is none, and returns
    /// what `f` returns.
    pub fn update<R>(&mut self, f: impl FnOnce(&mut S) -> R) -> R
    where
        S: Default,
    {
        self.dirty = true;
        f(self.value.get_or_insert_with(S::default))
    }

    /// The value for in-place changes, `S::default()` first if there is none.
    pub fn get_or_insert_default(&mut self) -> &mut S
    where
        S: Default,
    {
        self.dirty = true;
        self.value.get_or_insert_with(S::default)
    }

    /// Whether the value changed since it was loaded.
    pub fn is_changed(&self) -> bool {
        self.dirty
    }
}

impl<S: Serialize + DeserializeOwned> ValueState<S> {
    /// Loads the state `id` of `key`.
    pub(crate) fn load(state: &dyn KeyedStateAccess, id: StateId, key: &[u8]) -> Result<Self, DataflowError> {
        let value = state.get(id, key)?.map(decode).transpose()?;
        Ok(Self::new(value))
    }

    /// Writes the state back if it changed: a put, or a delete when it was cleared.
    pub(crate) fn store(
        &self,
        state: &mut dyn KeyedStateAccess,
        id: StateId,
        key: &[u8],
    ) -> Result<(), DataflowError> {
        match (&self.value, self.dirty) {
            (_, false) => Ok(()),
            (Some(value), true) => state.put_encoded(id, key, &mut |buf| encode_into(value, buf)),
            (None, true) => state.delete(id, key),
        }
    }
}

/// An ordered list per key, e.g. the last N values or one side of a join.
///
/// Stored as one encoded `Vec<L>` under the key (read and rewritten whole when changed): simple,
/// and cheap for the short lists operators keep; a list that grows without bound (an unwindowed
/// join side) costs O(length) per changed batch.
///
/// ```
/// use koala_dataflow::ListState;
///
/// let mut list = ListState::<i32>::new(vec![1, 2]);
/// list.push(3);
/// list.truncate_front(2); // keep the last two
/// assert_eq!(list.items(), &[2, 3]);
/// list.clear();
/// assert!(list.is_empty());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ListState<L> {
    items: Vec<L>,
    dirty: bool,
}

impl<L> ListState<L> {
    /// A list holding `items`, unchanged so far (for testing operator closures directly).
    pub fn new(items: Vec<L>) -> Self {
        Self { items, dirty: false }
    }

    /// The items, oldest first.
    pub fn items(&self) -> &[L] {
        &self.items
    }

    /// Appends an item.
    pub fn push(&mut self, item: L) {
        self.items.push(item);
        self.dirty = true;
    }

    /// Removes items from the front until at most `len` remain (keeps the newest `len`).
    pub fn truncate_front(&mut self, len: usize) {
        if self.items.len() > len {
            let excess = self.items.len() - len;
            self.items.drain(..excess);
            self.dirty = true;
        }
    }

    /// Removes every item (the key's list is deleted at the end of the batch).
    pub fn clear(&mut self) {
        if !self.items.is_empty() {
            self.items.clear();
            self.dirty = true;
        }
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the list has no items.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Whether the list changed since it was loaded.
    pub fn is_changed(&self) -> bool {
        self.dirty
    }
}

impl<L: Serialize + DeserializeOwned> ListState<L> {
    /// Loads the list `id` of `key` (empty if it has none).
    pub(crate) fn load(state: &dyn KeyedStateAccess, id: StateId, key: &[u8]) -> Result<Self, DataflowError> {
        let items = state.get(id, key)?.map(decode).transpose()?;
        Ok(Self::new(items.unwrap_or_default()))
    }

    /// Writes the list back if it changed; an empty list is deleted.
    pub(crate) fn store(
        &self,
        state: &mut dyn KeyedStateAccess,
        id: StateId,
        key: &[u8],
    ) -> Result<(), DataflowError> {
        if !self.dirty {
            Ok(())
        } else if self.items.is_empty() {
            state.delete(id, key)
        } else {
            state.put_encoded(id, key, &mut |buf| encode_into(&self.items, buf))
        }
    }
}

/// The decoded state of the keys of one batch, each loaded on first use, written back at the end.
/// Borrows the keys from the batch's records: a lookup hashes once and allocates nothing.
pub(crate) struct BatchStates<'k, E> {
    entries: koala_types::KeyHashMap<&'k [u8], E>,
}

impl<'k, E> BatchStates<'k, E> {
    /// Room for `keys` distinct keys without rehashing.
    pub(crate) fn with_capacity(keys: usize) -> Self {
        Self { entries: koala_types::KeyHashMap::with_capacity_and_hasher(keys, Default::default()) }
    }

    /// The entry of `key`, loaded with `load` the first time the batch touches the key.
    pub(crate) fn entry(
        &mut self,
        key: &'k [u8],
        load: impl FnOnce() -> Result<E, DataflowError>,
    ) -> Result<&mut E, DataflowError> {
        Ok(match self.entries.entry(key) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => entry.insert(load()?),
        })
    }

    /// Every touched key with its entry, for write-back.
    pub(crate) fn into_entries(self) -> impl Iterator<Item = (&'k [u8], E)> {
        self.entries.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unchanged_state_is_not_dirty() {
        let mut v = ValueState::new(Some(3u8));
        assert_eq!(v.get(), Some(&3));
        assert!(!v.is_changed());
        let mut l = ListState::new(vec![1u8]);
        l.truncate_front(5);
        assert!(!l.is_changed());
        v.clear();
        assert!(v.is_changed());
    }

    #[test]
    fn truncate_front_keeps_the_newest() {
        let mut l = ListState::new((0..10).collect::<Vec<u32>>());
        l.truncate_front(3);
        assert_eq!(l.items(), &[7, 8, 9]);
        l.truncate_front(0);
        assert!(l.is_empty());
    }
}
