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
    /// ...and the CRC-32C of each of its fingerprint blocks (`Superblock::fingerprint_blocks`:
    /// the first blocks, where partition tables, file systems, LVM, MD and LUKS keep their
    /// signatures, and the last block, where GPT keeps its backup and MD 0.90/1.0 their
    /// superblocks). The destager keeps them true: before it writes one of those blocks, it
    /// records the new CRC in `fingerprint_next[i]` (and sets flag bit i), so that an attach
    /// in between accepts either.
    pub fingerprint_crc: [U32; FINGERPRINT_BLOCKS],
    pub fingerprint_next: [U32; FINGERPRINT_BLOCKS],
    /// Bit i: `fingerprint_next[i]` is valid.
    pub fingerprint_flags: U32,
    /// Destaging starts above `high` and stops at or below `low`; per mille of the log.
    pub dirty_low_permille: U16,
    pub dirty_high_permille: U16,
    /// Seconds since the epoch at format time (informational).
    pub created_unix_secs: U64,
    /// The backing device's path at format time, NUL-padded (informational: paths change).
    pub backing_path: [u8; 128],
    /// The stable identity the kernel reports for a backing block device (its WWID, else its
    /// serial, from sysfs; `-partN` appended for a partition), NUL-padded (the first 63 bytes); empty for files and devices that report none. A
    /// device reporting another identity is refused.
    pub backing_id: [u8; 64],
    /// `Layout::probation_blocks` (the ring follows the log). Zero in caches formatted before
    /// it existed: builds before it refuse a cache that has one ("reserved: non-zero").
    pub probation_blocks: U64,
    /// `FingerprintHash` as a number: how `fingerprint_crc` and `fingerprint_next` were
    /// computed. Zero (CRC-32C) in caches formatted before it existed; builds before it refuse
    /// a cache with another ("reserved: non-zero").
    pub fingerprint_hash: U32,
    /// Zero; room for future fields.
    pub reserved: [u8; 140],
}

/// Backing blocks fingerprinted in the superblock.
pub const FINGERPRINT_BLOCKS: usize = 4;

/// What the superblock remembers of one fingerprint block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fingerprint {
    /// The block's content on the backing device, hashed by the superblock's `FingerprintHash`.
    pub crc: u32,
    /// Set while a write-back of this block is in flight: its new content's hash.
    pub next: Option<u32>,
}

/// How a fingerprint block's content is hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FingerprintHash {
    /// CRC-32C of the block, as caches formatted before `Xxh3` store it. Blind where a block
    /// ends a checksummed structure with that structure's own CRC-32C: CRC-32C over data
    /// followed by its CRC-32C is one constant, so every ext4 file system's block 0 (its
    /// superblock ends in `s_checksum`, zeroes after it) hashed alike, and a backing device
    /// mounted and changed outside the cache passed the check on that block.
    Crc32c = 0,
    /// The low 32 bits of the block's XXH3-64 (xxHash, spec 0.8): not linear over GF(2), so an
    /// embedded CRC of any kind does not cancel out. What `create` uses.
    Xxh3 = 1,
}

impl FingerprintHash {
    /// The fingerprint of `block`'s content.
    pub fn of(self, block: &[u8]) -> u32 {
        match self {
            FingerprintHash::Crc32c => crate::checksum(block),
            FingerprintHash::Xxh3 => xxhash_rust::xxh3::xxh3_64(block) as u32,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FingerprintHash::Crc32c => "crc32c",
            FingerprintHash::Xxh3 => "xxh3",
        }
    }
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
    /// One per `fingerprint_blocks()`, in that order.
    pub backing_fingerprints: [Fingerprint; FINGERPRINT_BLOCKS],
    /// How `backing_fingerprints` hash a block.
    pub fingerprint_hash: FingerprintHash,
    pub dirty_low_permille: u16,
    pub dirty_high_permille: u16,
    pub created_unix_secs: u64,
    pub backing_path: String,
    /// The backing block device's stable identity, or empty.
    pub backing_id: String,
}

/// The backing identity as the superblock stores it: at most 63 bytes, cut at a character
/// boundary (compare a device's identity through this, never the raw string).
pub fn fit_backing_id(id: &str) -> String {
    let mut n = id.len().min(63);
    while !id.is_char_boundary(n) {
        n -= 1;
    }
    id[..n].to_string()
}

/// Copies a string into a NUL-padded field, cut at a character boundary.
fn padded<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let mut n = s.len().min(N - 1);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out
}

/// See `Superblock::fingerprint_blocks`.
pub fn fingerprint_blocks(backing_size_bytes: u64, block_size: u32) -> [u64; FINGERPRINT_BLOCKS] {
    let bs = u64::from(block_size);
    let last = backing_size_bytes / bs - 1;
    [0, 4096 / bs, 65536 / bs, last].map(|b| b.min(last))
}

fn unpadded(field: &[u8]) -> String {
    let len = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..len]).into_owned()
}

impl Superblock {
    /// Encodes into the first `SUPERBLOCK_SIZE` bytes of `block` and zeroes the rest.
    pub fn encode(&self, block: &mut [u8]) {
        assert!(block.len() >= SUPERBLOCK_SIZE);
        block.fill(0);
        let l = &self.layout;
        let fp = &self.backing_fingerprints;
        let flags = fp.iter().enumerate().fold(0u32, |f, (i, x)| f | (u32::from(x.next.is_some()) << i));
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
            fingerprint_crc: fp.map(|x| U32::new(x.crc)),
            fingerprint_next: fp.map(|x| U32::new(x.next.unwrap_or(0))),
            fingerprint_flags: U32::new(flags),
            dirty_low_permille: U16::new(self.dirty_low_permille),
            dirty_high_permille: U16::new(self.dirty_high_permille),
            created_unix_secs: U64::new(self.created_unix_secs),
            backing_path: padded(&self.backing_path),
            backing_id: padded(&self.backing_id),
            probation_blocks: U64::new(l.probation_blocks),
            fingerprint_hash: U32::new(self.fingerprint_hash as u32),
            reserved: [0; 140],
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
            return Err(FormatError::OlderVersion { what: WHAT, found: version, supported: FORMAT_VERSION });
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
            probation_blocks: disk.probation_blocks.get(),
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
        let flags = disk.fingerprint_flags.get();
        if disk.padding0.get() != 0 || disk.reserved.iter().any(|&b| b != 0) || flags >> FINGERPRINT_BLOCKS != 0 {
            return Err(invalid("reserved", "non-zero padding".into()));
        }
        let fingerprint_hash = match disk.fingerprint_hash.get() {
            0 => FingerprintHash::Crc32c,
            1 => FingerprintHash::Xxh3,
            h => return Err(invalid("fingerprint_hash", format!("unknown hash {h}"))),
        };
        let mut backing_fingerprints = [Fingerprint::default(); FINGERPRINT_BLOCKS];
        for (i, f) in backing_fingerprints.iter_mut().enumerate() {
            f.crc = disk.fingerprint_crc[i].get();
            f.next = (flags >> i & 1 == 1).then(|| disk.fingerprint_next[i].get());
        }
        Ok(Superblock {
            sequence: disk.sequence.get(),
            uuid: disk.uuid,
            cache_size_bytes: disk.cache_size_bytes.get(),
            layout,
            mode,
            backing_size_bytes: disk.backing_size_bytes.get(),
            backing_fingerprints,
            fingerprint_hash,
            dirty_low_permille: low,
            dirty_high_permille: high,
            created_unix_secs: disk.created_unix_secs.get(),
            backing_path: unpadded(&disk.backing_path),
            backing_id: unpadded(&disk.backing_id),
        })
    }

    /// The backing blocks whose CRCs identify the backing device, in `backing_fingerprints`
    /// order: the blocks holding bytes 0 (MBR, LUKS, XFS, ext2/3/4 at 1024, LVM2 at 512, and
    /// swap's signature at the end of its first page), 4096 (GPT entries, MD 1.2) and 65536
    /// (Btrfs), and the last
    /// block (GPT backup header, MD 0.90/1.0). With large blocks some coincide.
    pub fn fingerprint_blocks(&self) -> [u64; FINGERPRINT_BLOCKS] {
        fingerprint_blocks(self.backing_size_bytes, self.layout.block_size)
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
            backing_fingerprints: [
                Fingerprint { crc: 0xdead_beef, next: Some(42) },
                Fingerprint { crc: 1, next: None },
                Fingerprint { crc: 2, next: Some(0) },
                Fingerprint { crc: 3, next: None },
            ],
            fingerprint_hash: FingerprintHash::Xxh3,
            dirty_low_permille: 200,
            dirty_high_permille: 600,
            created_unix_secs: 1_700_000_000,
            backing_path: "/dev/slow".into(),
            backing_id: "wwn-0x5000c500a1b2c3d4".into(),
        }
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        let mut block = vec![0xffu8; 4096];
        sb.encode(&mut block);
        assert_eq!(Superblock::decode(&block).unwrap(), sb);
    }

    /// `fingerprint_hash` at 368: zero (every cache formatted before the field) is CRC-32C,
    /// one XXH3, anything else refused by name.
    #[test]
    fn the_fingerprint_hash_field() {
        let with = |value: u32| {
            let mut block = vec![0u8; 4096];
            sample().encode(&mut block);
            block[368..372].copy_from_slice(&value.to_le_bytes());
            let crc = crate::checksum(&block[4..SUPERBLOCK_SIZE]);
            block[..4].copy_from_slice(&crc.to_le_bytes());
            Superblock::decode(&block)
        };
        assert_eq!(with(0).unwrap().fingerprint_hash, FingerprintHash::Crc32c);
        assert_eq!(with(1).unwrap().fingerprint_hash, FingerprintHash::Xxh3);
        let e = with(2).unwrap_err();
        assert!(matches!(&e, FormatError::Invalid { field: "fingerprint_hash", .. }), "{e}");
        let mut old = sample();
        old.fingerprint_hash = FingerprintHash::Crc32c;
        let mut block = vec![0u8; 4096];
        old.encode(&mut block);
        assert_eq!(&block[368..SUPERBLOCK_SIZE], &[0u8; SUPERBLOCK_SIZE - 368][..], "as caches before the field");
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
        block[16..20].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        let crc = crate::checksum(&block[4..SUPERBLOCK_SIZE]);
        block[..4].copy_from_slice(&crc.to_le_bytes());
        let e = Superblock::decode(&block).unwrap_err();
        assert!(matches!(e, FormatError::NewerVersion { found, .. } if found == FORMAT_VERSION + 1), "{e}");
        assert!(e.to_string().contains("upgrade tiercache"));
    }

    #[test]
    fn older_version_is_refused_by_name() {
        let mut block = vec![0u8; 4096];
        sample().encode(&mut block);
        block[16..20].copy_from_slice(&1u32.to_le_bytes());
        let crc = crate::checksum(&block[4..SUPERBLOCK_SIZE]);
        block[..4].copy_from_slice(&crc.to_le_bytes());
        let e = Superblock::decode(&block).unwrap_err();
        assert!(matches!(e, FormatError::OlderVersion { found: 1, .. }), "{e}");
        assert!(e.to_string().contains("older tiercache"), "{e}");
    }

    #[test]
    fn fingerprint_blocks_cover_the_signature_places() {
        assert_eq!(fingerprint_blocks(1 << 30, 4096), [0, 1, 16, (1 << 30) / 4096 - 1]);
        assert_eq!(fingerprint_blocks(1 << 30, 65536), [0, 0, 1, (1 << 30) / 65536 - 1]);
        assert_eq!(fingerprint_blocks(8192, 4096), [0, 1, 1, 1]);
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
