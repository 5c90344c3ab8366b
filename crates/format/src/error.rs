use thiserror::Error;

/// Why a structure read from disk was refused. Each variant says what was found, so that
/// `tiercache check` and open errors can name the problem precisely.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FormatError {
    #[error("{what}: buffer of {len} bytes is too short (need {need})")]
    TooShort { what: &'static str, len: usize, need: usize },
    #[error("{what}: bad magic {found:#018x} (not a tiercache {what}, or of another volume)")]
    BadMagic { what: &'static str, found: u64 },
    #[error("{what}: checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    BadChecksum { what: &'static str, stored: u32, computed: u32 },
    #[error("{what}: format version {found} is newer than this build supports ({supported}); upgrade tiercache")]
    NewerVersion { what: &'static str, found: u32, supported: u32 },
    #[error("{what}: format version {found} was written by an older tiercache (this build reads {supported}); write its dirty data back with the older tiercache (`tiercache flush`), then `tiercache create --force` with this one")]
    OlderVersion { what: &'static str, found: u32, supported: u32 },
    #[error("{what}: unsupported format version {found} (this build reads {supported})")]
    UnsupportedVersion { what: &'static str, found: u32, supported: u32 },
    #[error("{what}: invalid field {field}: {why}")]
    Invalid { what: &'static str, field: &'static str, why: String },
}
