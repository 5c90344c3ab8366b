//! Where each area lives on the cache device, computed once at format time and stored in the
//! superblock (so a future change to this computation never moves an existing cache's areas).

use crate::constants::*;
use crate::error::FormatError;

/// The cache device's areas, in cache blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub block_size: u32,
    /// Blocks of the whole cache device that the layout uses.
    pub total_blocks: u64,
    pub segment_blocks: u32,
    /// Each checkpoint area: one header block plus room for one entry per log block and one
    /// tombstone per possible lost block (`max_lost_blocks_for`).
    pub checkpoint_area_blocks: u64,
    pub checkpoint_area_start: [u64; 2],
    pub log_start: u64,
    /// A multiple of `segment_blocks`.
    pub log_blocks: u64,
    /// The read cache's probation ring, right after the log: blocks read once wait here, and
    /// only those read again move into the log (docs/format.md 3). Zero: no ring (caches
    /// formatted before it existed, or `create --probation-percent 0`). Nothing in it is
    /// ever recovered: it holds clean copies only, forgotten at every open.
    pub probation_blocks: u64,
}

impl Layout {
    /// Blocks a checkpoint area needs for a log of `log_blocks`.
    pub fn checkpoint_blocks_for(log_blocks: u64, block_size: u32) -> u64 {
        let entries = log_blocks + Self::max_lost_blocks_for(log_blocks);
        1 + (entries * CHECKPOINT_ENTRY_SIZE as u64).div_ceil(u64::from(block_size))
    }

    /// The most lost blocks (tombstones) a volume with this log remembers: a cache device
    /// that corrupts more than this is failing, and the volume stops accepting writes.
    pub fn max_lost_blocks_for(log_blocks: u64) -> u64 {
        (log_blocks / 16).max(16)
    }

    /// The most entries a checkpoint holds: one per log block (index entries) plus the lost
    /// blocks' tombstones.
    pub fn checkpoint_capacity(&self) -> u64 {
        self.log_blocks + Self::max_lost_blocks_for(self.log_blocks)
    }

    /// The largest layout that fits a cache device of `device_bytes`.
    pub fn compute(device_bytes: u64, block_size: u32, segment_blocks: u32) -> Result<Layout, FormatError> {
        let invalid = |field, why: String| FormatError::Invalid { what: "layout", field, why };
        if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) || !block_size.is_power_of_two() {
            return Err(invalid(
                "block_size",
                format!("{block_size} is not a power of two between {MIN_BLOCK_SIZE} and {MAX_BLOCK_SIZE}"),
            ));
        }
        if segment_blocks < 4 || !segment_blocks.is_power_of_two() {
            return Err(invalid("segment_blocks", format!("{segment_blocks} is not a power of two >= 4")));
        }
        let total_blocks = device_bytes / u64::from(block_size);
        let seg = u64::from(segment_blocks);
        // Each log block costs itself plus two checkpoint entries (one per area).
        let per_block = 1.0 + 2.0 * CHECKPOINT_ENTRY_SIZE as f64 / f64::from(block_size);
        let fixed = SUPERBLOCK_COPIES + 2;
        let mut log_blocks = ((total_blocks.saturating_sub(fixed) as f64 / per_block) as u64 / seg * seg)
            .min(MAX_LOG_BLOCKS / seg * seg);
        while log_blocks > 0
            && SUPERBLOCK_COPIES + 2 * Self::checkpoint_blocks_for(log_blocks, block_size) + log_blocks > total_blocks
        {
            log_blocks -= seg;
        }
        if log_blocks < MIN_LOG_SEGMENTS * seg {
            let need = (SUPERBLOCK_COPIES
                + 2 * Self::checkpoint_blocks_for(MIN_LOG_SEGMENTS * seg, block_size)
                + MIN_LOG_SEGMENTS * seg)
                * u64::from(block_size);
            return Err(invalid(
                "size",
                format!("a cache device of {device_bytes} bytes is too small; at least {need} bytes are needed with {block_size}-byte blocks and {segment_blocks}-block segments"),
            ));
        }
        let checkpoint_area_blocks = Self::checkpoint_blocks_for(log_blocks, block_size);
        let ck0 = SUPERBLOCK_COPIES;
        let ck1 = ck0 + checkpoint_area_blocks;
        let log_start = ck1 + checkpoint_area_blocks;
        let layout = Layout {
            block_size,
            total_blocks,
            segment_blocks,
            checkpoint_area_blocks,
            checkpoint_area_start: [ck0, ck1],
            log_start,
            log_blocks,
            probation_blocks: 0,
        };
        layout.validate()?;
        Ok(layout)
    }

    /// This layout with `permille` of its log given to the probation ring (whole segments;
    /// none where that would leave the log fewer than `MIN_LOG_SEGMENTS` segments or the ring
    /// fewer than two). The checkpoint areas keep their size.
    pub fn with_probation(mut self, permille: u16) -> Layout {
        let seg = u64::from(self.segment_blocks);
        let ring = self.log_blocks * u64::from(permille.min(MAX_PROBATION_PERMILLE)) / 1000 / seg * seg;
        if ring >= 2 * seg && self.log_blocks - ring >= MIN_LOG_SEGMENTS * seg {
            self.log_blocks -= ring;
            self.probation_blocks = ring;
        }
        debug_assert!(self.validate().is_ok());
        self
    }

    /// The cache block (device address / block size) of probation ring position `pos`; None
    /// for a layout without a ring.
    pub fn probation_block(&self, pos: u64) -> Option<u64> {
        (self.probation_blocks > 0).then(|| self.log_start + self.log_blocks + pos % self.probation_blocks)
    }

    /// Checks the relations between the fields (used on every superblock read).
    pub fn validate(&self) -> Result<(), FormatError> {
        let invalid = |field, why: String| Err(FormatError::Invalid { what: "layout", field, why });
        if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&self.block_size) || !self.block_size.is_power_of_two() {
            return invalid("block_size", format!("{}", self.block_size));
        }
        if self.segment_blocks < 4 || !self.segment_blocks.is_power_of_two() {
            return invalid("segment_blocks", format!("{}", self.segment_blocks));
        }
        if self.log_blocks == 0
            || !self.log_blocks.is_multiple_of(u64::from(self.segment_blocks))
            || self.log_blocks > MAX_LOG_BLOCKS
        {
            return invalid("log_blocks", format!("{} (segment {})", self.log_blocks, self.segment_blocks));
        }
        if self.checkpoint_area_blocks < Self::checkpoint_blocks_for(self.log_blocks, self.block_size) {
            return invalid(
                "checkpoint_area_blocks",
                format!("{} is too small for {} log blocks", self.checkpoint_area_blocks, self.log_blocks),
            );
        }
        // (Checked sums: the fields come from disk, and a copy with huge ones that still passes
        // its checksum is refused, never a panic.)
        let area1 = self.checkpoint_area_start[0].checked_add(self.checkpoint_area_blocks);
        let log = self.checkpoint_area_start[1].checked_add(self.checkpoint_area_blocks);
        if self.checkpoint_area_start[0] != SUPERBLOCK_COPIES
            || Some(self.checkpoint_area_start[1]) != area1
            || Some(self.log_start) != log
        {
            return invalid("areas", format!("{self:?} overlap or leave gaps"));
        }
        if self.probation_blocks > MAX_LOG_BLOCKS {
            return invalid("probation_blocks", format!("{}", self.probation_blocks));
        }
        let bytes = self.total_blocks.checked_mul(u64::from(self.block_size));
        match self.log_start.checked_add(self.log_blocks).and_then(|e| e.checked_add(self.probation_blocks)) {
            Some(end) if end <= self.total_blocks && bytes.is_some() => Ok(()),
            _ => invalid(
                "log_blocks",
                format!("log and probation ring end beyond the device's {} blocks", self.total_blocks),
            ),
        }
    }

    /// The cache block (device address / block size) of logical log position `pos`.
    pub fn log_block(&self, pos: u64) -> u64 {
        self.log_start + pos % self.log_blocks
    }

    /// The byte offset on the cache device of logical log position `pos`.
    pub fn log_offset(&self, pos: u64) -> u64 {
        self.log_block(pos) * u64::from(self.block_size)
    }

    /// Of `blocks` blocks starting at logical position `pos`, how many lie before the log's
    /// physical end (a record that wraps is written and read as two pieces).
    pub fn blocks_before_wrap(&self, pos: u64, blocks: u64) -> u64 {
        (self.log_blocks - pos % self.log_blocks).min(blocks)
    }

    /// The physical slot (index into the log) of a logical position.
    pub fn slot(&self, pos: u64) -> u32 {
        u32::try_from(pos % self.log_blocks).expect("log_blocks <= MAX_LOG_BLOCKS")
    }

    /// The logical position of `slot` inside the live window `[tail - log_blocks, tail)`.
    pub fn position_of_slot(&self, slot: u32, tail: u64) -> u64 {
        let slot = u64::from(slot);
        debug_assert!(slot < self.log_blocks);
        let tail_slot = tail % self.log_blocks;
        if slot < tail_slot {
            tail - tail_slot + slot
        } else {
            (tail - tail_slot + slot).wrapping_sub(self.log_blocks)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_fit_and_validate() {
        for (bytes, bs, seg) in [(64 << 20, 4096, 256), (1 << 30, 4096, 256), (3 << 20, 4096, 16), (1 << 30, 65536, 16)]
        {
            let l = Layout::compute(bytes, bs, seg).unwrap();
            l.validate().unwrap();
            assert!((l.log_start + l.log_blocks) * u64::from(bs) <= bytes);
            // The largest layout: less than one more segment (plus its checkpoint entries)
            // would have fitted.
            let unused = l.total_blocks - (l.log_start + l.log_blocks);
            assert!(unused < u64::from(seg) + 2, "{l:?}");
        }
    }

    #[test]
    fn too_small_or_odd_parameters_are_refused_with_the_reason() {
        let e = Layout::compute(1 << 20, 4096, 256).unwrap_err();
        assert!(e.to_string().contains("too small"), "{e}");
        assert!(Layout::compute(1 << 30, 1000, 256).unwrap_err().to_string().contains("block_size"));
        assert!(Layout::compute(1 << 30, 4096, 100).unwrap_err().to_string().contains("segment_blocks"));
    }

    #[test]
    fn slot_position_round_trip_inside_the_live_window() {
        let l = Layout::compute(3 << 20, 4096, 16).unwrap();
        let n = l.log_blocks;
        for tail in [n, n + 1, 5 * n + 7, 9 * n - 1] {
            for pos in tail - n..tail {
                assert_eq!(l.position_of_slot(l.slot(pos), tail), pos, "tail {tail}");
            }
        }
        for pos in 0..5 {
            assert_eq!(l.position_of_slot(l.slot(pos), 5), pos);
        }
    }
}
