//! Adversarial review of 5288a3e ("Backing fingerprints hashed with XXH3 for new caches"):
//! the superblock's `fingerprint_hash` (offset 368; 0 CRC-32C, kept for life by caches
//! formatted before the field; 1 the low 32 bits of XXH3-64, what `create` writes). Each test
//! is one suspicion; its comment says "Refuted (passes)" or "Failed: <what>".
//! (The format crate's half, decode and the field's bytes, is in
//! crates/format/tests/adversarial_fingerprint_hash.rs.)

use std::sync::{Arc, Mutex};
use tiercache_device::{BlockDevice, MonotonicClock, SimDevice};
use tiercache_engine::{create, CreateOptions, EngineError, Volume};
use tiercache_format::{FingerprintHash, Superblock};

mod common;
use common::*;

const BLOCKS: u64 = 64;
/// `fingerprint_blocks` of a 64-block backing device with 4 KiB blocks.
const FP_BLOCKS: [u64; 4] = [0, 1, 16, 63];

/// The raw `fingerprint_hash` field of both superblock copies of a cache image (block 0 and
/// block 1), and whether everything after it (the new `reserved`) is zero.
fn raw_fields(image: &[u8]) -> [(u32, bool); 2] {
    [0, BS].map(|at| {
        let b = &image[at..at + 512];
        (u32::from_le_bytes(b[368..372].try_into().unwrap()), b[372..512].iter().all(|&x| x == 0))
    })
}

/// An old build's superblock check, reasoned from its decode (before 5288a3e): the copy's
/// checksum holds and all 144 bytes of `reserved` (368..512) are zero; its other checks are
/// this build's own.
fn old_build_accepts_copy(copy: &[u8]) -> bool {
    let stored = u32::from_le_bytes(copy[..4].try_into().unwrap());
    Superblock::decode(copy).is_ok()
        && stored == tiercache_format::checksum(&copy[4..512])
        && copy[368..512].iter().all(|&b| b == 0)
}

/// Rewrites both superblock copies as a cache formatted before `fingerprint_hash` existed has
/// them: field zero, CRC-32C fingerprints of `backing`.
fn as_formatted_with_crc32c(cache: &SimDevice, backing: &SimDevice) {
    for copy in 0..2u64 {
        let mut block = vec![0u8; BS];
        cache.read_at(copy * BS as u64, &mut block).unwrap();
        let mut sb = Superblock::decode(&block).unwrap();
        sb.fingerprint_hash = FingerprintHash::Crc32c;
        let blocks = sb.fingerprint_blocks();
        for (f, b) in sb.backing_fingerprints.iter_mut().zip(blocks) {
            let mut data = vec![0u8; sb.layout.block_size as usize];
            backing.read_at(b * u64::from(sb.layout.block_size), &mut data).unwrap();
            f.crc = FingerprintHash::Crc32c.of(&data);
        }
        sb.encode(&mut block);
        cache.write_at(copy * BS as u64, &block).unwrap();
    }
    cache.flush().unwrap();
}

/// A cache and a 64-block backing device whose fingerprints are hashed by `hash`.
fn devices_with(hash: FingerprintHash) -> (Arc<SimDevice>, Arc<SimDevice>) {
    let (cache, backing) = devices(8, BLOCKS);
    if hash == FingerprintHash::Crc32c {
        as_formatted_with_crc32c(&cache, &backing);
    }
    assert_eq!(raw_fields(&cache.durable_image()), [(hash as u32, true); 2]);
    (cache, backing)
}

/// Every stored fingerprint of a reopened (settled) volume is `hash` of the backing block now,
/// with no write-back in flight.
fn assert_fingerprints_true(sb: &Superblock, backing: &SimDevice, hash: FingerprintHash, what: &str) {
    assert_eq!(sb.fingerprint_hash, hash, "{what}: the hash changed");
    let image = backing.current_image();
    for (f, b) in sb.backing_fingerprints.iter().zip(sb.fingerprint_blocks()) {
        let at = b as usize * BS;
        assert_eq!(f.crc, hash.of(&image[at..at + BS]), "{what}: block {b}'s fingerprint is not {}'s", hash.name());
        assert_eq!(f.next, None, "{what}: block {b} still in flight");
    }
}

// ------------------------------------------------------------------------------ power cuts

/// Both devices' images at one instant of a write-back: a power cut there may leave any
/// subset of each device's unflushed writes; the tests take the extremes, and a torn backing
/// copy of each fingerprint block.
#[derive(Clone)]
struct Snap {
    label: String,
    cache_durable: Vec<u8>,
    cache_current: Vec<u8>,
    backing_durable: Vec<u8>,
    backing_current: Vec<u8>,
}

struct Recorder {
    cache: Arc<SimDevice>,
    backing: Arc<SimDevice>,
    on: Mutex<bool>,
    snaps: Mutex<Vec<Snap>>,
}

impl Recorder {
    fn snap(&self, label: String) {
        if !*self.on.lock().unwrap() {
            return;
        }
        self.snaps.lock().unwrap().push(Snap {
            label,
            cache_durable: self.cache.durable_image(),
            cache_current: self.cache.current_image(),
            backing_durable: self.backing.durable_image(),
            backing_current: self.backing.current_image(),
        });
    }
}

/// A device that snapshots both devices before each of its flushes and after each write.
struct Tap {
    inner: Arc<SimDevice>,
    role: &'static str,
    rec: Arc<Recorder>,
}

impl BlockDevice for Tap {
    forward_to_inner!(inner: size_bytes, logical_block_size, read_at, read_vectored_at, read_batch, read_batch_each,
        discard, describe, identity, atomic_write_bytes);
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        let r = self.inner.write_at(offset, buf);
        self.rec.snap(format!("after a {} write at block {}", self.role, offset / BS as u64));
        r
    }
    fn flush(&self) -> tiercache_device::Result<()> {
        self.rec.snap(format!("before a {} flush", self.role));
        self.inner.flush()
    }
}

/// The images a power cut at `snap` can leave, by name: cache durable or current, backing
/// durable, current, or current with the second half of every fingerprint block torn back to
/// its durable content.
fn cuts(snap: &Snap) -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let mut torn = snap.backing_current.clone();
    for b in FP_BLOCKS {
        let at = b as usize * BS;
        torn[at + BS / 2..at + BS].copy_from_slice(&snap.backing_durable[at + BS / 2..at + BS]);
    }
    let mut out = Vec::new();
    for (c, cache) in [("cache durable", &snap.cache_durable), ("cache current", &snap.cache_current)] {
        for (b, backing) in
            [("backing durable", &snap.backing_durable), ("backing current", &snap.backing_current), ("torn", &torn)]
        {
            out.push((format!("{}: {c}, {b}", snap.label), cache.clone(), backing.clone()));
        }
    }
    out
}

/// Suspicion: the torn-write allowance and the fingerprint phases depend on the hash: a
/// CRC-32C cache (field 0) or an XXH3 cache, cut at every write and flush of a write-back of
/// all four fingerprint blocks (phase 1's superblock, the backing writes and flush, phase 3's
/// superblock), reopens; its superblock copies still carry its own hash (old-build-readable
/// for CRC-32C: bytes 368..512 zero); the newest data reads back; and a full write-back after
/// recovery leaves fingerprints that are that hash of the backing blocks.
/// Refuted (passes): both hashes, every cut, including torn fingerprint blocks that match
/// neither fingerprint (the allowance is exercised: counted).
#[test]
fn a_power_cut_at_every_step_of_a_fingerprint_write_back_keeps_each_hash() {
    for hash in [FingerprintHash::Crc32c, FingerprintHash::Xxh3] {
        let (cache, backing) = devices_with(hash);
        let rec = Arc::new(Recorder {
            cache: cache.clone(),
            backing: backing.clone(),
            on: Mutex::new(false),
            snaps: Mutex::new(Vec::new()),
        });
        let tc: Arc<dyn BlockDevice> = Arc::new(Tap { inner: cache.clone(), role: "cache", rec: rec.clone() });
        let tb: Arc<dyn BlockDevice> = Arc::new(Tap { inner: backing.clone(), role: "backing", rec: rec.clone() });
        let volume = try_open(tc, tb).unwrap();
        for b in FP_BLOCKS {
            write(&volume, b, 1);
        }
        volume.flush().unwrap();
        *rec.on.lock().unwrap() = true;
        volume.write_back_all(1.0, |_, _| true).unwrap();
        *rec.on.lock().unwrap() = false;
        assert_fingerprints_true(&volume.superblock(), &backing, hash, "the live volume");
        drop(volume);
        let snaps = rec.snaps.lock().unwrap().clone();
        assert!(snaps.len() >= 4, "{} snapshots", snaps.len());
        let (mut in_flight, mut allowance_used, mut opened) = (0, 0, 0);
        for snap in &snaps {
            for (what, cache_img, backing_img) in cuts(snap) {
                for (copy, (field, rest_zero)) in raw_fields(&cache_img).into_iter().enumerate() {
                    assert_eq!(field, hash as u32, "{what}: copy {copy}'s field");
                    assert!(rest_zero, "{what}: copy {copy}'s reserved is not zero");
                    if hash == FingerprintHash::Crc32c {
                        let at = copy * BS;
                        assert!(
                            old_build_accepts_copy(&cache_img[at..at + BS]),
                            "{what}: an old build refuses copy {copy}"
                        );
                    }
                }
                let sb =
                    tiercache_engine::read_superblock(&SimDevice::from_image(cache_img.clone(), BS as u32)).unwrap();
                assert_eq!(sb.fingerprint_hash, hash, "{what}");
                for (f, b) in sb.backing_fingerprints.iter().zip(FP_BLOCKS) {
                    if let Some(next) = f.next {
                        in_flight += 1;
                        assert_eq!(next, hash.of(&stamp(b, 1)), "{what}: block {b}'s next is not {}'s", hash.name());
                    }
                    let at = b as usize * BS;
                    let now = hash.of(&backing_img[at..at + BS]);
                    if now != f.crc && Some(now) != f.next {
                        allowance_used += 1;
                    }
                }
                let c = Arc::new(SimDevice::from_image(cache_img, BS as u32));
                let bk = Arc::new(SimDevice::from_image(backing_img, BS as u32));
                let v =
                    try_open(c.clone(), bk.clone()).unwrap_or_else(|e| panic!("{}: {what}: refused: {e}", hash.name()));
                opened += 1;
                assert_eq!(v.superblock().fingerprint_hash, hash, "{what}");
                for b in FP_BLOCKS {
                    assert_eq!(read_version(&v, b).unwrap(), Some(1), "{what}: block {b}");
                }
                v.write_back_all(1.0, |_, _| true).unwrap();
                drop(v);
                let v = open(c.clone(), bk.clone());
                assert_fingerprints_true(&v.superblock(), &bk, hash, &what);
                drop(v);
                assert_eq!(raw_fields(&c.durable_image()), [(hash as u32, true); 2], "{what}: after recovery");
            }
        }
        assert!(in_flight > 0, "{}: no cut saw phase 1's superblock", hash.name());
        assert!(allowance_used > 0, "{}: no cut needed the torn-block allowance", hash.name());
        eprintln!("{}: {} cuts opened, {in_flight} in flight, {allowance_used} torn", hash.name(), opened);
    }
}

/// Suspicion: a lost fingerprint block with a torn write-back (adversarial.rs, suspicion 5)
/// locks a CRC-32C cache out: the allowance's lost branch was only tested on XXH3 caches
/// since `create` changed.
/// Refuted (passes): both hashes.
#[test]
fn a_lost_torn_fingerprint_block_does_not_lock_out_either_hash() {
    for hash in [FingerprintHash::Crc32c, FingerprintHash::Xxh3] {
        let (cache, backing) = devices_with(hash);
        let gated = Gate::new(Arc::clone(&backing));
        let volume = Arc::new(open(cache.clone(), gated.clone()));
        write(&volume, 0, 1);
        volume.flush().unwrap();
        gated.hold_flush(0);
        let destager = on_thread(&volume, move |v| v.destage_step(64));
        gated.wait_until_held();
        let cache2 = durable_copy(&cache);
        let mut img = backing.durable_image();
        img[..BS / 2].copy_from_slice(&stamp(0, 1)[..BS / 2]);
        let backing2 = Arc::new(SimDevice::from_image(img, BS as u32));
        gated.open_gate();
        destager.join().unwrap().unwrap();
        drop(volume);
        let volume = open(cache2.clone(), backing2.clone());
        assert_eq!(volume.superblock().fingerprint_hash, hash);
        assert!(volume.superblock().backing_fingerprints[0].next.is_some());
        let (slot, _) = slot_of(&volume, 0).unwrap();
        cache2.write_at(volume.superblock().layout.log_offset(u64::from(slot)), &vec![0xEEu8; BS]).unwrap();
        cache2.flush().unwrap();
        assert!(is_lost(&read_version(&volume, 0), 0));
        drop(volume);
        let r = try_open(cache2.clone(), backing2.clone());
        let v = r.unwrap_or_else(|e| panic!("{}: locked out: {e}", hash.name()));
        assert_eq!(v.superblock().fingerprint_hash, hash);
        // Rewritten, written back: the fingerprint is the hash's again, the flag clear.
        write(&v, 0, 2);
        v.write_back_all(1.0, |_, _| true).unwrap();
        drop(v);
        let v = open(cache2, backing2.clone());
        assert_fingerprints_true(&v.superblock(), &backing2, hash, hash.name());
    }
}

// ------------------------------------------------------------------------------ attach paths

/// Suspicion: a path other than `Volume::open` (`Volume::inspect` with a backing device, which
/// `status` and `check` use) compares fingerprints with CRC-32C, or with XXH3 for an old cache.
/// Refuted (passes): inspect accepts the right device under both hashes and refuses a changed
/// block 16 naming the hash, in the documented words ("its block B (bytes S..E) has
/// fingerprint X (hash), the cache expects Y").
#[test]
fn inspect_checks_fingerprints_with_the_superblocks_hash() {
    for hash in [FingerprintHash::Crc32c, FingerprintHash::Xxh3] {
        let (cache, backing) = devices_with(hash);
        let clock = Arc::new(MonotonicClock::new());
        let v = Volume::inspect(cache.clone(), Some(backing.clone() as Arc<dyn BlockDevice>), clock.clone())
            .unwrap_or_else(|e| panic!("{}: inspect refused the right device: {e}", hash.name()));
        assert_eq!(v.superblock().fingerprint_hash, hash);
        drop(v);
        let expected = v_expected(&cache);
        backing.write_at(16 * BS as u64, &stamp(16, 9)).unwrap();
        let got = hash.of(&stamp(16, 9));
        let want = format!(
            "its block 16 (bytes {}..{}) has fingerprint {got:#010x} ({}), the cache expects {:#010x}",
            16 * BS,
            17 * BS,
            hash.name(),
            expected[2]
        );
        for r in [
            Volume::inspect(cache.clone(), Some(backing.clone() as Arc<dyn BlockDevice>), clock.clone()).map(|_| ()),
            try_open(cache.clone(), backing.clone()).map(|_| ()),
        ] {
            match r {
                Err(EngineError::WrongBacking { reason, .. }) => assert!(reason.starts_with(&want), "{reason}"),
                Err(e) => panic!("wrong error: {e}"),
                Ok(()) => panic!("{}: a changed fingerprint block was accepted", hash.name()),
            }
        }
    }
}

fn v_expected(cache: &SimDevice) -> [u32; 4] {
    tiercache_engine::read_superblock(cache).unwrap().backing_fingerprints.map(|f| f.crc)
}

/// Suspicion: an old CRC-32C cache is silently converted (or its fingerprints recomputed with
/// XXH3) by an open, a checkpoint, a FLUSH, a write-back of non-fingerprint blocks, or reopen
/// after reopen; a build before the change could then no longer open it.
/// Refuted (passes): after all of them both copies still hold field 0 and reserved zero (an
/// old build accepts them), and the fingerprints are CRC-32C's of the backing blocks.
#[test]
fn a_crc32c_cache_stays_readable_by_an_old_build_through_everything() {
    let (cache, backing) = devices_with(FingerprintHash::Crc32c);
    for round in 0..3u64 {
        let v = open(cache.clone(), backing.clone());
        for b in 2..12 {
            write(&v, b, round + 1);
        }
        write(&v, 63, round + 1); // a fingerprint block too
        v.flush().unwrap();
        v.write_back_all(1.0, |_, _| true).unwrap();
        drop(v);
        let img = cache.durable_image();
        assert_eq!(raw_fields(&img), [(0, true); 2], "round {round}");
        for copy in 0..2 {
            assert!(old_build_accepts_copy(&img[copy * BS..(copy + 1) * BS]), "round {round}: copy {copy}");
        }
        let v = open(cache.clone(), backing.clone());
        assert_fingerprints_true(&v.superblock(), &backing, FingerprintHash::Crc32c, "reopened");
    }
}

/// Suspicion: an XXH3 cache is still accepted by a build before the change (which would check
/// its XXH3 fingerprints as CRC-32C and refuse the right device by block, or worse).
/// Refuted (passes): both copies carry 1 at 368 from `create` on, so an old build's decode
/// refuses every copy as "reserved: non-zero padding", before any fingerprint is compared.
#[test]
fn an_old_build_refuses_every_copy_of_an_xxh3_cache() {
    let (cache, backing) = devices_with(FingerprintHash::Xxh3);
    let v = open(cache.clone(), backing.clone());
    write(&v, 0, 1);
    v.write_back_all(1.0, |_, _| true).unwrap();
    drop(v);
    let img = cache.durable_image();
    for copy in 0..2 {
        assert!(!old_build_accepts_copy(&img[copy * BS..(copy + 1) * BS]), "copy {copy}");
        assert_eq!(&img[copy * BS + 368..copy * BS + 372], &[1, 0, 0, 0]);
    }
}

// ------------------------------------------------------------------------------ create

/// Suspicion: `create` over an existing CRC-32C cache (what `create --force` runs) keeps the
/// old hash, or leaves one copy carrying it.
/// Refuted (passes): both copies are XXH3 with XXH3 fingerprints of the backing blocks.
#[test]
fn create_over_a_crc32c_cache_makes_an_xxh3_cache() {
    let (cache, backing) = devices_with(FingerprintHash::Crc32c);
    let v = open(cache.clone(), backing.clone());
    write(&v, 0, 3);
    v.write_back_all(1.0, |_, _| true).unwrap(); // sequence > 1
    drop(v);
    create(&*cache, &*backing, &CreateOptions { segment_blocks: 8, ..log_only() }).unwrap();
    assert_eq!(raw_fields(&cache.durable_image()), [(1, true); 2]);
    let v = open(cache.clone(), backing.clone());
    assert_fingerprints_true(&v.superblock(), &backing, FingerprintHash::Xxh3, "re-created");
}

/// Suspicion: a power cut inside `create` over an old cache (copy B written, copy A not, or
/// the reverse) brings back the old CRC-32C superblock; docs/format.md 3 says "Until the
/// superblock is durable, the device is not a cache, and no copy of an earlier volume
/// survives".
/// Each mixed state must either be refused, or open as the new XXH3 cache; opening as the old
/// cache (its hash, its UUID) would contradict the doc.
/// Refuted (passes): where the old copy wins (a higher sequence, or the tie going to block 0)
/// open refuses it ("no valid checkpoint": create's checkpoints carry the new UUID), so the
/// old CRC-32C cache never comes back; otherwise the new XXH3 cache opens. (The refusal called
/// the device "corrupt" alone, where "create was cut short" is the truth: it now says that too.)
#[test]
fn a_power_cut_inside_create_over_an_old_cache_never_opens_the_old_cache() {
    for old_seq_high in [false, true] {
        let (cache, backing) = devices_with(FingerprintHash::Crc32c);
        let v = open(cache.clone(), backing.clone());
        write(&v, 5, 1);
        if old_seq_high {
            write(&v, 0, 1);
            v.write_back_all(1.0, |_, _| true).unwrap();
        }
        v.flush().unwrap();
        let old_uuid = v.superblock().uuid;
        drop(v);
        let old = cache.durable_image();
        create(&*cache, &*backing, &CreateOptions { segment_blocks: 8, ..log_only() }).unwrap();
        let new = cache.durable_image();
        for (name, keep_old) in [("copy A old, copy B new", 0usize), ("copy A new, copy B old", 1)] {
            let mut img = new.clone();
            img[keep_old * BS..(keep_old + 1) * BS].copy_from_slice(&old[keep_old * BS..(keep_old + 1) * BS]);
            let what = format!("old sequence high {old_seq_high}: {name}");
            match try_open(Arc::new(SimDevice::from_image(img, BS as u32)), backing.clone()) {
                Err(e) => {
                    eprintln!("{what}: refused: {e}");
                    assert!(e.to_string().contains("was cut short, run it again"), "{what}: {e}");
                }
                Ok(v) => {
                    let sb = v.superblock();
                    eprintln!("{what}: opened, hash {}", sb.fingerprint_hash.name());
                    assert_ne!(sb.uuid, old_uuid, "{what}: the old cache came back");
                    assert_eq!(sb.fingerprint_hash, FingerprintHash::Xxh3, "{what}");
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------ 64 KiB blocks

/// Suspicion: with 64 KiB blocks, fingerprint blocks coincide (0, 0, 1, last: "coinciding
/// blocks simply store the same CRC"); a write-back of block 0 must update both entries with
/// the superblock's hash, or the next attach refuses the right device.
/// Refuted (passes): both hashes.
#[test]
fn coinciding_fingerprint_blocks_with_64k_blocks_follow_a_write_back() {
    const B64: usize = 65536;
    for hash in [FingerprintHash::Crc32c, FingerprintHash::Xxh3] {
        let blocks = 8u64;
        let log_blocks = 64u64;
        let ck = tiercache_format::Layout::checkpoint_blocks_for(log_blocks, B64 as u32);
        let cache = Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * B64 as u64, BS as u32));
        let image: Vec<u8> = (0..blocks as usize * B64).map(|i| (i / 7) as u8).collect();
        let backing = Arc::new(SimDevice::from_image(image, BS as u32));
        create(&*cache, &*backing, &CreateOptions { block_size: B64 as u32, segment_blocks: 8, ..log_only() }).unwrap();
        if hash == FingerprintHash::Crc32c {
            for copy in 0..2u64 {
                let mut block = vec![0u8; B64];
                cache.read_at(copy * B64 as u64, &mut block).unwrap();
                let mut sb = Superblock::decode(&block).unwrap();
                sb.fingerprint_hash = FingerprintHash::Crc32c;
                let fbs = sb.fingerprint_blocks();
                for (f, b) in sb.backing_fingerprints.iter_mut().zip(fbs) {
                    let mut data = vec![0u8; B64];
                    backing.read_at(b * B64 as u64, &mut data).unwrap();
                    f.crc = FingerprintHash::Crc32c.of(&data);
                }
                sb.encode(&mut block);
                cache.write_at(copy * B64 as u64, &block).unwrap();
            }
            cache.flush().unwrap();
        }
        let sb = tiercache_engine::read_superblock(&*cache).unwrap();
        assert_eq!(sb.fingerprint_blocks(), [0, 0, 1, blocks - 1]);
        assert_eq!(sb.fingerprint_hash, hash);
        let v = open(cache.clone(), backing.clone());
        v.write(0, &vec![0x5Au8; B64]).unwrap();
        v.flush().unwrap();
        v.write_back_all(1.0, |_, _| true).unwrap();
        let sb = v.superblock();
        assert_eq!(sb.backing_fingerprints[0].crc, hash.of(&vec![0x5Au8; B64]));
        assert_eq!(sb.backing_fingerprints[1].crc, hash.of(&vec![0x5Au8; B64]));
        drop(v);
        let v = try_open(cache.clone(), backing.clone()).unwrap_or_else(|e| panic!("{}: {e}", hash.name()));
        assert_eq!(v.superblock().fingerprint_hash, hash);
    }
}

// ------------------------------------------------------------------------------ old caches

/// Suspicion: the fix reaches caches formatted before it (the audit's case: an ext4 backing
/// device whose superblock changed outside the cache). It does not, by design ("caches
/// formatted before keep it for their life", docs/format.md 3, README): no open, write-back
/// or command upgrades the hash; only `create` (losing the cache's content) does.
/// Confirmed as the documented limitation (passes, pinning it): a CRC-32C cache still accepts
/// a backing device whose ext4 block 0 changed outside it, and still does after a write-back
/// of block 0 and reopen; nothing in status or check says which hash a cache uses.
#[test]
fn an_old_cache_stays_blind_to_the_audits_case() {
    let (cache, backing) = devices(8, BLOCKS);
    backing.write_at(0, &ext4_block0(1)).unwrap();
    backing.flush().unwrap();
    as_formatted_with_crc32c(&cache, &backing);
    let v = open(cache.clone(), backing.clone());
    v.write(0, &ext4_block0(3)).unwrap();
    v.write_back_all(1.0, |_, _| true).unwrap();
    drop(v);
    backing.write_at(0, &ext4_block0(4)).unwrap(); // changed outside the cache
    let v = try_open(cache.clone(), backing.clone()).expect("CRC-32C is blind to it");
    assert_eq!(v.superblock().fingerprint_hash, FingerprintHash::Crc32c);
}
