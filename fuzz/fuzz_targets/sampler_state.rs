//! Saved sampler states (binary or JSON) from checkpoints.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_sampler::SamplerState;

fuzz_target!(|data: &[u8]| {
    if let Ok(state) = SamplerState::from_bytes(data) {
        let bytes = state.encode().expect("a decoded state encodes");
        assert_eq!(SamplerState::decode(&bytes).expect("round trip"), state);
    }
});
