//! Every on-disk decoder on arbitrary blocks: never panics; a decoded structure re-encodes
//! to something that decodes to the same value (pair assertion).
#![no_main]
use libfuzzer_sys::fuzz_target;
use tiercache_format::{CheckpointEntry, CheckpointHeader, RecordHeader, Superblock};

fuzz_target!(|data: &[u8]| {
    let mut block = vec![0u8; 4096];
    let n = data.len().min(4096);
    block[..n].copy_from_slice(&data[..n]);
    let uuid_low = 0x1234_5678_9abc_def0;
    if let Ok(sb) = Superblock::decode(&block) {
        let mut again = vec![0u8; 4096];
        sb.encode(&mut again);
        assert_eq!(Superblock::decode(&again).unwrap(), sb);
    }
    if let Ok(h) = RecordHeader::decode(&block, uuid_low) {
        let mut again = vec![0u8; 4096];
        h.encode(uuid_low, &mut again);
        assert_eq!(RecordHeader::decode(&again, uuid_low).unwrap(), h);
    }
    let _ = CheckpointHeader::decode(&block, uuid_low, 1 << 20);
    for chunk in block.chunks(16).take(8) {
        let _ = CheckpointEntry::decode(chunk);
    }
});
