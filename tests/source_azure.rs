//! Source-backed datasets in Azure Blob Storage, against a real
//! Azure-compatible server (Azurite, Microsoft's emulator, on loopback):
//! blobs of a container read back byte-exact, `.npy` headers skipped, an
//! overwritten or deleted blob failing only its ranges, and a container,
//! a prefix or an account that is not there refused by name before
//! anything is made. `source_cache.rs` tests the same node code against
//! S3; what differs here is the store's own: Shared Key signing, its
//! listing, its ETags (bare in a listing, quoted in a response) and how it
//! answers a conditional GET whose blob has changed.

mod common;

use common::azure::Azurite;
use common::stores;
use common::NodeProcess;

#[test]
fn blobs_read_back_exact_and_a_changed_blob_fails_only_its_own_ranges() {
    let Some(azurite) = Azurite::start() else { return };
    stores::cold_reads_are_exact_and_a_changed_object_fails_only_its_own_ranges(&azurite);
}

/// Besides a missing container and an empty prefix, a node given no
/// Azure account is refused with the variables that name one.
#[test]
fn a_missing_container_an_empty_prefix_and_no_account_are_refused_and_make_nothing() {
    let Some(azurite) = Azurite::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let says = "404 Not Found: ContainerNotFound: The specified container does not exist. RequestId:";
    stores::a_missing_bucket_and_an_empty_prefix_make_nothing(&azurite, dir.path(), says);
    let bare = NodeProcess::start(&dir.path().join("bare"));
    let refused = bare.ctl(&["dataset", "create", "d", "--kind", "bytes", "--source", "az://train/data/"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("AZURE_STORAGE_ACCOUNT_NAME"), "{said}");
    stores::assert_nothing_made(&bare);
}
