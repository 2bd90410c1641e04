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

/// [`encode`], appended to `buf` (its allocation reused: a caller that clears and refills one
/// buffer allocates nothing per value). On an error `buf` is left empty.
///
/// ```
/// let mut buf = Vec::with_capacity(16);
/// koala_types::encode_into(&7u32, &mut buf).expect("encodes");
/// assert_eq!(buf, koala_types::encode(&7u32).expect("encodes"));
/// ```
pub fn encode_into<T: Serialize + ?Sized>(value: &T, buf: &mut Vec<u8>) -> Result<(), CodecError> {
    *buf = postcard::to_extend(value, std::mem::take(buf))?;
    Ok(())
}

/// Decodes bytes produced by [`encode`].
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    Ok(postcard::from_bytes(bytes)?)
}
