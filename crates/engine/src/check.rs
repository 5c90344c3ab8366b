//! The offline consistency check (`tiercache check`): the log's record chain that recovery
//! replays (checkpoint position to tail), every cached block's checksum, and (with the backing device) that every clean block
//! equals the backing device's copy. Reads only.

use crate::error::Result;
use crate::volume::Volume;
use serde::Serialize;
use tiercache_device::AlignedBuf;
use tiercache_format::checksum;

#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckReport {
    pub log_records: u64,
    pub cached_blocks: u64,
    pub dirty_blocks: u64,
    pub verified_blocks: u64,
    /// Clean blocks whose cached copy fails its checksum (harmless: re-read from backing).
    pub bad_clean_blocks: u64,
    /// Dirty blocks whose only copy fails its checksum (data loss, reported as I/O errors).
    pub bad_dirty_blocks: u64,
    /// Clean blocks that differ from the backing device (would change on eviction).
    pub clean_blocks_differing_from_backing: u64,
    /// Blocks already known lost (their only dirty copy failed its checksum earlier): they
    /// read as I/O errors until rewritten.
    pub lost_blocks: u64,
    /// Human-readable descriptions of the first problems found.
    pub problems: Vec<String>,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.bad_clean_blocks + self.bad_dirty_blocks + self.clean_blocks_differing_from_backing + self.lost_blocks == 0
            && self.problems.is_empty()
    }

    fn problem(&mut self, p: String) {
        if self.problems.len() < 50 {
            self.problems.push(p);
        }
    }
}

impl Volume {
    /// Checks the cache's consistency; `compare_backing` also reads the backing copy of every
    /// clean block. `progress(done, total)` is called every 1024 blocks.
    pub fn verify(&self, compare_backing: bool, mut progress: impl FnMut(u64, u64)) -> Result<CheckReport> {
        let mut report = CheckReport::default();
        let (_, from, tail) = self.log_window();
        // The chain of records recovery replays (checkpoint position to tail) must decode.
        let mut records = 0;
        match self.walk_records(from, tail, |_, _| records += 1) {
            Ok(end) if end == tail => {}
            Ok(end) => report.problem(format!("record chain ends at {end}, tail is {tail}")),
            Err(e) => report.problem(format!("record chain broken: {e}")),
        }
        report.log_records = records;
        let lost = self.lost_blocks();
        report.lost_blocks = lost.len() as u64;
        if !lost.is_empty() {
            report.problem(format!(
                "{} lost block(s), reading as I/O errors until rewritten: {}",
                lost.len(),
                crate::error::fmt_blocks(&lost)
            ));
        }
        let entries = self.index_snapshot();
        report.cached_blocks = entries.len() as u64;
        let bs = self.block_size() as usize;
        let mut data = AlignedBuf::new(bs);
        let mut backing = AlignedBuf::new(bs);
        let total = entries.len() as u64;
        for (i, (block, e)) in entries.iter().enumerate() {
            if e.dirty {
                report.dirty_blocks += 1;
            }
            let position = self.layout.log_offset(u64::from(e.slot));
            let ok = self.cache.read_at(position, &mut data).is_ok() && checksum(&data) == e.crc;
            if !ok {
                if e.dirty {
                    report.bad_dirty_blocks += 1;
                    report.problem(format!("dirty block {block}: cached copy fails its checksum (data lost)"));
                } else {
                    report.bad_clean_blocks += 1;
                    report.problem(format!("clean block {block}: cached copy fails its checksum (will be re-read)"));
                }
            } else {
                report.verified_blocks += 1;
                if compare_backing && !e.dirty {
                    self.backing.read_at(block * bs as u64, &mut backing).map_err(crate::EngineError::backing)?;
                    if backing[..] != data[..] {
                        report.clean_blocks_differing_from_backing += 1;
                        report.problem(format!("clean block {block} differs from the backing device"));
                    }
                }
            }
            if i % 1024 == 0 {
                progress(i as u64, total);
            }
        }
        progress(total, total);
        Ok(report)
    }
}
