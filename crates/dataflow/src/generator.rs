//! Generators: the typed, in-process sources of a job. A [`Generator`] yields `(value, event
//! time)` pairs; [`GeneratorSource`] adapts it to the runtime's byte-level
//! [`SourceLogic`](crate::logic::SourceLogic). Any `Iterator<Item = (T, Timestamp)>` is a
//! generator.

use std::marker::PhantomData;

use koala_types::{Record, Timestamp, encode};

use crate::data::Data;
use crate::logic::{DataflowError, SourceLogic, SourcePoll};

/// Produces the values of one source task with their event times, in emission order.
///
/// ```
/// use koala_dataflow::Generator;
///
/// struct Countdown(u64);
/// impl Generator<u64> for Countdown {
///     fn next(&mut self) -> Option<(u64, u64)> {
///         self.0 = self.0.checked_sub(1)?;
///         Some((self.0, 0))
///     }
/// }
/// let mut g = Countdown(2);
/// assert_eq!(g.next(), Some((1, 0)));
/// assert_eq!(g.next(), Some((0, 0)));
/// assert_eq!(g.next(), None);
/// ```
pub trait Generator<T>: Send {
    /// The next value and its event time, or `None` when the generator is exhausted.
    fn next(&mut self) -> Option<(T, Timestamp)>;
}

impl<T, I> Generator<T> for I
where
    I: Iterator<Item = (T, Timestamp)> + Send,
{
    fn next(&mut self) -> Option<(T, Timestamp)> {
        Iterator::next(self)
    }
}

/// A source task running a generator: encodes each value into an unkeyed record.
pub struct GeneratorSource<T, G> {
    generator: G,
    finished: bool,
    _type: PhantomData<fn() -> T>,
}

impl<T, G> GeneratorSource<T, G> {
    /// Wraps `generator`.
    pub fn new(generator: G) -> Self {
        Self { generator, finished: false, _type: PhantomData }
    }
}

impl<T: Data, G: Generator<T>> SourceLogic for GeneratorSource<T, G> {
    /// Appends up to `max` records; returns [`SourcePoll::Finished`] (with the records appended so
    /// far) once the generator is exhausted, and on every later call.
    fn poll(&mut self, max: usize, out: &mut Vec<Record>) -> Result<SourcePoll, DataflowError> {
        if self.finished {
            return Ok(SourcePoll::Finished);
        }
        for _ in 0..max {
            let Some((value, time)) = self.generator.next() else {
                self.finished = true;
                return Ok(SourcePoll::Finished);
            };
            out.push(Record { key: Vec::new(), value: encode(&value)?, time, due_ms: 0 });
        }
        Ok(SourcePoll::More)
    }
}

/// The splitmix64 mixing function: a fast, well-distributed bijection on `u64`, used by the
/// built-in generators so every generated value is a pure function of its inputs.
///
/// ```
/// assert_ne!(koala_dataflow::splitmix64(1), koala_dataflow::splitmix64(2));
/// ```
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_reports_finished_with_its_last_records() -> Result<(), DataflowError> {
        let mut source = GeneratorSource::new((0..3u32).map(|x| (x, u64::from(x))));
        let mut out = Vec::new();
        assert_eq!(source.poll(2, &mut out)?, SourcePoll::More);
        assert_eq!(source.poll(2, &mut out)?, SourcePoll::Finished);
        assert_eq!(out.len(), 3);
        assert_eq!(source.poll(2, &mut out)?, SourcePoll::Finished);
        assert!(out.iter().all(|r| r.key.is_empty()));
        Ok(())
    }
}
