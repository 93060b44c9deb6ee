//! Bad input gets a clear error, to the client that sent it only, and loses
//! nothing: unknown datasets, out-of-range reads, malformed and oversized
//! frames, clients that vanish mid-batch, truncated and mistyped `.npy`, a
//! dataset whose namespace file is gone.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{random_file, sealed_dataset, NodeProcess};
use sluice_client::blocking::{Client, Dataset};
use sluice_client::{RangeStatus, ReadRange};
use sluice_proto::codec::{self, ControlMessage, ErrorCode};
use sluice_proto::wire::{self, le, FrameHeader, FrameKind, RangeDescriptor};
use zerocopy::IntoBytes;

fn node_with_dataset(dir: &std::path::Path, len: usize) -> (NodeProcess, Vec<u8>) {
    let node = NodeProcess::start(&dir.join("node"));
    let data = random_file(&dir.join("data.bin"), len, 11);
    sealed_dataset(&node, "data", &[&dir.join("data.bin")]);
    (node, data)
}

/// Reads one range with a client and checks the bytes.
fn assert_serves(dataset: &Dataset, data: &[u8]) {
    let mut buf = vec![0u8; 4096];
    let statuses = dataset.read_batch(&[ReadRange { offset: 12_345, len: 4096, dest: 0 }], &mut buf).expect("read");
    assert_eq!(statuses, [RangeStatus::Ok]);
    assert!(buf == data[12_345..12_345 + 4096]);
}

fn send_frame(stream: &mut TcpStream, kind: FrameKind, payload: &[u8]) {
    let header = wire::frame_header(kind, payload.len() as u32);
    stream.write_all(header.as_bytes()).expect("send header");
    stream.write_all(payload).expect("send payload");
}

fn send_control(stream: &mut TcpStream, message: &ControlMessage) {
    send_frame(stream, FrameKind::Control, &codec::encode(message).expect("encode"));
}

/// The next frame from the node, or `None` at end of stream.
fn read_frame(stream: &mut TcpStream) -> Option<(FrameKind, Vec<u8>)> {
    let mut header = [0u8; FrameHeader::SIZE];
    stream.read_exact(&mut header).ok()?;
    let (kind, len) = wire::parse_frame_header(&header, true).expect("node frames are well-formed");
    let mut payload = vec![0u8; len as usize];
    stream.read_exact(&mut payload).expect("payload");
    Some((kind, payload))
}

fn read_control(stream: &mut TcpStream) -> ControlMessage {
    let (kind, payload) = read_frame(stream).expect("a reply");
    assert_eq!(kind, FrameKind::Control);
    codec::decode(&payload).expect("decode")
}

fn raw_connection(node: &NodeProcess, greet: bool) -> TcpStream {
    let mut stream = TcpStream::connect(&node.data_addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    if greet {
        send_control(&mut stream, &ControlMessage::Hello { protocol: 1, client: "raw".into() });
        assert!(matches!(read_control(&mut stream), ControlMessage::HelloOk { .. }));
    }
    stream
}

/// Expects an error message with `code`, then the node closing the stream.
fn expect_error_then_close(stream: &mut TcpStream, code: ErrorCode) -> String {
    let ControlMessage::Error { code: got, message } = read_control(stream) else {
        panic!("expected an error message");
    };
    assert_eq!(got, code, "{message}");
    assert!(read_frame(stream).is_none(), "the node closes the connection");
    message
}

/// Opening a dataset that does not exist fails for that open only.
#[test]
fn unknown_dataset_is_refused_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, data) = node_with_dataset(dir.path(), 100_000);
    let client = Client::connect(&node.endpoint).expect("connect");
    let err = client.open("no-such-dataset").err().expect("unknown dataset");
    assert!(err.to_string().contains("no dataset named \"no-such-dataset\""), "{err}");
    assert_serves(&client.open("data").expect("same client opens another"), &data);
    let out = node.ctl(&["read", "no-such-dataset", "--offset", "0", "--len", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no dataset named"));
}

/// A sealed dataset whose namespace file was lost (a disk replaced, a file
/// removed by hand) is refused with the reason at open; the node does not
/// make an empty file in its place, which would answer every read with a
/// checksum mismatch and hide what happened. The other datasets serve on.
#[test]
fn a_lost_namespace_file_is_refused_at_open_not_recreated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, data) = node_with_dataset(dir.path(), 100_000);
    let other = random_file(&dir.path().join("other.bin"), 50_000, 12);
    sealed_dataset(&node, "other", &[&dir.path().join("other.bin")]);
    let namespace_of = |name: &str| -> std::path::PathBuf {
        let shown: serde_json::Value =
            serde_json::from_str(&node.ctl_ok(&["--json", "dataset", "stat", name])).expect("dataset JSON");
        shown["namespace"]["path"].as_str().expect("namespace path").into()
    };
    let (lost, kept) = (namespace_of("data"), namespace_of("other"));
    assert!(lost.is_file() && kept.is_file(), "{} {}", lost.display(), kept.display());
    assert_serves(&Client::connect(&node.endpoint).expect("connect").open("data").expect("open"), &data);
    assert!(node.stop().success());

    std::fs::remove_file(&lost).expect("remove the namespace file");
    let node = NodeProcess::start(&dir.path().join("node"));
    let client = Client::connect(&node.endpoint).expect("connect");
    let err = client.open("data").err().expect("a dataset without its file does not open");
    assert!(err.to_string().contains("No such file"), "{err}");
    assert!(!lost.exists(), "opening a lost namespace made an empty file in its place");

    assert_serves(&client.open("other").expect("the other dataset opens"), &other);
}

/// Ranges past the end fail alone; the rest of the batch is served.
#[test]
fn out_of_range_reads_fail_only_their_range() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, data) = node_with_dataset(dir.path(), 100_000);
    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open("data").expect("open");
    let ranges = [
        ReadRange { offset: 0, len: 10, dest: 0 },
        ReadRange { offset: 99_999, len: 2, dest: 10 },
        ReadRange { offset: u64::MAX - 1, len: 4, dest: 20 },
        ReadRange { offset: 99_990, len: 10, dest: 30 },
        ReadRange { offset: 100_000, len: 0, dest: 40 },
        ReadRange { offset: 100_001, len: 0, dest: 40 },
    ];
    let mut buf = vec![0u8; 40];
    let statuses = dataset.read_batch(&ranges, &mut buf).expect("batch");
    use RangeStatus::*;
    assert_eq!(statuses, [Ok, OutOfBounds, OutOfBounds, Ok, Ok, OutOfBounds]);
    assert!(buf[..10] == data[..10] && buf[30..40] == data[99_990..]);
    let out = node.ctl(&["read", "data", "--offset", "99999", "--len", "2"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("out of bounds"));
    let err = dataset.read_batch(&[ReadRange { offset: 0, len: 10, dest: 35 }], &mut buf).expect_err("dest overflow");
    assert!(err.to_string().contains("does not fit"), "{err}");
}

/// Garbage, oversized, inconsistent and out-of-order frames close only the
/// connection that sent them, with an error saying why.
#[test]
fn malformed_frames_close_only_their_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, data) = node_with_dataset(dir.path(), 100_000);
    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open("data").expect("open");

    let mut http = raw_connection(&node, false);
    http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
    let message = expect_error_then_close(&mut http, ErrorCode::MalformedFrame);
    assert!(message.contains("bad magic"), "{message}");

    let mut huge = raw_connection(&node, true);
    let header = wire::frame_header(FrameKind::BatchRequest, 1 << 30);
    huge.write_all(header.as_bytes()).expect("send");
    let message = expect_error_then_close(&mut huge, ErrorCode::OversizedFrame);
    assert!(message.contains("exceeds the limit"), "{message}");

    let mut lying = raw_connection(&node, true);
    let mut frame = Vec::new();
    let range = RangeDescriptor {
        offset: le::U64::new(0),
        len: le::U32::new(1),
        reserved: le::U32::new(0),
        dest: le::U64::new(0),
    };
    wire::encode_batch_request(&mut frame, 1, 1, &[range, range]);
    frame[FrameHeader::SIZE + 12] = 3; // claims three ranges, carries two
    lying.write_all(&frame).expect("send");
    expect_error_then_close(&mut lying, ErrorCode::MalformedFrame);

    let mut rude = raw_connection(&node, false);
    wire::encode_batch_request(&mut frame, 1, 1, &[range]);
    rude.write_all(&frame).expect("send");
    let message = expect_error_then_close(&mut rude, ErrorCode::Protocol);
    assert!(message.contains("Hello"), "{message}");

    let mut garbage = raw_connection(&node, true);
    send_frame(&mut garbage, FrameKind::Control, &[0xff; 40]);
    expect_error_then_close(&mut garbage, ErrorCode::MalformedFrame);

    // A batch for a handle never opened fails that batch, not the connection.
    let mut stranger = raw_connection(&node, true);
    wire::encode_batch_request(&mut frame, 9, 77, &[range]);
    stranger.write_all(&frame).expect("send");
    let (kind, payload) = read_frame(&mut stranger).expect("response");
    assert_eq!(kind, FrameKind::BatchResponse);
    let status = u32::from_le_bytes(payload[8..12].try_into().expect("4 bytes"));
    assert_eq!(status, wire::BatchStatus::UnknownHandle as u32);
    send_control(&mut stranger, &ControlMessage::Open { name: "data".into(), token: None });
    assert!(matches!(read_control(&mut stranger), ControlMessage::Opened { .. }));

    assert_serves(&dataset, &data);
}

/// Clients that queue many large batches and vanish without reading return
/// every DMA buffer: later large batches still run.
#[test]
fn clients_vanishing_mid_batch_leave_the_node_healthy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, data) = node_with_dataset(dir.path(), 16 << 20);
    let range = |i: u64| RangeDescriptor {
        offset: le::U64::new((i * 131_072) % (15 << 20)),
        len: le::U32::new(131_072),
        reserved: le::U32::new(0),
        dest: le::U64::new(i * 131_072),
    };
    let ranges: Vec<RangeDescriptor> = (0..60).map(range).collect();
    let mut frame = Vec::new();
    for _ in 0..12 {
        let mut stream = raw_connection(&node, true);
        send_control(&mut stream, &ControlMessage::Open { name: "data".into(), token: None });
        let ControlMessage::Opened { handle, .. } = read_control(&mut stream) else { panic!("open failed") };
        for batch in 0..32 {
            wire::encode_batch_request(&mut frame, batch, handle, &ranges);
            if stream.write_all(&frame).is_err() {
                break;
            }
        }
        drop(stream);
    }
    // 12 x 32 batches of 7.5 MiB would hold far more than every core's DMA
    // slots; these reads only succeed if all of them came back.
    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open("data").expect("open");
    for _ in 0..20 {
        let ranges: Vec<ReadRange> =
            (0..60u64).map(|i| ReadRange { offset: i * 131_072, len: 131_072, dest: i * 131_072 }).collect();
        let mut buf = vec![0u8; 60 * 131_072];
        let statuses = dataset.read_batch(&ranges, &mut buf).expect("read");
        assert!(statuses.iter().all(|s| *s == RangeStatus::Ok));
        assert!(buf == data[..60 * 131_072]);
    }
}

/// A truncated or mistyped `.npy` is refused with a message that says so,
/// and the dataset keeps exactly what it had.
#[test]
fn bad_npy_ingest_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start(&dir.path().join("node"));
    node.ctl_ok(&["dataset", "create", "toks", "--kind", "tokens:u16"]);
    let mut truncated = sluice_proto::npy::encode_header("<u2", 1000);
    truncated.extend_from_slice(&[7u8; 1500]);
    let path = dir.path().join("cut.npy");
    std::fs::write(&path, &truncated).expect("write");
    let out = node.ctl(&["dataset", "ingest", "toks", path.to_str().expect("p")]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("truncated .npy") && stderr.contains("2000") && stderr.contains("1500"), "{stderr}");

    let mut wrong = sluice_proto::npy::encode_header("<f4", 10);
    wrong.extend_from_slice(&[0u8; 40]);
    let wrong_path = dir.path().join("floats.npy");
    std::fs::write(&wrong_path, &wrong).expect("write");
    let out = node.ctl(&["dataset", "ingest", "toks", wrong_path.to_str().expect("p")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("<f4") && stderr.contains("tokens:u16"), "{stderr}");

    let stat: serde_json::Value =
        serde_json::from_str(&node.ctl_ok(&["dataset", "stat", "toks", "--json"])).expect("json");
    assert_eq!((stat["length_bytes"].as_u64(), stat["state"].as_str()), (Some(0), Some("creating")));

    let mut good = sluice_proto::npy::encode_header("<u2", 1000);
    good.extend_from_slice(&[7u8; 2000]);
    let good_path = dir.path().join("good.npy");
    std::fs::write(&good_path, &good).expect("write");
    node.ctl_ok(&["dataset", "ingest", "toks", good_path.to_str().expect("p")]);
    node.ctl_ok(&["dataset", "seal", "toks"]);
    let stat: serde_json::Value =
        serde_json::from_str(&node.ctl_ok(&["dataset", "stat", "toks", "--json"])).expect("json");
    assert_eq!(stat["length_bytes"], 2000);
}

/// An upload the node refuses (here: into a sealed dataset) gets the error
/// in the response, not a connection reset mid-send.
#[test]
fn refused_upload_gets_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, _) = node_with_dataset(dir.path(), 1000);
    let url = format!("{}/v1/datasets/data/ingest", node.endpoint);
    let err = ureq::post(&url).send_bytes(&vec![0u8; 8 << 20]).expect_err("sealed datasets take no more files");
    let ureq::Error::Status(code, response) = err else { panic!("expected an HTTP error, got {err}") };
    assert_eq!(code, 409);
    let body: serde_json::Value = response.into_json().expect("json error");
    assert_eq!(body["error"]["code"], "wrong_state");
    assert!(body["error"]["message"].as_str().expect("message").contains("sealed"));
}
