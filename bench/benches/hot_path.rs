//! Microbenchmarks of the per-batch work on the hot path: what a node does
//! for every batch before and after the device (decode the descriptors, map
//! ranges to block I/O, verify chunks) and what a loader does per sample.
//!
//! `cargo bench -p bench --bench hot_path` (add `-- --quick` for a short run).

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use rand::{Rng, SeedableRng};
use sluice_client::sampler::IndexSampler;
use sluice_dataplane::blocks::{block_crc, VERIFY_BLOCK_BYTES};
use sluice_dataplane::plan::{plan_batch, PlanGeometry};
use sluice_dataplane::ByteRange;
use sluice_proto::wire::{encode_batch_request, parse_batch_request};
use sluice_proto::RangeDescriptor;
use zerocopy::little_endian::{U32, U64};

const BATCH: usize = 64;
const DATASET_BYTES: u64 = 64 << 30;

fn random_ranges(len: u32, align: u64) -> Vec<(u64, u32)> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    (0..BATCH).map(|_| (rng.gen_range(0..(DATASET_BYTES - u64::from(len)) / align) * align, len)).collect()
}

fn wire(c: &mut Criterion) {
    let ranges: Vec<RangeDescriptor> = random_ranges(2048, 2)
        .into_iter()
        .enumerate()
        .map(|(i, (offset, len))| RangeDescriptor {
            offset: U64::new(offset),
            len: U32::new(len),
            reserved: U32::new(0),
            dest: U64::new(i as u64 * 2048),
        })
        .collect();
    let mut group = c.benchmark_group("wire");
    group.throughput(Throughput::Elements(BATCH as u64));
    let mut out = Vec::with_capacity(8192);
    group.bench_function("encode_batch_of_64", |b| {
        b.iter(|| {
            out.clear();
            encode_batch_request(&mut out, black_box(1), black_box(3), black_box(&ranges));
            out.len()
        })
    });
    out.clear();
    encode_batch_request(&mut out, 1, 3, &ranges);
    // The frame header is not part of the payload the node parses.
    let payload = out[out.len() - (16 + BATCH * 24)..].to_vec();
    group.bench_function("decode_batch_of_64", |b| {
        b.iter(|| parse_batch_request(black_box(&payload)).map(|(_, r)| r.len()).unwrap_or(0))
    });
    group.finish();
}

fn plan(c: &mut Criterion) {
    let geometry = PlanGeometry {
        block_size_bytes: 4096,
        unit_bytes_max: 128 << 10,
        base_offset_bytes: 0,
        length_bytes: DATASET_BYTES,
        widen_to_bytes: 0,
    };
    let mut group = c.benchmark_group("plan");
    group.throughput(Throughput::Elements(BATCH as u64));
    for (name, len, align) in [("4k_aligned", 4096u32, 4096u64), ("windows_2k_unaligned", 2048, 2)] {
        let ranges: Vec<ByteRange> = random_ranges(len, align)
            .into_iter()
            .map(|(offset_bytes, len_bytes)| ByteRange { offset_bytes, len_bytes })
            .collect();
        group.bench_function(name, |b| b.iter(|| plan_batch(black_box(&ranges), geometry).units.len()));
    }
    // Neighbouring ranges merge into few I/Os.
    let merged: Vec<ByteRange> =
        (0..BATCH as u64).map(|i| ByteRange { offset_bytes: i * 2048, len_bytes: 2048 }).collect();
    group.bench_function("sequential_merging", |b| b.iter(|| plan_batch(black_box(&merged), geometry).units.len()));
    group.finish();
}

fn crc(c: &mut Criterion) {
    let chunk = vec![0xa5u8; 64 << 10];
    let mut group = c.benchmark_group("crc32c");
    group.throughput(Throughput::Bytes(chunk.len() as u64));
    group.bench_function("chunk_64k", |b| b.iter(|| crc32c::crc32c(black_box(&chunk))));
    group.finish();
    // What a core verifies every served 4 KiB block with (`crc-fast`).
    let block = &chunk[..VERIFY_BLOCK_BYTES as usize];
    let mut group = c.benchmark_group("block_crc");
    group.throughput(Throughput::Bytes(block.len() as u64));
    group.bench_function("block_4k", |b| b.iter(|| block_crc(black_box(block))));
    group.finish();
}

fn sampler(c: &mut Criterion) {
    let mut group = c.benchmark_group("sampler");
    group.throughput(Throughput::Elements(1));
    // 10^10 tokens in 1024-token windows, one epoch.
    let domain = 10_000_000_000 / 1024;
    let mut sampler = IndexSampler::new(domain, domain, 0x5eed).expect("sampler");
    group.bench_function("index_of_global_position", |b| {
        b.iter_batched(|| rand::random::<u64>() % domain, |i| sampler.index(black_box(i)), BatchSize::SmallInput)
    });
    group.finish();
}

criterion_group!(hot_path, wire, plan, crc, sampler);
criterion_main!(hot_path);
