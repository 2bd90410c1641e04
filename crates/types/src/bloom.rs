//! The block of a split block Bloom filter (the layout of Apache Parquet's, with 64-bit words):
//! one cache line, in each of whose eight words a key's hash sets one bit. A filter is an array
//! of blocks; a hash's high 32 bits pick its block ([`block_of`]), its low 32 bits the bits. Used
//! by the KLT's membership filters (`koala_protocol::koala::KeyFilter`) and the state cache's
//! written-keys filters; at 12 bits per key about 0.4 % false positives.

/// Odd multipliers that pick a key's bit in each word of its block from the low half of its
/// hash (Apache Parquet's split block Bloom filter uses these eight).
const SALT: [u32; 8] =
    [0x47b6_137b, 0x4497_4d91, 0x8824_ad5b, 0xa2b7_289d, 0x7054_95c7, 0x2df1_424b, 0x9efc_4947, 0x5c6b_fb31];

/// One cache line of a filter: eight 64-bit words, in each of which a key sets one bit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(align(64))]
pub struct BloomBlock(pub [u64; 8]);

impl BloomBlock {
    /// The bit of each word for `hash` (from its low 32 bits; the block comes from the high ones).
    #[inline]
    fn mask(hash: u64) -> [u64; 8] {
        let low = hash as u32;
        SALT.map(|salt| 1u64 << (low.wrapping_mul(salt) >> 26))
    }

    /// Adds `hash`.
    pub fn insert(&mut self, hash: u64) {
        for (word, bit) in self.0.iter_mut().zip(Self::mask(hash)) {
            *word |= bit;
        }
    }

    /// Whether `hash` may have been added (always true if it was).
    #[inline]
    pub fn contains(&self, hash: u64) -> bool {
        // No early exit: the eight tests are cheaper than a mispredicted branch.
        self.0.iter().zip(Self::mask(hash)).fold(true, |all, (word, bit)| all & (word & bit != 0))
    }
}

/// The block of `hash` among `n` (from its high 32 bits, by multiply-shift: no division).
#[inline]
pub fn block_of(hash: u64, n: usize) -> usize {
    (((hash >> 32) * n as u64) >> 32) as usize
}
