//! Every NBD message decoder on arbitrary bytes: never panics; what decodes re-checks.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tiercache_nbd::proto::*;

fuzz_target!(|data: &[u8]| {
    if data.len() >= 28 {
        let b: [u8; 28] = data[..28].try_into().unwrap();
        if let Ok(r) = decode_request(&b) {
            assert_eq!(u32::from_be_bytes(b[..4].try_into().unwrap()), REQUEST_MAGIC);
            let _ = r.offset.checked_add(u64::from(r.length));
        }
    }
    if data.len() >= 16 {
        let b: [u8; 16] = data[..16].try_into().unwrap();
        if let Ok(h) = decode_option_header(&b) {
            assert!(h.length <= MAX_OPTION_BYTES);
        }
    }
    if let Ok(req) = decode_info_request(data) {
        assert!(req.name.len() + 6 + req.infos.len() * 2 <= data.len());
    }
});
