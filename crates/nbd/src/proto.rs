//! The NBD wire format (fixed newstyle), as pure functions over bytes: no I/O, so that every
//! decoder can be fuzzed. Reference: the NBD protocol document (NetworkBlockDevice/nbd,
//! doc/proto.md). All integers are big-endian on the wire.

use thiserror::Error;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;

// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;

// Info types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

// Commands and their flags.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;

// Errors in replies.
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// The error a reply carries for a request that failed with `errno`: the protocol defines
/// only the values above (as their Linux errno numbers), so anything else is sent as EIO.
pub fn reply_error(errno: i32) -> u32 {
    match u32::try_from(errno).unwrap_or(EIO) {
        v @ (EPERM | EIO | ENOMEM | EINVAL | ENOSPC | EOVERFLOW | ENOTSUP | ESHUTDOWN) => v,
        _ => EIO,
    }
}

/// Longest option payload accepted (the spec bounds strings at 4096 bytes).
pub const MAX_OPTION_BYTES: u32 = 8192;
/// The minimum block size advertised (a sector).
pub const MIN_BLOCK_BYTES: u32 = 512;
/// Largest read or write payload accepted (advertised as the maximum block size).
pub const MAX_REQUEST_BYTES: u32 = 32 << 20;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ProtoError {
    #[error("bad magic {0:#x}")]
    BadMagic(u64),
    #[error("option payload of {0} bytes is too long")]
    OptionTooLong(u32),
    #[error("malformed option payload: {0}")]
    Malformed(&'static str),
}

/// An option's header (after the client flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

pub fn decode_option_header(b: &[u8; 16]) -> Result<OptionHeader, ProtoError> {
    let magic = u64::from_be_bytes(b[..8].try_into().expect("8"));
    if magic != IHAVEOPT {
        return Err(ProtoError::BadMagic(magic));
    }
    let option = u32::from_be_bytes(b[8..12].try_into().expect("4"));
    let length = u32::from_be_bytes(b[12..16].try_into().expect("4"));
    if length > MAX_OPTION_BYTES {
        return Err(ProtoError::OptionTooLong(length));
    }
    Ok(OptionHeader { option, length })
}

/// The payload of NBD_OPT_INFO and NBD_OPT_GO: an export name and the info types asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub infos: Vec<u16>,
}

pub fn decode_info_request(p: &[u8]) -> Result<InfoRequest, ProtoError> {
    let malformed = ProtoError::Malformed;
    if p.len() < 4 {
        return Err(malformed("shorter than the name length"));
    }
    let name_len = u32::from_be_bytes(p[..4].try_into().expect("4")) as usize;
    let rest = &p[4..];
    if rest.len() < name_len + 2 {
        return Err(malformed("name length beyond the payload"));
    }
    let name = std::str::from_utf8(&rest[..name_len]).map_err(|_| malformed("name is not UTF-8"))?.to_string();
    let rest = &rest[name_len..];
    let count = u16::from_be_bytes(rest[..2].try_into().expect("2")) as usize;
    let rest = &rest[2..];
    if rest.len() != count * 2 {
        return Err(malformed("info request count does not match the payload"));
    }
    let infos = rest.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
    Ok(InfoRequest { name, infos })
}

/// A transmission request (28 bytes; WRITE is followed by `length` bytes of data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

pub fn decode_request(b: &[u8; 28]) -> Result<Request, ProtoError> {
    let magic = u32::from_be_bytes(b[..4].try_into().expect("4"));
    if magic != REQUEST_MAGIC {
        return Err(ProtoError::BadMagic(u64::from(magic)));
    }
    Ok(Request {
        flags: u16::from_be_bytes(b[4..6].try_into().expect("2")),
        kind: u16::from_be_bytes(b[6..8].try_into().expect("2")),
        cookie: u64::from_be_bytes(b[8..16].try_into().expect("8")),
        offset: u64::from_be_bytes(b[16..24].try_into().expect("8")),
        length: u32::from_be_bytes(b[24..28].try_into().expect("4")),
    })
}

pub fn encode_option_reply(option: u32, reply: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + data.len());
    v.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&reply.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

pub fn encode_simple_reply(error: u32, cookie: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    v[4..8].copy_from_slice(&error.to_be_bytes());
    v[8..].copy_from_slice(&cookie.to_be_bytes());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_options_decode_and_refuse_garbage() {
        let mut r = [0u8; 28];
        r[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        r[6..8].copy_from_slice(&CMD_WRITE.to_be_bytes());
        r[8..16].copy_from_slice(&7u64.to_be_bytes());
        r[16..24].copy_from_slice(&4096u64.to_be_bytes());
        r[24..28].copy_from_slice(&512u32.to_be_bytes());
        assert_eq!(
            decode_request(&r).unwrap(),
            Request { flags: 0, kind: CMD_WRITE, cookie: 7, offset: 4096, length: 512 }
        );
        r[0] ^= 1;
        assert!(matches!(decode_request(&r), Err(ProtoError::BadMagic(_))));

        let mut o = [0u8; 16];
        o[..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        o[8..12].copy_from_slice(&OPT_GO.to_be_bytes());
        o[12..16].copy_from_slice(&9u32.to_be_bytes());
        assert_eq!(decode_option_header(&o).unwrap(), OptionHeader { option: OPT_GO, length: 9 });
        o[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode_option_header(&o), Err(ProtoError::OptionTooLong(u32::MAX)));

        let mut p = vec![0, 0, 0, 3];
        p.extend_from_slice(b"abc");
        p.extend_from_slice(&1u16.to_be_bytes());
        p.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        assert_eq!(decode_info_request(&p).unwrap(), InfoRequest { name: "abc".into(), infos: vec![INFO_BLOCK_SIZE] });
        for bad in [&p[..3], &p[..6], &p[..p.len() - 1], &[0xff, 0xff, 0xff, 0xff, 0, 0][..]] {
            assert!(decode_info_request(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn reply_errors_stay_inside_the_protocols_set() {
        for v in [EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN] {
            assert_eq!(reply_error(v as i32), v);
        }
        // EROFS, EBUSY, ENOENT, EISDIR, ENODEV, and no errno at all: EIO.
        for e in [30, 16, 2, 21, 19, 0, -1, i32::MAX] {
            assert_eq!(reply_error(e), EIO, "{e}");
        }
    }
}
