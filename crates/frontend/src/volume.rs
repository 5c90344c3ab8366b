//! The hybrid volume as [`ByteIo`]: the engine already takes byte ranges
//! (`read_bytes`/`write_bytes`/`write_zeroes` read-modify-write partial blocks), so this adds
//! FUA (a write, then the volume's FLUSH), the trim hint on whole blocks, and errno replies.

use crate::{whole_blocks_inside, ByteIo, Errno};
use tiercache_engine::Volume;

impl ByteIo for Volume {
    fn size_bytes(&self) -> u64 {
        Volume::size_bytes(self)
    }
    fn block_size(&self) -> u32 {
        Volume::block_size(self)
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        Ok(self.read_bytes(offset, buf)?)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), Errno> {
        self.write_bytes(offset, data)?;
        if fua {
            Volume::flush(self)?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), Errno> {
        Ok(Volume::flush(self)?)
    }
    fn write_ahead(&self) {
        // (A failed record write poisons the volume: the next request reports it.)
        let _ = Volume::write_ahead(self);
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), Errno> {
        // `Volume::discard` drops clean cached copies of whole blocks: a hint.
        if let Some((start, len)) = whole_blocks_inside(offset, len, Volume::block_size(self)) {
            self.discard(start, len)?;
        }
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), Errno> {
        Volume::write_zeroes(self, offset, len)?;
        if fua {
            Volume::flush(self)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tiercache_device::{MonotonicClock, SimDevice};
    use tiercache_engine::{create, CreateOptions, VolumeOptions};

    const BS: u64 = 4096;

    /// A fresh volume over simulated devices: a cache of 64 segments of 8 blocks, a backing
    /// device of 256 blocks holding 0x11 everywhere. Returns the devices too, for power cuts.
    fn volume() -> (Arc<Volume>, Arc<SimDevice>, Arc<SimDevice>) {
        let backing = Arc::new(SimDevice::from_image(vec![0x11; 256 * BS as usize], BS as u32));
        let log_blocks = 64 * 8;
        let ck = tiercache_format::Layout::checkpoint_blocks_for(log_blocks, BS as u32);
        let cache = Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * BS, BS as u32));
        create(&*cache, &*backing, &CreateOptions { segment_blocks: 8, ..CreateOptions::default() }).unwrap();
        let (v, _) = Volume::open(
            Arc::clone(&cache) as _,
            Arc::clone(&backing) as _,
            Arc::new(MonotonicClock::new()),
            VolumeOptions::default(),
        )
        .unwrap();
        (Arc::new(v), cache, backing)
    }

    fn read(io: &dyn ByteIo, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        io.read(offset, &mut buf).unwrap();
        buf
    }

    #[test]
    fn a_volume_round_trips_through_the_trait() {
        let (v, cache, backing) = volume();
        let io: Arc<dyn ByteIo> = v.clone();
        assert_eq!((io.size_bytes(), io.block_size()), (256 * BS, BS as u32));
        let mut model = vec![0x11u8; 256 * BS as usize];

        // Aligned, unaligned (one partial block, two partial edge blocks), FUA.
        let writes: [(u64, usize, u8, bool); 4] = [
            (0, 2 * BS as usize, 0xa1, false),
            (BS + 100, 50, 0xa2, false),
            (3 * BS - 7, 9000, 0xa3, true),
            (9 * BS, 3, 0xa4, true),
        ];
        for (offset, len, byte, fua) in writes {
            io.write(offset, &vec![byte; len], fua).unwrap();
            model[offset as usize..offset as usize + len].fill(byte);
        }
        io.write_zeroes(BS + 10, 2 * BS, false).unwrap();
        model[BS as usize + 10..3 * BS as usize + 10].fill(0);
        io.write_zeroes(20 * BS, 4 * BS, true).unwrap();
        model[20 * BS as usize..24 * BS as usize].fill(0);
        // A trim keeps the data (the volume drops clean cached copies only).
        io.trim(100, 30 * BS).unwrap();
        assert_eq!(read(&*io, 0, model.len()), model);
        assert_eq!(read(&*io, BS + 90, 70), model[BS as usize + 90..BS as usize + 160]);

        // The last FUA write and FUA write-zeroes made everything before them durable.
        io.write(40 * BS, &[0xee; 10], false).unwrap();
        let cut = |d: &SimDevice| Arc::new(SimDevice::from_image(d.durable_image(), BS as u32));
        let (v2, _) =
            Volume::open(cut(&cache), cut(&backing), Arc::new(MonotonicClock::new()), VolumeOptions::default())
                .unwrap();
        let mut after = read(&v2, 0, model.len());
        // The unflushed write may or may not have survived the power cut.
        after[40 * BS as usize..40 * BS as usize + 10].copy_from_slice(&model[40 * BS as usize..40 * BS as usize + 10]);
        assert_eq!(after, model);
        // The recovered volume serves the trait too.
        ByteIo::write(&v2, 5, &[0xb5; 3], false).unwrap();
        ByteIo::flush(&v2).unwrap();
        assert_eq!(read(&v2, 4, 5), [0xa1, 0xb5, 0xb5, 0xb5, 0xa1]);
    }

    #[test]
    fn volume_errors_arrive_as_errno() {
        let (v, _, _) = volume();
        let size = ByteIo::size_bytes(&*v);
        let e = ByteIo::write(&*v, size - 10, &[1; 20], false).unwrap_err();
        assert_eq!(e.get(), libc::ENOSPC);
        let e = ByteIo::read(&*v, size, &mut [0; 1]).unwrap_err();
        assert_eq!(e.get(), libc::ENOSPC);
        let e = ByteIo::write_zeroes(&*v, size - BS, 2 * BS, true).unwrap_err();
        assert_eq!(e.get(), libc::ENOSPC);
        // Nothing of the refused write-zeroes was written.
        let mut last = vec![0u8; BS as usize];
        ByteIo::read(&*v, size - BS, &mut last).unwrap();
        assert!(last.iter().all(|&b| b == 0x11));
    }
}
