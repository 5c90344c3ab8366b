//! The record pipeline (docs/format.md 4.2, `volume/commit.rs`): a writer that fills staging
//! writes its record without waiting for the record writes before it. Each test holds one
//! record write at a `Gate` and checks what must hold meanwhile and after a power cut: FLUSH
//! waits for every record write in progress, records enter the index in sequence order
//! whatever order their writes end in, and a loss is never logged after newer data of the
//! block still in flight.

mod common;

use common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_device::BlockDevice;
use tiercache_engine::Volume;

/// A log of 256 segments (2,048 blocks: full-size records, no reclaim in these tests) behind
/// a gate, and a backing device of 4,096 blocks.
fn gated() -> (Arc<Gate>, Arc<tiercache_device::SimDevice>, Arc<tiercache_device::SimDevice>, Arc<Volume>) {
    let (cache, backing) = devices(256, 4096);
    let gate = Gate::new(Arc::clone(&cache));
    let volume =
        Arc::new(open(Arc::clone(&gate) as Arc<dyn BlockDevice>, Arc::clone(&backing) as Arc<dyn BlockDevice>));
    (gate, cache, backing, volume)
}

/// One more block than a record holds: the last one finds staging full and seals it.
const FILL: u64 = 127;

fn write_run(v: &Volume, first: u64, n: u64, version: u64) {
    v.write(first * BS as u64, &stamps(first, n, version)).unwrap();
}

#[test]
fn a_flush_waits_for_the_record_writes_in_progress() {
    let (gate, cache, backing, volume) = gated();
    gate.arm(Hold::WriteOf(100));
    let writer = on_thread(&volume, |v| write_run(v, 0, FILL, 1));
    gate.wait_until_held();
    // The first 126 blocks are in a record whose write is held; a FLUSH now must not
    // return before that write has reached the device.
    let flusher = on_thread(&volume, |v| v.flush().unwrap());
    let deadline = Instant::now() + Duration::from_secs(2);
    while !flusher.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    // A power cut at the moment the FLUSH returned (or now, if it is still waiting).
    let image_when_flushed = flusher.is_finished().then(|| cache.durable_image());
    gate.open_gate();
    writer.join().unwrap();
    flusher.join().unwrap();
    let image = image_when_flushed.unwrap_or_else(|| {
        // Still waiting when the gate opened: the flush returns after the record's write.
        volume.flush().unwrap();
        cache.durable_image()
    });
    let recovered = recover_image(image, &backing);
    for b in 0..FILL - 1 {
        assert_eq!(read_version(&recovered, b).unwrap(), Some(1), "block {b}: flushed, then lost");
    }
}

#[test]
fn records_enter_the_index_in_sequence_order_whatever_order_their_writes_end_in() {
    let (gate, cache, backing, volume) = gated();
    gate.arm(Hold::WriteOf(100));
    // Record k (block 0 at version 1, and 125 more) is held...
    let writer = on_thread(&volume, |v| write_run(v, 0, FILL, 1));
    gate.wait_until_held();
    // ...while record k + 1 (block 0 at version 2) is written past it.
    write(&volume, 0, 2);
    write_run(&volume, 1000, FILL, 1);
    assert!(volume.status().counters.overlapped_record_writes >= 1, "the second record was sealed behind the first");
    assert_eq!(read_version(&volume, 0).unwrap(), Some(2), "served from the newer record in flight");
    gate.open_gate();
    writer.join().unwrap();
    assert_eq!(read_version(&volume, 0).unwrap(), Some(2), "the older record, written last, did not take over");
    volume.flush().unwrap();
    let recovered = recover_image(cache.durable_image(), &backing);
    assert_eq!(read_version(&recovered, 0).unwrap(), Some(2));
    assert_eq!(read_version(&recovered, 5).unwrap(), Some(1));
    assert_eq!(read_version(&recovered, 1000).unwrap(), Some(1));
}

#[test]
fn a_loss_is_never_logged_after_newer_data_still_in_flight() {
    let (gate, cache, backing, volume) = gated();
    // Block 7's only copy rots: a read declares it lost (in RAM, not yet logged).
    write(&volume, 7, 1);
    volume.flush().unwrap();
    corrupt_cached_block(&cache, &volume, 7);
    assert!(is_lost(&read_version(&volume, 7), 7));
    // Record k carries block 7 at version 2 (which ends the loss once written); its write
    // is held.
    gate.arm(Hold::WriteOf(100));
    let writer = on_thread(&volume, |v| write_run(v, 0, FILL, 2));
    gate.wait_until_held();
    // Record k + 1 is sealed and written meanwhile: it must not carry a Lost entry for
    // block 7, which replay would apply after version 2.
    write_run(&volume, 2000, FILL, 1);
    gate.open_gate();
    writer.join().unwrap();
    assert_eq!(read_version(&volume, 7).unwrap(), Some(2));
    volume.flush().unwrap();
    let recovered = recover_image(cache.durable_image(), &backing);
    assert_eq!(read_version(&recovered, 7).unwrap(), Some(2), "the loss came back after newer data");
}
