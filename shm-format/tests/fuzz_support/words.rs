//! Little-endian fields read from raw bytes, widened to `u64`, for the
//! fuzz tests' independent checks (`fuzz_digest.rs`, `fuzz_router.rs`).

pub fn u16_at(b: &[u8], at: usize) -> u64 {
    u64::from(u16::from_le_bytes(b[at..at + 2].try_into().unwrap()))
}

pub fn u32_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32::from_le_bytes(b[at..at + 4].try_into().unwrap()))
}

pub fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
