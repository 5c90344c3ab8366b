//! Deliberately broken commit orders, to prove that the simulators catch them
//! (`tiercache torture --sabotage`, and the simulators' own tests).
//!
//! Test machinery, compiled in only with the `testing` feature (the simulator crate turns
//! it on; a production build with `--no-default-features` leaves it out). Without it the
//! [`sabotaged!`] checks in the engine are the constant `false`.

#[cfg(feature = "testing")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub enum Sabotage {
    #[default]
    None,
    /// FLUSH returns without flushing the cache device.
    FlushSkipsCacheFlush,
    /// Reclaim overwrites space before the record moving the head past it is durable.
    ReclaimSkipsMarkerFlush,
    /// Destage marks blocks clean without flushing the backing device.
    DestageSkipsBackingFlush,
    /// Issue 7, bug 1: write-back marks clean whatever version now sits in the slot it read
    /// (and names it in the MarkClean entry), instead of exactly the version it wrote.
    MarkCleanBySlot,
    /// Issue 7, bug 2: a lost block is remembered in RAM only (no Lost entry, no tombstone).
    LostInRamOnly,
    /// Issue 7, bug 3: records written after a recovery keep the recovered epoch, so one
    /// can be byte-identical to a record written before the crash.
    NoRecoveryEpoch,
    /// Write-around: Trim entries, checkpoints and reclaim records record the drop of older
    /// copies without the backing flush that makes the written-around data durable first.
    WriteAroundSkipsBackingFlush,
    /// The record pipeline: FLUSH seals, writes and flushes without waiting for the record
    /// writes still in progress, so it reports durable records the cache flush may not cover.
    FlushIgnoresRecordPipeline,
}

#[cfg(feature = "testing")]
impl Sabotage {
    pub const ALL: [Sabotage; 8] = [
        Sabotage::FlushSkipsCacheFlush,
        Sabotage::ReclaimSkipsMarkerFlush,
        Sabotage::DestageSkipsBackingFlush,
        Sabotage::MarkCleanBySlot,
        Sabotage::LostInRamOnly,
        Sabotage::NoRecoveryEpoch,
        Sabotage::WriteAroundSkipsBackingFlush,
        Sabotage::FlushIgnoresRecordPipeline,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Sabotage::None => "none",
            Sabotage::FlushSkipsCacheFlush => "flush-skips-cache-flush",
            Sabotage::ReclaimSkipsMarkerFlush => "reclaim-skips-marker-flush",
            Sabotage::DestageSkipsBackingFlush => "destage-skips-backing-flush",
            Sabotage::MarkCleanBySlot => "mark-clean-by-slot",
            Sabotage::LostInRamOnly => "lost-in-ram-only",
            Sabotage::NoRecoveryEpoch => "no-recovery-epoch",
            Sabotage::WriteAroundSkipsBackingFlush => "write-around-skips-backing-flush",
            Sabotage::FlushIgnoresRecordPipeline => "flush-ignores-record-pipeline",
        }
    }
}

/// Whether the volume `$v` runs with the named sabotage (always false without the feature).
macro_rules! sabotaged {
    ($v:expr, $which:ident) => {{
        #[cfg(feature = "testing")]
        let on = $v.options.sabotage == $crate::sabotage::Sabotage::$which;
        #[cfg(not(feature = "testing"))]
        let on = {
            let _ = &$v;
            false
        };
        on
    }};
}
pub(crate) use sabotaged;
