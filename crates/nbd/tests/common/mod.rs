//! The NBD wire format as these tests speak it: requests framed by hand, replies parsed by
//! hand (the server's own encoder is what they check).
#![allow(dead_code)]

use std::io::Read;
use tiercache_nbd::proto::*;

pub fn request_flags(kind: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut r = REQUEST_MAGIC.to_be_bytes().to_vec();
    r.extend_from_slice(&flags.to_be_bytes());
    r.extend_from_slice(&kind.to_be_bytes());
    r.extend_from_slice(&cookie.to_be_bytes());
    r.extend_from_slice(&offset.to_be_bytes());
    r.extend_from_slice(&len.to_be_bytes());
    r
}

pub fn request(kind: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    request_flags(kind, 0, cookie, offset, len)
}

pub fn write_request(cookie: u64, offset: u64, data: &[u8]) -> Vec<u8> {
    let mut r = request(CMD_WRITE, cookie, offset, data.len() as u32);
    r.extend_from_slice(data);
    r
}

/// One simple reply header: (error, cookie).
pub fn reply_header(c: &mut impl Read) -> (u32, u64) {
    let mut h = [0u8; 16];
    c.read_exact(&mut h).unwrap();
    assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), SIMPLE_REPLY_MAGIC);
    (u32::from_be_bytes(h[4..8].try_into().unwrap()), u64::from_be_bytes(h[8..].try_into().unwrap()))
}

pub fn read_payload(c: &mut impl Read, n: usize) -> Vec<u8> {
    let mut d = vec![0u8; n];
    c.read_exact(&mut d).unwrap();
    d
}
