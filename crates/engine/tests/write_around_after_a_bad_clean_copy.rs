//! A clean copy that fails its checksum on a read is dropped from the index and the block is
//! read from the backing device (`read_block_again`). The copy stays in its record on the
//! log: if the medium is good and the corruption was in transit (a bad cable, a controller,
//! memory), a crash replays it as clean, "the backing device's content". So the block must
//! not be written around until the head passes that copy (`Around::resurrectable`), as for
//! any other clean copy dropped without a record: written around, the new data would lie on
//! the backing device under a copy that recovery brings back over it.
//!
//! Found by the adversarial review of 1624197 (write-arounds beside a write-back batch), as a
//! suspicion older than that change.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

mod common;
use common::holds::*;
use common::*;
use tiercache_device::{BlockDevice, SimDevice};

/// Corrupts, in the buffer only, every read covering `offset` while armed (`u64::MAX`: not
/// armed): the medium keeps the good data.
struct InTransit {
    inner: Arc<SimDevice>,
    offset: AtomicU64,
}

impl BlockDevice for InTransit {
    forward_to_inner!(inner: size_bytes, logical_block_size, discard, atomic_write_bytes, write_at, flush);
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tiercache_device::Result<()> {
        self.inner.read_at(offset, buf)?;
        let at = self.offset.load(Ordering::SeqCst);
        if offset <= at && at < offset + buf.len() as u64 {
            buf[(at - offset) as usize + 100] ^= 0xff;
        }
        Ok(())
    }
    fn describe(&self) -> String {
        format!("in-transit:{}", self.inner.describe())
    }
}

#[test]
fn a_block_whose_clean_copy_failed_in_transit_is_not_written_around_before_the_head_passes_it() {
    let (cache, backing) = wa_devices(32, 256);
    let dev = Arc::new(InTransit { inner: Arc::clone(&cache), offset: AtomicU64::new(u64::MAX) });
    let v = open_wa(Arc::clone(&dev) as Arc<dyn BlockDevice>, Arc::clone(&backing) as Arc<dyn BlockDevice>);
    // Block 40 cached clean (version 1): written, flushed, written back.
    dirty_durable(&v, 40, 1, 1);
    v.write_back_all(1.0, |_, _| true).unwrap();
    let (slot, dirty) = slot_of(&v, 40).expect("block 40 cached");
    assert!(!dirty);
    let (layout, _) = layout_of(&cache);
    dev.offset.store(layout.log_offset(u64::from(slot)), Ordering::SeqCst);
    assert_eq!(ver(&v, 40), 1, "the read is served from the backing device");
    assert_eq!(v.status().counters.repaired_blocks, 1, "the bad clean copy was dropped");
    dev.offset.store(u64::MAX, Ordering::SeqCst);
    // Blocks 40 and 41, version 2: around the cache would leave the good copy of version 1
    // on the log, in a record that recovery replays.
    write_n(&v, 40, 2, 2).unwrap();
    assert_eq!(around(&v), 0, "block 40 went around the cache with its dropped copy still on the log");
    v.flush().unwrap();
    let r = crash_and_recover(&cache, &backing);
    assert_eq!((vers(&v, 40..42), vers(&r, 40..42)), (vec![2, 2], vec![2, 2]), "(live, after FLUSH and a power cut)");
}
