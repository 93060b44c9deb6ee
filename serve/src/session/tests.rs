//! The session state machine driven by hand, as a transport would drive
//! it: no socket, no queue pair.

use std::sync::atomic::Ordering;

use sluice_dataplane::steer::FlowTable;

use super::*;

fn limits() -> SessionLimits {
    SessionLimits {
        node_name: "n1".into(),
        ranges_per_batch_max: 4,
        batch_footprint_max_bytes: 1 << 20,
        credits: 8,
        handshake_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(60),
    }
}

fn hello() -> ControlMessage {
    ControlMessage::Hello { protocol: PROTOCOL, client: "test".into() }
}

fn open(name: &str) -> ControlMessage {
    ControlMessage::Open { name: name.into(), token: Some(codec::Secret::new("t".into())) }
}

fn opened(grant: Option<u64>) -> (Result<Opened, OpenError>, Arc<DatasetCounters>) {
    let counters = Arc::new(DatasetCounters::default());
    let info = OpenInfo {
        kind: "bytes".into(),
        length_bytes: 1 << 20,
        content_hash: String::new(),
        chunk_size_bytes: 1 << 20,
        replicas: Vec::new(),
    };
    let slot = DatasetSlot { index: 3, generation: 7 };
    (Ok(Opened { slot, info, grant, counters: Arc::clone(&counters), read_through: None }), counters)
}

/// Hello, then an open the catalog grants: the session's first handle.
fn greeted_and_opened(
    session: &mut Session,
    flows: &Arc<FlowTable>,
    grant: Option<u64>,
) -> (u32, Arc<DatasetCounters>) {
    assert!(matches!(session.control(hello()), Ok(ControlAction::Reply(ControlMessage::HelloOk { .. }))));
    let Ok(ControlAction::Resolve { name, token }) = session.control(open("data")) else {
        panic!("an open asks the catalog")
    };
    assert_eq!((name.as_str(), token.as_deref()), ("data", Some("t")));
    let (outcome, counters) = opened(grant);
    let ControlMessage::Opened { handle, .. } = session.opened(name, outcome, || flows.open([0; 16])) else {
        panic!("granted open")
    };
    (handle, counters)
}

#[test]
fn hello_announces_the_limits_the_session_then_enforces() {
    let mut session = Session::new(limits(), Instant::now());
    let Ok(ControlAction::Reply(ControlMessage::HelloOk {
        node,
        ranges_per_batch_max,
        batch_footprint_max_bytes,
        credits,
    })) = session.control(hello())
    else {
        panic!("HelloOk")
    };
    assert_eq!((node.as_str(), ranges_per_batch_max, batch_footprint_max_bytes, credits), ("n1", 4, 1 << 20, 8));
}

#[test]
fn nothing_but_hello_comes_first() {
    for first in [open("data"), ControlMessage::Close { handle: 1 }] {
        let mut session = Session::new(limits(), Instant::now());
        assert!(matches!(session.control(first), Err(Fatal::Protocol(_))));
    }
    let mut session = Session::new(limits(), Instant::now());
    assert!(matches!(session.admit(1, [4096u32].into_iter(), true), Err(Fatal::Protocol(_))));
    let old = ControlMessage::Hello { protocol: PROTOCOL + 1, client: "future".into() };
    let err = Session::new(limits(), Instant::now()).control(old).expect_err("another protocol");
    assert!(err.to_string().contains("node speaks 1"), "{err}");
    // A client may not answer for the node.
    let mut session = Session::new(limits(), Instant::now());
    session.control(hello()).expect("hello");
    let reply =
        ControlMessage::HelloOk { node: "x".into(), ranges_per_batch_max: 1, batch_footprint_max_bytes: 1, credits: 1 };
    assert!(matches!(session.control(reply), Err(Fatal::Protocol(_))));
}

#[test]
fn batches_are_checked_against_their_handle_and_the_limits() {
    let flows = Arc::new(FlowTable::new());
    let mut session = Session::new(limits(), Instant::now());
    let (handle, counters) = greeted_and_opened(&mut session, &flows, None);
    assert!(session.authenticated());

    let Ok(Admission::Admitted { slot, counters: counted, .. }) = session.admit(handle, [4096u32; 4].into_iter(), true)
    else {
        panic!("a batch within the limits")
    };
    assert_eq!(slot, DatasetSlot { index: 3, generation: 7 });
    assert!(Arc::ptr_eq(&counted, &counters));

    let refusals = [
        (handle + 1, vec![4096u32], true, BatchStatus::UnknownHandle),
        (handle, vec![4096u32; 5], true, BatchStatus::TooLarge),
        (handle, vec![2u32 << 20], true, BatchStatus::TooLarge),
        (handle, vec![4096u32], false, BatchStatus::BadDestination),
    ];
    for (at, lens, fit, want) in refusals {
        let Ok(Admission::Refused(status)) = session.admit(at, lens.into_iter(), fit) else { panic!("refused") };
        assert_eq!(status, want);
    }
    // Refusals of an open handle count against its dataset; one of an
    // unknown handle has no dataset to count against.
    assert_eq!(counters.batches_failed.load(Ordering::Relaxed), 3);
}

#[test]
fn close_forgets_the_handle_and_its_flow() {
    let flows = Arc::new(FlowTable::new());
    let mut session = Session::new(limits(), Instant::now());
    let (handle, _) = greeted_and_opened(&mut session, &flows, None);
    assert_eq!(flows.open_count(), 1);
    assert!(matches!(session.control(ControlMessage::Close { handle }), Ok(ControlAction::Silent)));
    assert_eq!(flows.open_count(), 0, "the handle's flow closes with it");
    let Ok(Admission::Refused(BatchStatus::UnknownHandle)) = session.admit(handle, [1u32].into_iter(), true) else {
        panic!("a closed handle is unknown")
    };
}

#[test]
fn a_refused_open_leaves_no_handle_and_no_authentication() {
    let flows = Arc::new(FlowTable::new());
    let mut session = Session::new(limits(), Instant::now());
    session.control(hello()).expect("hello");
    let denied = Err(OpenError { code: ErrorCode::AccessDenied, message: "no grant".into() });
    let reply = session.opened("data".into(), denied, || flows.open([0; 16]));
    assert!(matches!(reply, ControlMessage::Error { code: ErrorCode::AccessDenied, .. }));
    assert_eq!(flows.open_count(), 0);
    assert!(!session.authenticated(), "the handshake deadline still runs");
}

/// A name no dataset can have is answered without asking the catalog, in
/// a reply that fits a frame however long the name.
#[test]
fn a_name_longer_than_any_dataset_is_answered_here() {
    let mut session = Session::new(limits(), Instant::now());
    session.control(hello()).expect("hello");
    let longest = "n".repeat(codec::DATASET_NAME_BYTES_MAX);
    assert!(matches!(session.control(open(&longest)), Ok(ControlAction::Resolve { .. })));
    let long = "n".repeat(wire::CONTROL_PAYLOAD_MAX_BYTES as usize - 64);
    let Ok(ControlAction::Reply(reply)) = session.control(open(&long)) else { panic!("answered here") };
    let ControlMessage::Error { code: ErrorCode::UnknownDataset, message } = &reply else { panic!("{reply:?}") };
    assert!(message.contains("at most 128 bytes"), "{message}");
    assert!(codec::encode(&reply).is_ok_and(|b| b.len() < 256));
    assert!(!session.authenticated());
}

#[test]
fn the_handle_table_is_bounded() {
    let flows = Arc::new(FlowTable::new());
    let mut session = Session::new(limits(), Instant::now());
    session.control(hello()).expect("hello");
    for _ in 0..HANDLES_PER_SESSION_MAX {
        let (outcome, _) = opened(None);
        assert!(matches!(
            session.opened("data".into(), outcome, || flows.open([0; 16])),
            ControlMessage::Opened { .. }
        ));
    }
    let Ok(ControlAction::Reply(ControlMessage::Error { code, message })) = session.control(open("data")) else {
        panic!("the table is full")
    };
    assert_eq!(code, ErrorCode::Protocol);
    assert!(message.contains("1024"), "{message}");
    // An answer that arrives when the table filled meanwhile opens nothing.
    let (outcome, _) = opened(None);
    assert!(matches!(session.opened("data".into(), outcome, || flows.open([0; 16])), ControlMessage::Error { .. }));
}

#[test]
fn a_revoked_grant_names_its_dataset() {
    let flows = Arc::new(FlowTable::new());
    let mut session = Session::new(limits(), Instant::now());
    greeted_and_opened(&mut session, &flows, Some(11));
    let (outcome, _) = opened(Some(11));
    session.opened("data".into(), outcome, || flows.open([0; 16]));
    assert_eq!(session.granted.len(), 1, "a re-open under the same grant adds no entry");
    assert_eq!(session.revoked(|_| true), None);
    assert_eq!(session.revoked(|grant| grant != 11), Some("data"));
}

#[test]
fn the_handshake_deadline_gives_way_to_the_idle_timeout() {
    let start = Instant::now();
    let flows = Arc::new(FlowTable::new());
    let mut session = Session::new(limits(), start);
    let (at, why) = session.deadline(true).expect("a handshake deadline");
    assert_eq!(at, start + Duration::from_secs(5));
    assert!(why.contains("handshake"));
    // A trickle of frames does not move the handshake deadline.
    session.heard(start + Duration::from_secs(4));
    assert_eq!(session.deadline(true).map(|(at, _)| at), Some(start + Duration::from_secs(5)));

    greeted_and_opened(&mut session, &flows, None);
    let later = start + Duration::from_secs(10);
    session.heard(later);
    let (at, why) = session.deadline(true).expect("an idle deadline");
    assert_eq!(at, later + Duration::from_secs(60));
    assert!(why.contains("idle"));
    assert_eq!(session.deadline(false), None, "a session waiting for its batches is not idle");
}

#[test]
fn farewells_carry_the_reason_and_its_code() {
    let revoked = Fatal::Revoked("data".into());
    let ControlMessage::Error { code, message } = revoked.farewell() else { panic!("an error") };
    assert_eq!(code, ErrorCode::AccessDenied);
    assert!(message.contains("data"));
    assert_eq!(
        Fatal::Frame(wire::FrameError::Oversized { kind: FrameKind::Control, len: 1 << 30, max: 1 }).code(),
        ErrorCode::OversizedFrame
    );
    let stray = Fatal::unexpected_frame(FrameKind::RdmaBatchRequest, FrameKind::BatchRequest);
    assert!(stray.to_string().contains("RDMA batch on a TCP connection"));
}
