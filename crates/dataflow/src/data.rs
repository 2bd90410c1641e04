//! What a stream may carry: the one bound every operator, source and stream puts on its
//! element types.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// What a stream may carry: any serde type that can cross threads. Blanket-implemented.
pub trait Data: Serialize + DeserializeOwned + Send + Sync + 'static {}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> Data for T {}
