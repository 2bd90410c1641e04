use serde::{Serialize, de::DeserializeOwned};

/// A value could not be encoded or decoded with the project's binary codec.
#[derive(Debug, thiserror::Error)]
#[error("codec error: {0}")]
pub struct CodecError(#[from] postcard::Error);

/// Encodes a value with the project's one binary codec (postcard). Deterministic: equal values give
/// equal bytes, which is why keys hash over their encoding.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    Ok(postcard::to_allocvec(value)?)
}

/// Decodes bytes produced by [`encode`].
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    Ok(postcard::from_bytes(bytes)?)
}
