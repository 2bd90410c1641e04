//! The wire types a worker reads from its peers that are private to the runtime, exposed for
//! the fuzz targets (`fuzz/`, docs/testing.md) behind the `fuzzing` feature: the first frame of
//! a data connection and the protocols' peer-lane messages. Nothing else enables the feature.

pub use crate::channel::ChannelHello;
pub use crate::task::{DrrsWire, KoalaWire};
