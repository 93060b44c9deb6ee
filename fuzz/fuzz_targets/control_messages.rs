//! Control messages (bincode with a size limit): decode, and what decodes
//! re-encodes to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_proto::codec;

fuzz_target!(|data: &[u8]| {
    if let Ok(message) = codec::decode(data) {
        let again = codec::encode(&message).expect("a decoded message encodes");
        assert_eq!(codec::decode(&again).expect("round trip"), message);
    }
});
