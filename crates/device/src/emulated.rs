//! [`EmulatedDevice`]: a real device plus a latency, bandwidth and queueing model, so that an
//! Optane, a NAND NVMe, a RAID5 of SATA SSDs, an HDD or a USB disk can be reproduced on any
//! machine, deterministically, without root.
//!
//! The model, per request:
//! - a request takes the queue slot that frees first (`queue_depth` slots: an HDD has one, an
//!   SSD several) and starts when both it has arrived and the slot is free;
//! - its service time is a fixed latency (per kind), plus for rotating profiles a seek
//!   (`track_to_track + (full_stroke - track_to_track) * sqrt(distance / size)`, zero when
//!   the request starts where the last one ended) and half a rotation, plus the transfer time
//!   on a bandwidth "bus" that all slots share;
//! - a flush waits for every slot to drain and costs `flush_latency` if anything was written
//!   since the last flush (the device's volatile cache has data), `idle_flush_latency` if not.
//!
//! The data really goes to the inner device (a buffered file by default), so contents are
//! real and survive a process kill (the page cache keeps them); but the inner device is not
//! flushed, so an emulated device is not durable across host power loss. Crash behaviour is
//! the [`crate::SimDevice`]'s job; the emulated device's job is timing.
//!
//! Timing: sleeping alone overshoots by 50-100 µs on a loaded machine, so the wait sleeps
//! until [`SPIN_WINDOW`] before the deadline (with the thread's timer slack set to 1 ns) and
//! spins the rest, yielding so that other threads on the core still run. The deadline is
//! computed from the request's arrival, so the real I/O's own time is absorbed by the model
//! instead of added to it.

use crate::error::{DeviceError, Result};
use crate::file::{FileDevice, OpenOptions};
use crate::{check_request, BlockDevice, ReadRange};
use serde::Serialize;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long before a deadline the wait stops sleeping and starts spinning. Sleep wake-up
/// latency here was measured at ~55 µs on an idle machine; 200 µs leaves room for load.
pub const SPIN_WINDOW: Duration = Duration::from_micros(200);

/// The most requests of one `read_batch` or `write_batch` in flight at once: a batch is booked
/// a group this size at a time, the next group when the last of this one completes, the way a
/// `FileDevice` issues it (`uring::RING_ENTRIES` per io_uring submission). Booked all at once,
/// a batch of 256 scattered writes held an emulated HDD (one slot) for half a second before a
/// read that arrived after it, where the real device layer lets that read in after at most a
/// group.
pub(crate) const BATCH_GROUP: usize = crate::uring::RING_ENTRIES;

/// A rotating disk's mechanics.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SeekModel {
    /// Seek between neighbouring tracks (the shortest non-zero seek), in ns.
    pub track_to_track_ns: u64,
    /// Seek across the whole device, in ns.
    pub full_stroke_ns: u64,
    /// One rotation, in ns; a non-sequential request waits half of it on average.
    pub rotation_ns: u64,
}

/// A device's timing model, with the source of each number.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Profile {
    pub name: &'static str,
    pub summary: &'static str,
    /// Where the numbers come from.
    pub source: &'static str,
    /// Fixed per-request time of a read (command overhead plus media access), in ns.
    pub read_latency_ns: u64,
    /// Fixed per-request time of a write, in ns.
    pub write_latency_ns: u64,
    /// A flush that has written data to push out of the device's volatile cache, in ns.
    pub flush_latency_ns: u64,
    /// A flush when nothing was written since the last one, in ns.
    pub idle_flush_latency_ns: u64,
    pub read_bytes_per_second: u64,
    pub write_bytes_per_second: u64,
    /// Requests served in parallel (1 for a disk arm, many for an SSD).
    pub queue_depth: u32,
    pub seek: Option<SeekModel>,
    /// The rate of the "write 4 KiB, flush" loop this profile is tuned to reproduce.
    pub documented_fsyncs_per_second: f64,
}

const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const MB: u64 = 1_000_000;

/// Every profile, by name.
pub const PROFILES: &[Profile] = &[
    Profile {
        name: "optane",
        summary: "Intel Optane SSD DC P4800X class: ~10 us access, ~20,000 fsync/s",
        source: "docs/seeds.md §2 (Optane, ext4: 20,000-21,200 fsync/s, 0.047-0.050 ms); P4800X datasheet (10 us read/write latency, 2.5/2.2 GB/s)",
        read_latency_ns: 10 * US,
        write_latency_ns: 10 * US,
        flush_latency_ns: 38 * US,
        idle_flush_latency_ns: 5 * US,
        read_bytes_per_second: 2_500 * MB,
        write_bytes_per_second: 2_200 * MB,
        queue_depth: 8,
        seek: None,
        documented_fsyncs_per_second: 20_000.0,
    },
    Profile {
        name: "nvme",
        summary: "NAND NVMe SSD, Intel P3700 class: ~85 us reads, ~7,300 fsync/s",
        source: "docs/seeds.md §2 (NAND NVMe P3700: 7,300 fsync/s); P3700 datasheet (2.8/1.9 GB/s, 20 us write to its power-protected buffer); ~85 us QD1 4 KiB random read as commonly measured",
        read_latency_ns: 85 * US,
        write_latency_ns: 20 * US,
        flush_latency_ns: 114_800,
        idle_flush_latency_ns: 5 * US,
        read_bytes_per_second: 2_800 * MB,
        write_bytes_per_second: 1_900 * MB,
        queue_depth: 32,
        seek: None,
        documented_fsyncs_per_second: 7_300.0,
    },
    Profile {
        name: "sata-raid5",
        summary: "md RAID5 of 3 SATA SSDs: ~120 us reads, read-modify-write writes, ~1,000 fsync/s",
        source: "estimate for docs/seeds.md §1's baseline volume: SATA SSD 4 KiB read ~100-120 us and ~500 MB/s per drive (Intel S3520 class); a partial-stripe write reads then writes data and parity (~250 us); a flush empties three drives' volatile caches (~750 us); the seeds give no fsync figure",
        read_latency_ns: 120 * US,
        write_latency_ns: 245 * US,
        flush_latency_ns: 750 * US,
        idle_flush_latency_ns: 50 * US,
        read_bytes_per_second: 1_000 * MB,
        write_bytes_per_second: 900 * MB,
        queue_depth: 12,
        seek: None,
        documented_fsyncs_per_second: 1_000.0,
    },
    Profile {
        name: "hdd",
        summary: "7,200 rpm SATA disk, write cache off: ~100 random IOPS across the disk, ~200 on a short span, 180 MB/s sequential",
        source: "classic seek model (Ruemmler & Wilkes: sqrt of distance) with 0.4 ms track-to-track, 10 ms full stroke, 8.33 ms rotation; 180 MB/s media rate; writes are write-through, so a flush is cheap and each rewrite of a block pays a seek and half a rotation",
        read_latency_ns: 100 * US,
        write_latency_ns: 100 * US,
        flush_latency_ns: 100 * US,
        idle_flush_latency_ns: 100 * US,
        read_bytes_per_second: 180 * MB,
        write_bytes_per_second: 180 * MB,
        queue_depth: 1,
        seek: Some(SeekModel { track_to_track_ns: 400 * US, full_stroke_ns: 10 * MS, rotation_ns: 8_333_333 }),
        documented_fsyncs_per_second: 210.0,
    },
    Profile {
        name: "usb-disk",
        summary: "5,400 rpm disk behind a USB-SATA bridge: ~13 fsync/s, ~77 ms each",
        source: "docs/seeds.md §2 (slow USB SATA disk alone: 13 fsync/s, 75 ms); 5,400 rpm mechanics (1 ms track-to-track, 14 ms full stroke, 11.1 ms rotation), ~35 MB/s through USB 2.0, 0.5 ms per command; the flush (drive cache through the bridge) takes the rest of the 75 ms",
        read_latency_ns: 500 * US,
        write_latency_ns: 500 * US,
        flush_latency_ns: 69_700 * US,
        idle_flush_latency_ns: MS,
        read_bytes_per_second: 35 * MB,
        write_bytes_per_second: 35 * MB,
        queue_depth: 1,
        seek: Some(SeekModel { track_to_track_ns: MS, full_stroke_ns: 14 * MS, rotation_ns: 11_111_111 }),
        documented_fsyncs_per_second: 13.0,
    },
];

impl Profile {
    /// Looks a profile up by name.
    pub fn by_name(name: &str) -> Result<&'static Profile> {
        PROFILES.iter().find(|p| p.name == name).ok_or_else(|| DeviceError::UnknownProfile {
            name: name.to_string(),
            known: PROFILES.iter().map(|p| p.name).collect::<Vec<_>>().join(", "),
        })
    }

    fn transfer_ns(&self, len: u64, write: bool) -> u64 {
        let bw = if write { self.write_bytes_per_second } else { self.read_bytes_per_second };
        assert!(bw > 0);
        u64::try_from(u128::from(len) * 1_000_000_000 / u128::from(bw)).expect("transfer time fits")
    }

    /// Head movement cost from `head` to `offset` on a device of `size_bytes`.
    fn positioning_ns(&self, head: u64, offset: u64, size_bytes: u64) -> u64 {
        let Some(seek) = self.seek else { return 0 };
        if offset == head {
            return 0; // streaming: the next sector is under the head
        }
        let distance = offset.abs_diff(head) as f64 / size_bytes.max(1) as f64;
        let span = (seek.full_stroke_ns - seek.track_to_track_ns) as f64;
        seek.track_to_track_ns + (span * distance.min(1.0).sqrt()) as u64 + seek.rotation_ns / 2
    }

    /// What the model predicts for the fsync benchmark's loop (rewrite one 4 KiB block,
    /// flush) on a device of `size_bytes`, in ns per iteration.
    pub fn predicted_fsync_loop_ns(&self, size_bytes: u64) -> u64 {
        let block = 4096;
        self.write_latency_ns
            + self.positioning_ns(block, 0, size_bytes)
            + self.transfer_ns(block, true)
            + self.flush_latency_ns
    }
}

#[derive(Debug)]
struct ModelState {
    /// When each queue slot is next free, in ns since `origin`.
    slot_free_at_ns: Vec<u64>,
    /// When the shared transfer bus is next free, in ns since `origin`.
    bus_free_at_ns: u64,
    /// Where the last request ended (rotating profiles only).
    head_offset: u64,
    written_since_flush: bool,
}

/// Counters of what the device was asked to do (for reports and tests).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct EmulatedStats {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

/// A device with a timing model on top of a real one.
#[derive(Debug)]
pub struct EmulatedDevice<D: BlockDevice = FileDevice> {
    inner: D,
    profile: &'static Profile,
    origin: Instant,
    state: Mutex<ModelState>,
    stats: Mutex<EmulatedStats>,
}

impl EmulatedDevice<FileDevice> {
    /// Opens an existing file (buffered: the model, not the host's disk, sets the pace) and
    /// emulates `profile` on it.
    pub fn open(path: impl AsRef<Path>, profile: &'static Profile) -> Result<Self> {
        let inner = FileDevice::open_with(path, OpenOptions { direct: false, lock: true, read_only: false })?;
        Ok(Self::new(inner, profile))
    }
}

impl<D: BlockDevice> EmulatedDevice<D> {
    pub fn new(inner: D, profile: &'static Profile) -> Self {
        let depth = usize::try_from(profile.queue_depth).expect("queue depth fits usize");
        assert!(depth >= 1);
        EmulatedDevice {
            inner,
            profile,
            origin: Instant::now(),
            state: Mutex::new(ModelState {
                slot_free_at_ns: vec![0; depth],
                bus_free_at_ns: 0,
                head_offset: 0,
                written_since_flush: false,
            }),
            stats: Mutex::new(EmulatedStats::default()),
        }
    }

    pub fn profile(&self) -> &'static Profile {
        self.profile
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    pub fn stats(&self) -> EmulatedStats {
        *self.stats.lock().expect("stats lock")
    }

    /// When each queue slot frees, in the model's nanoseconds (tests read overlap from the
    /// bookings, which a loaded machine does not stretch).
    #[cfg(test)]
    pub(crate) fn booked_slots_ns(&self) -> Vec<u64> {
        self.state.lock().expect("model lock").slot_free_at_ns.clone()
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).expect("fits")
    }

    /// Books a data transfer in the model and returns its completion deadline.
    fn schedule_transfer(&self, offset: u64, len: u64, write: bool, fua: bool) -> Instant {
        let p = self.profile;
        let arrival = self.now_ns();
        let mut s = self.state.lock().expect("model lock");
        let (slot, slot_free) =
            s.slot_free_at_ns.iter().copied().enumerate().min_by_key(|&(_, t)| t).expect("at least one slot");
        let start = arrival.max(slot_free);
        let mut fixed = if write { p.write_latency_ns } else { p.read_latency_ns };
        fixed += p.positioning_ns(s.head_offset, offset, self.inner.size_bytes());
        if fua {
            fixed += p.flush_latency_ns;
        }
        let transfer = p.transfer_ns(len, write);
        let bus_start = start.max(s.bus_free_at_ns);
        s.bus_free_at_ns = bus_start + transfer;
        let done = (start + fixed + transfer).max(bus_start + transfer);
        s.slot_free_at_ns[slot] = done;
        s.head_offset = offset + len;
        if write && !fua {
            s.written_since_flush = true;
        }
        drop(s);
        let mut st = self.stats.lock().expect("stats lock");
        if write {
            st.writes += 1;
            st.bytes_written += len;
        } else {
            st.reads += 1;
            st.bytes_read += len;
        }
        self.origin + Duration::from_nanos(done)
    }

    /// Books a flush: it waits for every slot to drain, then occupies them all.
    fn schedule_flush(&self) -> Instant {
        let arrival = self.now_ns();
        let mut s = self.state.lock().expect("model lock");
        let drained = s.slot_free_at_ns.iter().copied().max().expect("slots").max(arrival);
        let cost =
            if s.written_since_flush { self.profile.flush_latency_ns } else { self.profile.idle_flush_latency_ns };
        let done = drained + cost;
        s.slot_free_at_ns.iter_mut().for_each(|t| *t = done);
        s.written_since_flush = false;
        drop(s);
        self.stats.lock().expect("stats lock").flushes += 1;
        self.origin + Duration::from_nanos(done)
    }
}

impl<D: BlockDevice> BlockDevice for EmulatedDevice<D> {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn logical_block_size(&self) -> u32 {
        self.inner.logical_block_size()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_request(self, offset, buf.len() as u64)?;
        let deadline = self.schedule_transfer(offset, buf.len() as u64, false, false);
        self.inner.read_at(offset, buf)?;
        precise_wait_until(deadline);
        Ok(())
    }

    fn read_vectored_at(&self, offset: u64, bufs: &mut [&mut [u8]]) -> Result<()> {
        // One transfer of the whole range, as the device would serve one scatter read.
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        check_request(self, offset, len)?;
        let deadline = self.schedule_transfer(offset, len, false, false);
        self.inner.read_vectored_at(offset, bufs)?;
        precise_wait_until(deadline);
        Ok(())
    }

    fn read_batch(&self, ranges: &mut [ReadRange<'_>]) -> Vec<Result<()>> {
        // A group at a time, as a `FileDevice` issues a batch (`BATCH_GROUP`). Each range of a
        // group is booked on arrival, as concurrent requests (each takes the queue slot that
        // frees first), then served by the device underneath; the group is done when its last
        // is. (A bad range is not booked: the device underneath refuses it with its precise
        // error.)
        let mut results = Vec::with_capacity(ranges.len());
        for group in ranges.chunks_mut(BATCH_GROUP) {
            let last = group
                .iter()
                .filter_map(|r| {
                    let len: u64 = r.bufs.iter().map(|b| b.len() as u64).sum();
                    check_request(self, r.offset, len)
                        .ok()
                        .map(|()| self.schedule_transfer(r.offset, len, false, false))
                })
                .max();
            results.extend(self.inner.read_batch(group));
            if let Some(last) = last {
                precise_wait_until(last);
            }
        }
        results
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        check_request(self, offset, buf.len() as u64)?;
        let deadline = self.schedule_transfer(offset, buf.len() as u64, true, false);
        self.inner.write_at(offset, buf)?;
        precise_wait_until(deadline);
        Ok(())
    }

    fn write_batch(&self, writes: &[(u64, &[u8])]) -> Vec<Result<()>> {
        // A group at a time, as a `FileDevice` issues a batch (`BATCH_GROUP`). Each write of a
        // group is booked on arrival, as concurrent requests (each takes the queue slot that
        // frees first), then handed to the device underneath; the group is done when its last
        // is. (A bad write is not booked: the device underneath refuses it with its precise
        // error.)
        let mut results = Vec::with_capacity(writes.len());
        for group in writes.chunks(BATCH_GROUP) {
            let last = group
                .iter()
                .filter_map(|&(offset, buf)| {
                    let len = buf.len() as u64;
                    check_request(self, offset, len).ok().map(|()| self.schedule_transfer(offset, len, true, false))
                })
                .max();
            results.extend(self.inner.write_batch(group));
            if let Some(last) = last {
                precise_wait_until(last);
            }
        }
        results
    }

    fn write_at_while(&self, offset: u64, buf: &[u8], during: &mut dyn FnMut()) -> Result<()> {
        // Booked and handed to the file underneath now; `during` runs in the device's service
        // time, which the wait then completes.
        if let Err(e) = check_request(self, offset, buf.len() as u64) {
            during();
            return Err(e);
        }
        let deadline = self.schedule_transfer(offset, buf.len() as u64, true, false);
        let written = self.inner.write_at(offset, buf);
        during();
        precise_wait_until(deadline);
        written
    }

    fn write_fua_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        check_request(self, offset, buf.len() as u64)?;
        let deadline = self.schedule_transfer(offset, buf.len() as u64, true, true);
        self.inner.write_at(offset, buf)?;
        precise_wait_until(deadline);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let deadline = self.schedule_flush();
        precise_wait_until(deadline);
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        check_request(self, offset, len)?;
        self.inner.discard(offset, len)
    }

    fn describe(&self) -> String {
        format!("emulated:{} on {}", self.profile.name, self.inner.describe())
    }

    fn identity(&self) -> Option<String> {
        self.inner.identity()
    }

    fn atomic_write_bytes(&self) -> u32 {
        self.inner.atomic_write_bytes()
    }
}

/// Waits until `deadline` with an accuracy of a few microseconds: sleeps while the deadline
/// is far, spins (yielding) through the last [`SPIN_WINDOW`].
pub fn precise_wait_until(deadline: Instant) {
    set_fine_timer_slack();
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let remaining = deadline - now;
        if remaining > SPIN_WINDOW {
            std::thread::sleep(remaining - SPIN_WINDOW);
        } else {
            std::thread::yield_now();
        }
    }
}

/// Asks the kernel to wake this thread's sleeps within 1 ns instead of the default 50 µs
/// slack; done once per thread.
fn set_fine_timer_slack() {
    thread_local! { static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) }; }
    DONE.with(|done| {
        if !done.get() {
            // SAFETY: PR_SET_TIMERSLACK takes an integer argument and touches no memory.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
            done.set(true);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimDevice;

    #[test]
    fn profiles_predict_their_documented_fsync_rate() {
        // The benchmark's temporary file is 1 GiB; the prediction must match the documented
        // figure within 2 % so that the 15 % acceptance band measures timing accuracy only.
        for p in PROFILES {
            let rate = 1e9 / p.predicted_fsync_loop_ns(1 << 30) as f64;
            let err = (rate - p.documented_fsyncs_per_second).abs() / p.documented_fsyncs_per_second;
            assert!(
                err < 0.02,
                "{}: model predicts {rate:.1}/s, documented {}",
                p.name,
                p.documented_fsyncs_per_second
            );
        }
    }

    #[test]
    fn unknown_profile_lists_the_known_ones() {
        let e = Profile::by_name("floppy").unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown device profile 'floppy'; known profiles: optane, nvme, sata-raid5, hdd, usb-disk"
        );
    }

    #[test]
    fn hdd_random_iops_depend_on_seek_distance() {
        let p = Profile::by_name("hdd").unwrap();
        let size = 1u64 << 40;
        // A distance of (8/15)^2 of the span has the mean sqrt-seek of uniformly random pairs.
        let mean_distance = size / 225 * 64;
        let full_span = p.read_latency_ns + p.positioning_ns(0, mean_distance, size) + p.transfer_ns(4096, false);
        let short = p.read_latency_ns + p.positioning_ns(0, size / 1000, size) + p.transfer_ns(4096, false);
        let full_iops = 1e9 / full_span as f64;
        let short_iops = 1e9 / short as f64;
        assert!((85.0..130.0).contains(&full_iops), "full-span IOPS {full_iops}");
        assert!((170.0..230.0).contains(&short_iops), "short-span IOPS {short_iops}");
        assert_eq!(p.positioning_ns(4096, 4096, size), 0, "sequential access does not seek");
    }

    #[test]
    fn data_goes_through_and_time_is_modelled() {
        let inner = SimDevice::new(1 << 20, 4096);
        let dev = EmulatedDevice::new(inner, Profile::by_name("usb-disk").unwrap());
        let data = vec![7u8; 4096];
        let t0 = Instant::now();
        dev.write_at(8192, &data).unwrap();
        dev.flush().unwrap();
        let elapsed = t0.elapsed();
        assert!(elapsed >= Duration::from_millis(70), "usb-disk write+flush took {elapsed:?}");
        let mut back = vec![0u8; 4096];
        dev.read_at(8192, &mut back).unwrap();
        assert_eq!(back, data);
        let st = dev.stats();
        assert_eq!((st.writes, st.flushes, st.reads), (1, 1, 1));
    }

    #[test]
    fn an_hdd_serves_one_request_at_a_time_an_ssd_several() {
        // Four concurrent reads: on a one-slot device they queue; on an eight-slot one they
        // overlap. Deadlines are checked through the model, not wall-clock assertions.
        for (name, serial) in [("hdd", true), ("optane", false)] {
            let dev = EmulatedDevice::new(SimDevice::new(1 << 20, 4096), Profile::by_name(name).unwrap());
            let deadlines: Vec<Instant> =
                (0..4).map(|i| dev.schedule_transfer(i * 65536, 4096, false, false)).collect();
            let spread = *deadlines.iter().max().unwrap() - *deadlines.iter().min().unwrap();
            let one = Duration::from_nanos(dev.profile.read_latency_ns);
            if serial {
                assert!(spread >= one * 3, "{name}: {spread:?}");
            } else {
                assert!(spread < one, "{name}: {spread:?}");
            }
        }
    }

    #[test]
    fn a_batch_is_booked_as_concurrent_requests() {
        // Four ranges in one batch on an eight-slot device take four different slots (they
        // overlap); on a one-slot device they queue. Checked through the model's booking.
        for (name, slots_used) in [("optane", 4), ("hdd", 1)] {
            let dev = EmulatedDevice::new(SimDevice::new(1 << 20, 4096), Profile::by_name(name).unwrap());
            let mut bufs: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; 4096]).collect();
            let mut ranges: Vec<ReadRange<'_>> = bufs
                .iter_mut()
                .enumerate()
                .map(|(i, b)| ReadRange { offset: i as u64 * 65536, bufs: vec![&mut b[..]] })
                .collect();
            let started = Instant::now();
            assert!(dev.read_batch(&mut ranges).iter().all(|r| r.is_ok()));
            assert!(started.elapsed() >= Duration::from_nanos(dev.profile.read_latency_ns), "{name}: never early");
            let s = dev.state.lock().unwrap();
            let used = s.slot_free_at_ns.iter().filter(|&&t| t > 0).count();
            assert_eq!(used, slots_used, "{name}");
            assert_eq!(dev.stats().reads, 4);
        }
    }

    #[test]
    fn a_batch_is_issued_a_group_at_a_time_as_a_file_device_issues_it() {
        // The device underneath sees a batch in groups of `BATCH_GROUP` (io_uring's ring), each
        // booked and waited for before the next (so a request arriving meanwhile from another
        // thread queues behind one group, not behind the whole batch).
        struct Groups {
            inner: SimDevice,
            seen: Mutex<Vec<usize>>,
        }
        impl BlockDevice for Groups {
            fn size_bytes(&self) -> u64 {
                self.inner.size_bytes()
            }
            fn logical_block_size(&self) -> u32 {
                self.inner.logical_block_size()
            }
            fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
                self.inner.read_at(offset, buf)
            }
            fn read_batch(&self, ranges: &mut [ReadRange<'_>]) -> Vec<Result<()>> {
                self.seen.lock().unwrap().push(ranges.len());
                self.inner.read_batch(ranges)
            }
            fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
                self.inner.write_at(offset, buf)
            }
            fn write_batch(&self, writes: &[(u64, &[u8])]) -> Vec<Result<()>> {
                self.seen.lock().unwrap().push(writes.len());
                self.inner.write_batch(writes)
            }
            fn flush(&self) -> Result<()> {
                self.inner.flush()
            }
            fn discard(&self, offset: u64, len: u64) -> Result<()> {
                self.inner.discard(offset, len)
            }
            fn describe(&self) -> String {
                "groups".into()
            }
        }
        let n = 2 * BATCH_GROUP + 5;
        let inner = Groups { inner: SimDevice::new(1 << 20, 4096), seen: Mutex::new(Vec::new()) };
        let dev = EmulatedDevice::new(inner, Profile::by_name("optane").unwrap());
        let data: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; 4096]).collect();
        let writes: Vec<(u64, &[u8])> = data.iter().enumerate().map(|(i, d)| (i as u64 * 4096, &d[..])).collect();
        assert!(dev.write_batch(&writes).iter().all(|r| r.is_ok()));
        assert_eq!(*dev.inner.seen.lock().unwrap(), [BATCH_GROUP, BATCH_GROUP, 5]);
        assert_eq!(dev.stats().writes, n as u64);
        dev.inner.seen.lock().unwrap().clear();
        let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; 4096]).collect();
        let mut ranges: Vec<ReadRange<'_>> = bufs
            .iter_mut()
            .enumerate()
            .map(|(i, b)| ReadRange { offset: i as u64 * 4096, bufs: vec![&mut b[..]] })
            .collect();
        assert!(dev.read_batch(&mut ranges).iter().all(|r| r.is_ok()));
        assert_eq!(*dev.inner.seen.lock().unwrap(), [BATCH_GROUP, BATCH_GROUP, 5]);
        assert_eq!(bufs, data, "every group's data read into place");
        assert_eq!(dev.stats().reads, n as u64);
    }

    #[test]
    fn precise_wait_never_returns_early() {
        // Accuracy (how late) is measured by `tiercache bench fsync`, not asserted here: the
        // machine is shared. Never returning early is deterministic and is what the model needs.
        for us in [0, 1, 30, 250, 1200] {
            let deadline = Instant::now() + Duration::from_micros(us);
            precise_wait_until(deadline);
            assert!(Instant::now() >= deadline);
        }
    }
}

/// Adversarial review of `EmulatedDevice::read_batch` (commit 394453e).
#[cfg(test)]
mod adversarial_batch_tests {
    use super::*;
    use crate::SimDevice;
    use std::time::{Duration, Instant};

    /// A batch with a bad range: the bad one is refused and not booked, the good ones are
    /// read and booked; on a one-slot device the batch lasts at least the good ranges' fixed
    /// latencies added up. (An upper bound for the concurrent profile is timing-flaky on a
    /// loaded 2-core machine, so it is not asserted.)
    #[test]
    fn adv_batch_with_a_bad_range_books_only_the_good_ones() {
        for (name, queued) in [("hdd", true), ("optane", false)] {
            let sim = SimDevice::new(1 << 20, 4096);
            sim.write_at(65536, &[7u8; 4096]).unwrap();
            let dev = EmulatedDevice::new(sim, Profile::by_name(name).unwrap());
            let mut bufs: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; 4096]).collect();
            let mut bad = vec![0u8; 4096];
            let started = Instant::now();
            let results = {
                let mut ranges: Vec<ReadRange<'_>> = bufs
                    .iter_mut()
                    .enumerate()
                    .map(|(i, b)| ReadRange { offset: (i as u64 + 1) * 65536, bufs: vec![&mut b[..]] })
                    .collect();
                ranges.insert(2, ReadRange { offset: 1 << 20, bufs: vec![&mut bad[..]] });
                dev.read_batch(&mut ranges)
            };
            let took = started.elapsed();
            assert_eq!(results.len(), 5);
            assert!(matches!(results[2], Err(DeviceError::OutOfRange { .. })), "{:?}", results[2]);
            assert!(results.iter().enumerate().all(|(i, r)| i == 2 || r.is_ok()));
            assert_eq!(bufs[0], vec![7u8; 4096]);
            assert_eq!(dev.stats().reads, 4, "{name}");
            assert_eq!(dev.stats().bytes_read, 4 * 4096, "{name}");
            let sum = Duration::from_nanos(4 * dev.profile.read_latency_ns);
            if queued {
                assert!(took >= sum, "{name}: {took:?} < {sum:?}");
            }
        }
    }
}
