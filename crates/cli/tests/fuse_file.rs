//! The FUSE file itself, byte by byte, for both things `serve` can put behind it: the hybrid
//! volume and a passthrough device (`serve --passthrough`, the benchmark baseline). The same
//! script runs on each: unaligned writes, an O_DSYNC write, fallocate ZERO_RANGE and
//! PUNCH_HOLE (which must read as zeroes), plain allocation, a write past the end, a short
//! read at the end; the file must then equal a byte model, and for the passthrough so must the
//! device file after a clean stop. The hybrid volume's file is checked through both ways the
//! kernel can hand FUSE requests over: /dev/fuse and io_uring (where the kernel has it).
//! Needs root, /dev/fuse and fuse3 (like fuse_ext4.rs), and util-linux's fallocate.

mod common;

use common::p;
use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A running `tiercache serve ... --fuse DIR`, stopped with SIGTERM when dropped.
struct Served {
    child: Option<Child>,
    mountdir: PathBuf,
}

impl Served {
    /// Serves with `args` and `--fuse MOUNTDIR`; the log goes to MOUNTDIR.log.
    fn start(args: &[&str], mountdir: &Path) -> Served {
        std::fs::create_dir(mountdir).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_tiercache"))
            .arg("serve")
            .args(args)
            .args(["--fuse", p(mountdir)])
            .stderr(std::fs::File::create(mountdir.with_extension("log")).unwrap())
            .spawn()
            .unwrap();
        let served = Served { child: Some(child), mountdir: mountdir.to_path_buf() };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !served.file().exists() {
            assert!(Instant::now() < deadline, "the FUSE file did not appear");
            std::thread::sleep(Duration::from_millis(50));
        }
        served
    }

    fn file(&self) -> PathBuf {
        self.mountdir.join("volume")
    }

    /// Stops the server with SIGTERM; its log.
    fn stop(&mut self) -> String {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on the PID of a child we own; no memory is passed.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            assert!(c.wait().unwrap().success(), "serve did not stop cleanly");
        }
        std::fs::read_to_string(self.mountdir.with_extension("log")).unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            let _ = Command::new("umount").args(["-l", p(&self.mountdir)]).status();
        }
    }
}

fn fallocate(args: &[&str], file: &Path) -> std::process::Output {
    Command::new("fallocate").args(args).arg(file).output().expect("fallocate (util-linux)")
}

/// The script, applied to the FUSE file and to `model` (the file's expected bytes).
fn exercise(file: &Path, model: &mut [u8]) {
    let size = model.len() as u64;
    assert_eq!(std::fs::metadata(file).unwrap().len(), size);
    let f = OpenOptions::new().read(true).write(true).open(file).unwrap();
    let mut write = |offset: u64, len: usize, seed: u8, f: &std::fs::File| {
        let data: Vec<u8> = (0..len).map(|i| seed ^ (i * 7) as u8).collect();
        f.write_all_at(&data, offset).unwrap();
        model[offset as usize..offset as usize + len].copy_from_slice(&data);
    };
    // Inside one block, across blocks with partial edges, aligned, the last bytes.
    write(1000, 50, 0x31, &f);
    write(4096 * 3 - 100, 9000, 0x32, &f);
    write(4096 * 10, 8192, 0x33, &f);
    write(size - 3, 3, 0x34, &f);
    // O_DSYNC: a FUA write.
    let dsync = OpenOptions::new().write(true).custom_flags(libc::O_DSYNC).open(file).unwrap();
    write(12345, 777, 0x35, &dsync);
    drop(dsync);

    // ZERO_RANGE over several MiB with unaligned edges, PUNCH_HOLE, plain allocation.
    let (zo, zl) = ((1u64 << 20) - 5, (5u64 << 19) + 11);
    model[zo as usize..(zo + zl) as usize].fill(0xee);
    f.write_all_at(&model[zo as usize..(zo + zl) as usize], zo).unwrap();
    let out = fallocate(&["-z", "-o", &zo.to_string(), "-l", &zl.to_string()], file);
    assert!(out.status.success(), "zero range: {}", String::from_utf8_lossy(&out.stderr));
    model[zo as usize..(zo + zl) as usize].fill(0);
    let out = fallocate(&["-p", "-o", "4100", "-l", "300"], file);
    assert!(out.status.success(), "punch hole: {}", String::from_utf8_lossy(&out.stderr));
    model[4100..4400].fill(0);
    let out = fallocate(&["-o", "0", "-l", "65536"], file);
    assert!(out.status.success(), "allocation: {}", String::from_utf8_lossy(&out.stderr));
    f.sync_all().unwrap();

    // The file cannot grow; a read at the end is short.
    let e = f.write_all_at(&[1, 2, 3, 4], size - 2).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    let mut tail = [0u8; 10];
    assert_eq!(f.read_at(&mut tail, size - 2).unwrap(), 2);
    assert_eq!(tail[..2], model[size as usize - 2..]);

    let mut all = vec![0u8; size as usize];
    f.read_exact_at(&mut all, 0).unwrap();
    assert!(
        all == model,
        "the FUSE file differs from the model at byte {:?}",
        all.iter().zip(&*model).position(|(a, b)| a != b)
    );
}

fn check_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test mounts file systems: run it as root (CI does)");
}

/// The script on a hybrid volume's file served `--fuse-transport TRANSPORT`; the server's
/// log must name `shown` as the way requests came.
fn hybrid_volume_matches_a_byte_model(transport: &str, shown: &str) {
    check_root();
    let dir = tempfile::tempdir().unwrap();
    let (cache, backing) = hybrid_volume(dir.path());
    let args = ["--cache", p(&cache), "--backing", p(&backing), "--fuse-transport", transport];
    let mut served = Served::start(&args, &dir.path().join("fuse"));
    let mut model = vec![0u8; 32 << 20];
    exercise(&served.file(), &mut model);
    let log = served.stop();
    assert!(log.contains(&format!("/volume ({shown})")), "not served through {shown}: {log}");
}

/// A 32 MiB hybrid volume with a 16 MiB cache in `dir`: (cache, backing).
fn hybrid_volume(dir: &Path) -> (PathBuf, PathBuf) {
    let (cache, backing) = (dir.join("cache.img"), dir.join("backing.img"));
    std::fs::File::create(&backing).unwrap().set_len(32 << 20).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(["create", "--cache", p(&cache), "--cache-size", "16M", "--backing", p(&backing)])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (cache, backing)
}

/// `fuse_transport` in a config file: with the kernel's switch on, where `auto` takes
/// io_uring, a file's "dev" keeps /dev/fuse.
#[test]
fn a_config_files_fuse_transport_is_the_one_used() {
    check_root();
    if !common::enable_fuse_uring() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (cache, backing) = hybrid_volume(dir.path());
    let config = dir.path().join("volume.toml");
    let text = format!("cache = {:?}\nbacking = {:?}\nfuse_transport = \"dev\"\n", p(&cache), p(&backing));
    std::fs::write(&config, text).unwrap();
    let mut served = Served::start(&["--config", p(&config)], &dir.path().join("fuse"));
    let log = served.stop();
    assert!(log.contains("/volume (/dev/fuse)"), "the file's transport was not used: {log}");
}

#[test]
fn the_fuse_file_of_a_hybrid_volume_matches_a_byte_model_through_dev_fuse() {
    hybrid_volume_matches_a_byte_model("dev", "/dev/fuse");
}

#[test]
fn the_fuse_file_of_a_hybrid_volume_matches_a_byte_model_through_io_uring() {
    if common::enable_fuse_uring() {
        hybrid_volume_matches_a_byte_model("io-uring", "io_uring");
    }
}

#[test]
fn the_fuse_file_of_a_passthrough_device_matches_a_byte_model_and_so_does_the_device() {
    check_root();
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("raw.img");
    let mut model: Vec<u8> = (0..16usize << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&raw, &model).unwrap();
    let mut served = Served::start(&["--passthrough", p(&raw)], &dir.path().join("fuse"));
    exercise(&served.file(), &mut model);
    let _ = served.stop();
    assert!(std::fs::read(&raw).unwrap() == model, "the device file differs from the model");
}
