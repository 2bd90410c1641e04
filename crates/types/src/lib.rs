//! Vocabulary shared by every koala-rs crate (docs/architecture.md §1): ids, the record, the one
//! binary codec, bucket hashing, the in-band channel messages and the block of a split block Bloom
//! filter. Nothing here does I/O but the connections every koala process opens and accepts: the
//! handshake and TLS (`handshake`, `tls`).

pub mod bloom;
mod bucket;
mod codec;
pub mod frame;
pub mod handshake;
mod ids;
mod key_hash;
mod message;
pub mod metric;
mod position;
pub mod tls;

pub use bucket::{BucketId, DEFAULT_NUM_BUCKETS, bucket_of, bucket_of_hash, placement_hash};
pub use codec::{CodecError, decode, encode, encode_into};
pub use ids::{
    CheckpointId, Epoch, InputChannel, OperatorId, PROCESSING_TIME, TaskId, TimeDomain, Timestamp, WorkerId,
    name_operators,
};
pub use key_hash::{KeyHashBuilder, KeyHashMap, KeyHasher};
pub use message::{ChannelMessage, Record, StateEntry};
pub use position::{PartitionOffset, SourcePosition};
