//! eBPF programs (C, under `bpf/`) that trace the data plane's small-read
//! traffic through uprobes on its probe ABI and steer it into the latency
//! lane, and the aya loader for them.
//!
//! Nothing is implemented here yet: the crate holds no code, and the node
//! reports eBPF as unavailable.
