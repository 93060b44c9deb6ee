//! Source-backed datasets in Google Cloud Storage, against a real
//! GCS-compatible server (fake-gcs-server, on loopback): objects and
//! `.npy` arrays read back byte-exact, an overwritten or deleted object
//! failing only its ranges, a bucket that is not there refused by name.
//! `source_cache.rs` tests the same node code against S3; what differs
//! here is the store's own: its listing, its generations and ETags, and a
//! server that, like some GCS-compatible stores, sends a changed object
//! whatever `If-Match` says (the node's check of the response catches it).

mod common;

use common::gcs::FakeGcs;
use common::stores;

#[test]
fn objects_read_back_exact_and_a_changed_object_fails_only_its_own_ranges() {
    let Some(gcs) = FakeGcs::start() else { return };
    stores::cold_reads_are_exact_and_a_changed_object_fails_only_its_own_ranges(&gcs);
}

#[test]
fn a_missing_bucket_and_an_empty_prefix_are_refused_and_make_nothing() {
    let Some(gcs) = FakeGcs::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    stores::a_missing_bucket_and_an_empty_prefix_make_nothing(&gcs, dir.path(), "no bucket named nothere");
}
