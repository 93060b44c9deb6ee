//! Sources and the chunk cache over local files (`file://`, the same
//! `object_store` path as S3's, less the network); the S3 tests against a
//! real server are `tests/source_cache.rs`.

use std::sync::Arc;

use sluice_dataplane::driver::{BlockDriver, MemDriver, NamespaceSpec};
use sluice_dataplane::ByteRange;
use sluice_proto::{RangeStatus, CHUNK_SIZE_BYTES};

use super::cache::ChunkCache;
use super::*;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// Quick to give up, and fetching local files (which the default
/// `source_allow` does not).
fn quick() -> SourceOptions {
    SourceOptions {
        retries: 1,
        retry_backoff: Duration::from_millis(1),
        allowed: allow::SourceAllowList::parse(&["file://".to_string()]).expect("allow list"),
        ..SourceOptions::default()
    }
}

fn bytes_of(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) ^ (i >> 9) as u8).collect()
}

/// A directory of objects `a`, `b`, `c` of the sizes given.
fn objects_dir(sizes: &[usize]) -> (tempfile::TempDir, Vec<Vec<u8>>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut all = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let data = bytes_of(size, i as u8);
        std::fs::write(dir.path().join(format!("{}", (b'a' + i as u8) as char)), &data).expect("write");
        all.push(data);
    }
    (dir, all)
}

fn prefix_url(dir: &tempfile::TempDir) -> String {
    format!("file://{}/", dir.path().display())
}

#[test]
fn a_prefix_pins_every_object_in_key_order_and_fetches_ranges_of_them() {
    let (dir, data) = objects_dir(&[1000, 70_000, 5]);
    let sources = Sources::new(quick());
    runtime().block_on(async {
        let objects = sources.pin(&[prefix_url(&dir)]).await.expect("pin");
        let sizes: Vec<u64> = objects.iter().map(|o| o.size_bytes).collect();
        assert_eq!(sizes, [1000, 70_000, 5]);
        assert!(objects[0].url.ends_with("/a") && objects[2].url.ends_with("/c"), "{objects:?}");
        assert!(objects.iter().all(|o| o.e_tag.is_some()), "local files have ETags");
        let got = sources.fetch(&objects[1], 123..65_000).await.expect("fetch");
        assert_eq!(&got[..], &data[1][123..65_000]);
        let one = sources.pin(&[objects[0].url.clone()]).await.expect("pin one");
        assert_eq!(one, objects[..1]);
    });
}

#[test]
fn an_object_changed_after_pinning_fails_as_changed_and_a_missing_one_too() {
    let (dir, _) = objects_dir(&[4096, 4096]);
    let sources = Sources::new(quick());
    runtime().block_on(async {
        let objects = sources.pin(&[prefix_url(&dir)]).await.expect("pin");
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(dir.path().join("a"), bytes_of(4097, 9)).expect("overwrite");
        std::fs::remove_file(dir.path().join("b")).expect("remove");
        for object in &objects {
            let err = sources.fetch(object, 0..100).await.expect_err("changed");
            assert!(matches!(err, FetchError::Changed { .. }), "{err}");
        }
    });
}

#[test]
fn nothing_under_a_prefix_a_bad_scheme_and_more_than_a_path_are_refused_with_the_url() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sources = Sources::new(quick());
    runtime().block_on(async {
        let err = sources.pin(&[prefix_url(&dir)]).await.expect_err("empty");
        assert!(err.to_string().contains("holds no objects"), "{err}");
        let err = sources.pin(&["ftp://host/x".to_string()]).await.expect_err("scheme");
        assert!(err.to_string().contains("scheme ftp"), "{err}");
        std::fs::write(dir.path().join("empty"), b"").expect("write");
        let err = sources.pin(&[prefix_url(&dir)]).await.expect_err("only an object of no bytes");
        assert!(err.to_string().contains("holds no objects"), "{err}");
        for url in ["https://host/a?X-Amz-Signature=00", "s3://bucket/c#d"] {
            let err = sources.pin(&[url.to_string()]).await.expect_err("query or fragment");
            assert!(err.to_string().contains("nothing more"), "{err}");
        }
        let no_slash = prefix_url(&dir).trim_end_matches('/').to_string();
        let err = sources.pin(&[no_slash]).await.expect_err("a prefix without its slash");
        assert!(err.to_string().contains("end the URL with '/'"), "{err}");
    });
}

fn cache_over(
    data_dir: &std::path::Path,
    objects: Vec<SourceObject>,
    sources: Arc<Sources>,
    handle: tokio::runtime::Handle,
    ns: Arc<dyn sluice_dataplane::Namespace>,
) -> Arc<ChunkCache> {
    let length: u64 = objects.iter().map(|o| o.data_bytes).sum();
    let cache = Arc::new(
        ChunkCache::open("d", data_dir, 7, length, 0, ns, objects, Arc::clone(&sources), handle, false).expect("cache"),
    );
    sources.budget().register(&cache);
    cache
}

/// Objects of `sizes` pinned, and what a cache over them needs.
struct Fixture {
    dir: tempfile::TempDir,
    data: Vec<Vec<u8>>,
    data_dir: tempfile::TempDir,
    sources: Arc<Sources>,
    rt: tokio::runtime::Runtime,
    ns: Arc<dyn sluice_dataplane::Namespace>,
    objects: Vec<SourceObject>,
}

impl Fixture {
    fn new(sizes: &[usize]) -> Self {
        let (dir, data) = objects_dir(sizes);
        let data_dir = tempfile::tempdir().expect("data dir");
        let sources = Arc::new(Sources::new(quick()));
        let rt = runtime();
        let ns = MemDriver.open_namespace(&NamespaceSpec::Mem).expect("namespace");
        let objects = rt.block_on(sources.pin(&[prefix_url(&dir)])).expect("pin");
        Self { dir, data, data_dir, sources, rt, ns, objects }
    }

    /// A cache over the objects, opened from whatever files are there.
    fn cache(&self) -> Arc<ChunkCache> {
        let (sources, handle, ns) = (Arc::clone(&self.sources), self.rt.handle().clone(), Arc::clone(&self.ns));
        cache_over(self.data_dir.path(), self.objects.clone(), sources, handle, ns)
    }
}

/// Random unaligned ranges fill exactly the chunks they cover, the bytes
/// land where the dataset's are, block checksums are those of the bytes,
/// and a cache opened again from its files knows what is present.
#[test]
fn fills_write_the_covered_chunks_and_survive_a_reopen() {
    let sizes = [3 * CHUNK_SIZE_BYTES as usize + 17, 100, 2 * CHUNK_SIZE_BYTES as usize];
    let f = Fixture::new(&sizes);
    let Fixture { data, rt, ns, .. } = &f;
    let whole: Vec<u8> = data.concat();
    let cache = f.cache();
    assert_eq!(cache.chunks_total(), whole.len().div_ceil(CHUNK_SIZE_BYTES as usize) as u64);
    // Spans the first object's end, the short second object and into the third.
    let ranges = vec![
        ByteRange { offset_bytes: 3 * CHUNK_SIZE_BYTES - 5, len_bytes: 200 },
        ByteRange { offset_bytes: 10, len_bytes: 3 },
        ByteRange { offset_bytes: whole.len() as u64, len_bytes: 1 },
    ];
    let statuses = rt.block_on(cache.fill_ranges(&ranges));
    assert_eq!(statuses, [RangeStatus::Ok; 3]);
    let present: Vec<bool> = (0..cache.chunks_total()).map(|c| cache.is_present(c)).collect();
    assert_eq!(present, [true, false, true, true, false, false]);
    for chunk in [0u64, 2, 3] {
        let start = (chunk * CHUNK_SIZE_BYTES) as usize;
        let end = (start + CHUNK_SIZE_BYTES as usize).min(whole.len());
        let mut got = vec![0u8; end - start];
        ns.read_at(start as u64, &mut got).expect("read");
        assert_eq!(got, whole[start..end], "chunk {chunk}");
        let first_block = chunk as usize * 16;
        for (i, block) in whole[start..end].chunks(4096).enumerate() {
            assert_eq!(cache.block_crcs().get(first_block + i), Some(crc32c::crc32c(block)));
        }
    }
    drop(cache);
    let again = f.cache();
    let present: Vec<bool> = (0..again.chunks_total()).map(|c| again.is_present(c)).collect();
    assert_eq!(present, [true, false, true, true, false, false]);
    rt.block_on(again.warm(3)).expect("warm");
    assert_eq!(again.chunks_present(), again.chunks_total());
    assert_eq!(again.report(false).chunks_filled, 3, "only the missing chunks were fetched");
}

/// Cache files of another length are not trusted: everything is missing.
#[test]
fn cache_files_that_do_not_fit_the_dataset_start_over() {
    let f = Fixture::new(&[2 * CHUNK_SIZE_BYTES as usize]);
    let Fixture { rt, .. } = &f;
    let cache = f.cache();
    rt.block_on(cache.warm(1)).expect("warm");
    drop(cache);
    let (_, crc_path) = cache::cache_paths(f.data_dir.path(), 7);
    let file = std::fs::OpenOptions::new().write(true).open(&crc_path).expect("crc file");
    file.set_len(12).expect("cut");
    let again = f.cache();
    assert_eq!(again.chunks_present(), 0);
}

/// Many readers of the same missing chunks at once: each chunk is fetched
/// once, and every reader gets it.
#[test]
fn concurrent_readers_of_one_missing_chunk_cause_one_fetch() {
    let f = Fixture::new(&[4 * CHUNK_SIZE_BYTES as usize]);
    let Fixture { rt, .. } = &f;
    let cache = f.cache();
    let readers: Vec<_> = (0..16)
        .map(|i| {
            let cache = Arc::clone(&cache);
            rt.spawn(async move {
                let range = ByteRange { offset_bytes: 2 * CHUNK_SIZE_BYTES - 2000 + i * 100, len_bytes: 4096 };
                cache.fill_ranges(&[range]).await
            })
        })
        .collect();
    for reader in readers {
        assert_eq!(rt.block_on(reader).expect("reader"), [RangeStatus::Ok]);
    }
    assert_eq!(cache.report(false).chunks_filled, 2, "chunks 1 and 2, each once");
}

/// A chunk of a changed object fails as changed; chunks of other objects
/// still fill.
#[test]
fn a_changed_object_fails_its_chunks_only() {
    let f = Fixture::new(&[CHUNK_SIZE_BYTES as usize, CHUNK_SIZE_BYTES as usize]);
    let Fixture { dir, data, rt, ns, .. } = &f;
    let cache = f.cache();
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(dir.path().join("b"), bytes_of(CHUNK_SIZE_BYTES as usize, 77)).expect("overwrite");
    let ranges =
        [ByteRange { offset_bytes: 5, len_bytes: 10 }, ByteRange { offset_bytes: CHUNK_SIZE_BYTES + 5, len_bytes: 10 }];
    let statuses = rt.block_on(cache.fill_ranges(&ranges));
    assert_eq!(statuses, [RangeStatus::Ok, RangeStatus::SourceChanged]);
    assert!(cache.is_present(0) && !cache.is_present(1));
    let mut got = vec![0u8; 10];
    ns.read_at(5, &mut got).expect("read");
    assert_eq!(got, data[0][5..15]);
    let report = cache.report(false);
    assert_eq!(report.source_changed, 1);
    assert!(report.last_error.is_some_and(|e| e.contains("changed")));
}

#[test]
fn keys_with_url_characters_pin_to_urls_that_find_them_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let names = ["a b", "c#d", "e?f", "g%41", "h+i", "ü"];
    for (i, name) in names.iter().enumerate() {
        std::fs::write(dir.path().join(name), bytes_of(100 + i, i as u8)).expect("write");
    }
    std::fs::write(dir.path().join("no-bytes"), b"").expect("write");
    let sources = Sources::new(quick());
    runtime().block_on(async {
        let objects = sources.pin(&[prefix_url(&dir)]).await.expect("pin");
        assert_eq!(objects.len(), names.len(), "under a prefix an object of no bytes is passed over: {objects:?}");
        for object in &objects {
            let got = sources.fetch(object, 0..object.size_bytes).await.expect("fetch");
            let i = (object.size_bytes - 100) as usize;
            assert_eq!(&got[..], &bytes_of(100 + i, i as u8)[..], "{}", object.url);
            let again = sources.pin(std::slice::from_ref(&object.url)).await.expect("pin by its url");
            assert_eq!(again[..], *std::slice::from_ref(object), "{}", object.url);
        }
    });
}

/// A record is input, not an order: a source URL outside the node's
/// `source_allow` (its own files, by default) is neither pinned nor
/// fetched, whoever wrote the record, and the error says what the node
/// allows.
#[test]
fn sources_outside_the_allow_list_are_neither_pinned_nor_fetched() {
    let (dir, _) = objects_dir(&[4096]);
    let pinned = runtime().block_on(Sources::new(quick()).pin(&[prefix_url(&dir)])).expect("pin");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    std::fs::write(elsewhere.path().join("secret"), b"node key").expect("write");
    let only_dir =
        SourceOptions { allowed: allow::SourceAllowList::parse(&[prefix_url(&dir)]).expect("allow list"), ..quick() };
    runtime().block_on(async {
        for sources in [Sources::new(SourceOptions::default()), Sources::new(only_dir)] {
            let secret = format!("file://{}/secret", elsewhere.path().display());
            let err = sources.pin(&[secret]).await.expect_err("outside the allow list");
            assert!(matches!(err, SourceError::NotAllowed { .. }), "{err}");
            let err = sources
                .fetch(
                    &SourceObject { url: format!("file://{}/secret", elsewhere.path().display()), ..pinned[0].clone() },
                    0..8,
                )
                .await
                .expect_err("fetch outside");
            assert!(matches!(&err, FetchError::Unavailable { why, .. } if why.contains("source_allow")), "{err}");
            let said = err.to_string();
            assert_eq!(said.matches("/secret").count(), 1, "the URL named once, no attempts counted: {said}");
            assert!(!said.contains("attempts"), "{said}");
        }
        let err = Sources::new(SourceOptions::default()).fetch(&pinned[0], 0..8).await.expect_err("file:// by default");
        assert!(err.to_string().contains("s3://, s3a://, gs://"), "{err}");
        let sources = Sources::new(SourceOptions::default());
        let err = sources.pin(&["https://user:secret@host/x".to_string()]).await.expect_err("a password");
        assert!(err.to_string().contains("password"), "{err}");
    });
}

/// A node whose environment names an AWS profile and no credentials is
/// told, on an S3 error, that profiles are not read and what to give.
#[test]
fn an_aws_profile_without_credentials_is_named_in_s3_errors() {
    let env = |names: &'static [&'static str]| move |name: &str| names.contains(&name);
    assert!(credentials_hint("s3://b/k", env(&["AWS_PROFILE"])).is_some_and(|h| h.contains("no profile")));
    assert!(credentials_hint("s3://b/k", env(&["AWS_PROFILE", "AWS_ACCESS_KEY_ID"])).is_none());
    assert!(credentials_hint("s3://b/k", env(&["AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE"])).is_none());
    assert!(credentials_hint("s3://b/k", env(&[])).is_none());
    assert!(credentials_hint("gs://b/k", env(&["AWS_PROFILE"])).is_none());
}

#[test]
fn etags_compare_by_their_tag_quoted_or_not() {
    assert!(same_etag("\"0x8DC1\"", "\"0x8DC1\""));
    assert!(same_etag("0x8DC1", "\"0x8DC1\""), "Azure: bare in a listing, quoted in a response");
    assert!(same_etag("\"0x8DC1\"", "0x8DC1"));
    assert!(same_etag("5f-1a-40", "5f-1a-40"));
    assert!(same_etag("W/\"0x8DC1\"", "W/\"0x8DC1\""));
    assert!(!same_etag("0x8DC1", "\"0x8DC2\""));
    assert!(!same_etag("\"0x8DC1", "0x8DC1"), "an unbalanced quote is part of the tag");
    assert!(!same_etag("\"0x8DC1\"", "W/\"0x8DC1\""));
}
