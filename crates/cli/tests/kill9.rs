//! Proves that a FLUSH acknowledged by a real tiercache process survives SIGKILL at any
//! moment: a child process writes stamped blocks through the volume on real files and prints
//! `flushed I` after each FLUSH; the test kills it with SIGKILL mid-run, recovers the volume
//! from the files, and checks every block against the writes the child had acknowledged.
//! `tiercache check` must then find the cache consistent.

mod common;

use common::{debug_load_blocks, p, stamped_version, tiercache_cmd, TempVolume};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_device::{BlockDevice, FileDevice, MonotonicClock};
use tiercache_engine::{Volume, VolumeOptions};

const BS: usize = 4096;
const BLOCKS: u64 = 512;

fn kill_mid_write(seed: u64, run_for: Duration) {
    let vol = TempVolume::new(BLOCKS * BS as u64);
    let (cache, backing) = (&vol.cache, &vol.backing);
    // A 16 MiB cache: the log wraps several times during the run.
    std::fs::File::create(cache).unwrap().set_len(16 << 20).unwrap();
    let mut child = tiercache_cmd()
        .args(["debug-load", "--create", "--seed", &seed.to_string(), "--blocks", &BLOCKS.to_string()])
        .args(["--flush-every", "8", "--cache", p(cache), "--backing", p(backing)])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut last = 0u64;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(n) = line.strip_prefix("flushed ") {
                last = n.parse().unwrap();
            }
        }
        last
    });
    let started = Instant::now();
    std::thread::sleep(run_for);
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child was killed, not finished");
    let acknowledged = reader.join().unwrap();
    assert!(acknowledged > 0, "seed {seed}: the child acknowledged no flush in {:?}", started.elapsed());

    // What must survive: every write before the last acknowledged FLUSH.
    let mut floor = vec![0u64; BLOCKS as usize];
    let mut written: Vec<Vec<u64>> = vec![vec![0]; BLOCKS as usize];
    for (i, b) in (0..acknowledged + 200_000).zip(debug_load_blocks(seed, BLOCKS)) {
        if i < acknowledged {
            floor[b as usize] = i + 1;
        }
        written[b as usize].push(i + 1);
    }
    let c: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(cache).unwrap());
    let b: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(backing).unwrap());
    let (volume, report) = Volume::open(c, b, Arc::new(MonotonicClock::new()), VolumeOptions::default()).unwrap();
    let mut buf = vec![0u8; BS];
    for block in 0..BLOCKS {
        volume.read(block * BS as u64, &mut buf).unwrap();
        let version = stamped_version(block, &buf, &format!("seed {seed}: block {block}"));
        assert!(
            version >= floor[block as usize],
            "seed {seed}: block {block} reads version {version}, but version {} was flushed ({acknowledged} writes acknowledged, {report:?})",
            floor[block as usize]
        );
        assert!(
            written[block as usize].contains(&version),
            "seed {seed}: block {block}: version {version} never written"
        );
    }
    drop(volume);
    let check =
        tiercache_cmd().args(["check", "--cache", p(cache), "--backing", p(backing), "--json"]).output().unwrap();
    assert!(check.status.success(), "seed {seed}: check failed: {}", String::from_utf8_lossy(&check.stdout));
}

#[test]
fn flushed_writes_survive_sigkill_of_the_writer() {
    for (seed, ms) in [(1, 150), (2, 400), (3, 900), (4, 1500)] {
        kill_mid_write(seed, Duration::from_millis(ms));
    }
}
