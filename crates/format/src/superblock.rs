//! The superblock: what this cache device is, how it is laid out, and which backing device it
//! belongs to. Two copies (cache blocks 0 and 1), each with its own sequence number and
//! checksum; the valid copy with the higher sequence wins. Updates write the copy that is
//! not current, flush, and only then overwrite the other, so one valid copy always exists.

use crate::constants::*;
use crate::error::FormatError;
use crate::layout::Layout;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// How the volume caches writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeMode {
    /// Writes complete on the cache device; the destager writes them back later.
    WriteBack = 1,
}

impl VolumeMode {
    pub fn name(self) -> &'static str {
        match self {
            VolumeMode::WriteBack => "write-back",
        }
    }
}

/// The superblock as stored: 512 bytes at the start of cache blocks 0 and 1.
#[derive(Debug, Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SuperblockDisk {
    /// CRC-32C of bytes [4, 512): detects torn and corrupted copies.
    pub checksum: U32,
    /// Zero; keeps `magic` 8-byte aligned within the block.
    pub padding0: U32,
    /// `SUPERBLOCK_MAGIC`: "this is a tiercache cache device" (not XORed: it is what tells
    /// us the UUID in the first place).
    pub magic: U64,
    /// `FORMAT_VERSION` at the time of writing; newer versions are refused.
    pub version: U32,
    /// The cache block size in bytes.
    pub block_size: U32,
    /// Incremented by every superblock write; the valid copy with the higher one wins.
    pub sequence: U64,
    /// Random at format time; XORed into every record and checkpoint magic.
    pub uuid: [u8; 16],
    /// Size of the cache device when formatted (a smaller device is refused).
    pub cache_size_bytes: U64,
    /// The layout (see `Layout`), stored so that it never depends on code.
    pub total_blocks: U64,
    pub checkpoint_area_blocks: U64,
    pub checkpoint_area0_start: U64,
    pub checkpoint_area1_start: U64,
    pub log_start: U64,
    pub log_blocks: U64,
    pub segment_blocks: U32,
    /// `VolumeMode` as a number.
    pub mode: U32,
    /// Identity of the backing device: its size...
    pub backing_size_bytes: U64,
    /// ...and the CRC-32C of its last block. The destager keeps this true: before it
    /// writes that block, it records the new CRC in `backing_fingerprint_next` (and sets
    /// flag bit 0), so that an attach in between accepts either.
    pub backing_fingerprint: U32,
    pub backing_fingerprint_next: U32,
    /// Bit 0: `backing_fingerprint_next` is valid.
    pub fingerprint_flags: U32,
    /// Destaging starts above `high`, stops below `low`; per mille of the log.
    pub dirty_low_permille: U16,
    pub dirty_high_permille: U16,
    /// Seconds since the epoch at format time (informational).
    pub created_unix_secs: U64,
    /// The backing device's path at format time, NUL-padded (informational: paths change).
    pub backing_path: [u8; 128],
    /// Zero; room for future fields.
    pub reserved: [u8; 240],
}

const _: () = assert!(std::mem::size_of::<SuperblockDisk>() == SUPERBLOCK_SIZE);

/// The superblock in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub sequence: u64,
    pub uuid: [u8; 16],
    pub cache_size_bytes: u64,
    pub layout: Layout,
    pub mode: VolumeMode,
    pub backing_size_bytes: u64,
    pub backing_fingerprint: u32,
    pub backing_fingerprint_next: Option<u32>,
    pub dirty_low_permille: u16,
    pub dirty_high_permille: u16,
    pub created_unix_secs: u64,
    pub backing_path: String,
}

impl Superblock {
    /// Encodes into the first `SUPERBLOCK_SIZE` bytes of `block` and zeroes the rest.
    pub fn encode(&self, block: &mut [u8]) {
        assert!(block.len() >= SUPERBLOCK_SIZE);
        block.fill(0);
        let mut path = [0u8; 128];
        let p = self.backing_path.as_bytes();
        let mut n = p.len().min(127);
        while !self.backing_path.is_char_boundary(n) {
            n -= 1;
        }
        path[..n].copy_from_slice(&p[..n]);
        let l = &self.layout;
        let disk = SuperblockDisk {
            checksum: U32::new(0),
            padding0: U32::new(0),
            magic: U64::new(SUPERBLOCK_MAGIC),
            version: U32::new(FORMAT_VERSION),
            block_size: U32::new(l.block_size),
            sequence: U64::new(self.sequence),
            uuid: self.uuid,
            cache_size_bytes: U64::new(self.cache_size_bytes),
            total_blocks: U64::new(l.total_blocks),
            checkpoint_area_blocks: U64::new(l.checkpoint_area_blocks),
            checkpoint_area0_start: U64::new(l.checkpoint_area_start[0]),
            checkpoint_area1_start: U64::new(l.checkpoint_area_start[1]),
            log_start: U64::new(l.log_start),
            log_blocks: U64::new(l.log_blocks),
            segment_blocks: U32::new(l.segment_blocks),
            mode: U32::new(self.mode as u32),
            backing_size_bytes: U64::new(self.backing_size_bytes),
            backing_fingerprint: U32::new(self.backing_fingerprint),
            backing_fingerprint_next: U32::new(self.backing_fingerprint_next.unwrap_or(0)),
            fingerprint_flags: U32::new(u32::from(self.backing_fingerprint_next.is_some())),
            dirty_low_permille: U16::new(self.dirty_low_permille),
            dirty_high_permille: U16::new(self.dirty_high_permille),
            created_unix_secs: U64::new(self.created_unix_secs),
            backing_path: path,
            reserved: [0; 240],
        };
        let bytes = &mut block[..SUPERBLOCK_SIZE];
        bytes.copy_from_slice(disk.as_bytes());
        let crc = crate::checksum(&bytes[4..]);
        bytes[..4].copy_from_slice(&crc.to_le_bytes());
        // Pair assertion: what we wrote decodes to what we meant.
        debug_assert_eq!(Superblock::decode(block).as_ref(), Ok(self));
    }

    /// Decodes and validates one superblock copy.
    pub fn decode(block: &[u8]) -> Result<Superblock, FormatError> {
        const WHAT: &str = "superblock";
        if block.len() < SUPERBLOCK_SIZE {
            return Err(FormatError::TooShort { what: WHAT, len: block.len(), need: SUPERBLOCK_SIZE });
        }
        let bytes = &block[..SUPERBLOCK_SIZE];
        let disk = SuperblockDisk::read_from_bytes(bytes).expect("size checked");
        if disk.magic.get() != SUPERBLOCK_MAGIC {
            return Err(FormatError::BadMagic { what: WHAT, found: disk.magic.get() });
        }
        let computed = crate::checksum(&bytes[4..]);
        if computed != disk.checksum.get() {
            return Err(FormatError::BadChecksum { what: WHAT, stored: disk.checksum.get(), computed });
        }
        let version = disk.version.get();
        if version > FORMAT_VERSION {
            return Err(FormatError::NewerVersion { what: WHAT, found: version, supported: FORMAT_VERSION });
        }
        if version != FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion { what: WHAT, found: version, supported: FORMAT_VERSION });
        }
        let invalid = |field, why: String| FormatError::Invalid { what: WHAT, field, why };
        let mode = match disk.mode.get() {
            1 => VolumeMode::WriteBack,
            m => return Err(invalid("mode", format!("unknown mode {m}"))),
        };
        let layout = Layout {
            block_size: disk.block_size.get(),
            total_blocks: disk.total_blocks.get(),
            segment_blocks: disk.segment_blocks.get(),
            checkpoint_area_blocks: disk.checkpoint_area_blocks.get(),
            checkpoint_area_start: [disk.checkpoint_area0_start.get(), disk.checkpoint_area1_start.get()],
            log_start: disk.log_start.get(),
            log_blocks: disk.log_blocks.get(),
        };
        layout.validate()?;
        if disk.cache_size_bytes.get() < layout.total_blocks * u64::from(layout.block_size) {
            return Err(invalid("cache_size_bytes", "smaller than the layout".into()));
        }
        let (low, high) = (disk.dirty_low_permille.get(), disk.dirty_high_permille.get());
        if low > high || high > 1000 {
            return Err(invalid("dirty watermarks", format!("low {low} / high {high} per mille")));
        }
        let bs = u64::from(layout.block_size);
        if disk.backing_size_bytes.get() == 0 || disk.backing_size_bytes.get() % bs != 0 {
            return Err(invalid(
                "backing_size_bytes",
                format!("{} is not a positive multiple of {bs}", disk.backing_size_bytes.get()),
            ));
        }
        if disk.backing_size_bytes.get() / bs > MAX_BACKING_BLOCKS {
            return Err(invalid("backing_size_bytes", "more blocks than the index can address".into()));
        }
        if disk.padding0.get() != 0 || disk.reserved.iter().any(|&b| b != 0) || disk.fingerprint_flags.get() > 1 {
            return Err(invalid("reserved", "non-zero padding".into()));
        }
        let path_len = disk.backing_path.iter().position(|&b| b == 0).unwrap_or(128);
        Ok(Superblock {
            sequence: disk.sequence.get(),
            uuid: disk.uuid,
            cache_size_bytes: disk.cache_size_bytes.get(),
            layout,
            mode,
            backing_size_bytes: disk.backing_size_bytes.get(),
            backing_fingerprint: disk.backing_fingerprint.get(),
            backing_fingerprint_next: (disk.fingerprint_flags.get() & 1 == 1)
                .then(|| disk.backing_fingerprint_next.get()),
            dirty_low_permille: low,
            dirty_high_permille: high,
            created_unix_secs: disk.created_unix_secs.get(),
            backing_path: String::from_utf8_lossy(&disk.backing_path[..path_len]).into_owned(),
        })
    }

    /// The recovery decision for the two copies (docs/format.md, "Superblock"): the valid
    /// copy with the higher sequence; if neither is valid, the more telling error (a newer
    /// version or a checksum error beats "not a tiercache device").
    pub fn choose(
        a: Result<Superblock, FormatError>,
        b: Result<Superblock, FormatError>,
    ) -> Result<Superblock, FormatError> {
        // A copy written by a newer tiercache means the device may hold newer structures:
        // refuse it even if the other copy is still an old, valid one.
        for r in [&a, &b] {
            if let Err(e @ FormatError::NewerVersion { .. }) = r {
                return Err(e.clone());
            }
        }
        match (a, b) {
            (Ok(a), Ok(b)) => Ok(if b.sequence > a.sequence { b } else { a }),
            (Ok(a), Err(_)) => Ok(a),
            (Err(_), Ok(b)) => Ok(b),
            (Err(ea), Err(eb)) => Err(match (&ea, &eb) {
                (FormatError::BadMagic { .. }, _) => eb,
                _ => ea,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Superblock {
        Superblock {
            sequence: 7,
            uuid: *b"0123456789abcdef",
            cache_size_bytes: 64 << 20,
            layout: Layout::compute(64 << 20, 4096, 256).unwrap(),
            mode: VolumeMode::WriteBack,
            backing_size_bytes: 1 << 30,
            backing_fingerprint: 0xdead_beef,
            backing_fingerprint_next: Some(42),
            dirty_low_permille: 200,
            dirty_high_permille: 600,
            created_unix_secs: 1_700_000_000,
            backing_path: "/dev/slow".into(),
        }
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        let mut block = vec![0xffu8; 4096];
        sb.encode(&mut block);
        assert_eq!(Superblock::decode(&block).unwrap(), sb);
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let mut block = vec![0u8; 4096];
        sample().encode(&mut block);
        for bit in 0..SUPERBLOCK_SIZE * 8 {
            let mut b = block.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(Superblock::decode(&b).is_err(), "bit {bit} flip accepted");
        }
    }

    #[test]
    fn newer_version_is_refused_by_name() {
        let mut block = vec![0u8; 4096];
        sample().encode(&mut block);
        block[16..20].copy_from_slice(&2u32.to_le_bytes());
        let crc = crate::checksum(&block[4..SUPERBLOCK_SIZE]);
        block[..4].copy_from_slice(&crc.to_le_bytes());
        let e = Superblock::decode(&block).unwrap_err();
        assert!(matches!(e, FormatError::NewerVersion { found: 2, .. }), "{e}");
        assert!(e.to_string().contains("upgrade tiercache"));
    }

    #[test]
    fn choose_prefers_the_newest_valid_copy() {
        let a = sample();
        let mut b = sample();
        b.sequence = 8;
        assert_eq!(Superblock::choose(Ok(a.clone()), Ok(b.clone())).unwrap().sequence, 8);
        let bad = Err(FormatError::BadMagic { what: "superblock", found: 0 });
        assert_eq!(Superblock::choose(Ok(a.clone()), bad.clone()).unwrap().sequence, 7);
        assert_eq!(Superblock::choose(bad.clone(), Ok(b)).unwrap().sequence, 8);
        let crc = Err(FormatError::BadChecksum { what: "superblock", stored: 1, computed: 2 });
        assert!(matches!(Superblock::choose(bad.clone(), crc), Err(FormatError::BadChecksum { .. })));
        assert!(matches!(Superblock::choose(bad.clone(), bad), Err(FormatError::BadMagic { .. })));
    }
}
