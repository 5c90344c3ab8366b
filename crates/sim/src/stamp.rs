//! Block stamps: every block a simulator or crash test writes carries its block number and
//! a version, and a pattern derived from both, so a read of another block's data, a torn
//! block or garbage is told apart from a stale version. Used by both simulators, the engine's
//! and the cli's crash tests, and `tiercache debug-load`.

/// The block size stamps are made for.
pub const STAMP_BLOCK: usize = 4096;

/// Fills a block with its stamp: block number, version, and a pattern derived from both.
pub fn stamp(block: u64, version: u64, out: &mut [u8]) {
    out[..8].copy_from_slice(&block.to_le_bytes());
    out[8..16].copy_from_slice(&version.to_le_bytes());
    let fill = (block as u8) ^ (version as u8).rotate_left(3) ^ 0x5a;
    out[16..].fill(fill);
    out[STAMP_BLOCK - 1] = fill.wrapping_add(1);
}

/// A freshly allocated stamped block.
pub fn stamped(block: u64, version: u64) -> Vec<u8> {
    let mut v = vec![0u8; STAMP_BLOCK];
    stamp(block, version, &mut v);
    v
}

/// Decodes a block's stamp `(block, version)` if the whole block is intact.
pub fn unstamp(data: &[u8]) -> Option<(u64, u64)> {
    let block = u64::from_le_bytes(data[..8].try_into().ok()?);
    let version = u64::from_le_bytes(data[8..16].try_into().ok()?);
    let mut expect = vec![0u8; STAMP_BLOCK];
    stamp(block, version, &mut expect);
    (expect == data).then_some((block, version))
}

/// The version of `block` stamped in `data`, if `data` is an intact stamp of that block.
pub fn version_of(block: u64, data: &[u8]) -> Option<u64> {
    unstamp(data).and_then(|(b, v)| (b == block).then_some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip_and_detect_damage() {
        let mut b = stamped(7, 99);
        assert_eq!(unstamp(&b), Some((7, 99)));
        assert_eq!(version_of(7, &b), Some(99));
        assert_eq!(version_of(8, &b), None);
        b[600] ^= 1;
        assert_eq!(unstamp(&b), None);
    }
}
