//! QEMU's own view of a guest's wire NIC, over the QMP socket each guest
//! of a two-host rig opens in its run directory.
//!
//! When the wire stops carrying a guest's frames, the guest's counters
//! cannot say on which side of the virtqueue they stop. QEMU can: its
//! transmit queue's `inuse` counts frames it took from the guest but has
//! not handed back (a send into the wire that never finished), and the
//! guest's ring indices against QEMU's `last_avail_idx` say whether the
//! guest posted frames QEMU never looked at (a lost notification).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::Host;

/// The QOM id of the wire's virtio-net device in both guests.
pub(super) const WIRE_NIC_ID: &str = "wire-nic";

/// Longer socket paths do not fit `sockaddr_un`; the rig then runs
/// without QMP and the report says so.
const QMP_PATH_MAX: usize = 100;

/// How long one QMP answer may take: QEMU's main loop answers between
/// its other work, and a TCG guest keeps it busy.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// virtio-net's receive and transmit queues, in QEMU's numbering.
const RX_QUEUE: u16 = 0;
const TX_QUEUE: u16 = 1;

/// Where `host`'s QEMU serves QMP, or why it cannot.
pub(super) fn qmp_socket(run_dir: &Path, host: Host) -> Result<PathBuf, String> {
    let socket = run_dir.join(format!("{}.qmp", host.name()));
    if socket.as_os_str().len() < QMP_PATH_MAX {
        Ok(socket)
    } else {
        Err(format!("no QMP: the socket path {} is too long", socket.display()))
    }
}

/// QEMU's state of `host`'s wire NIC: both queues' indices and the
/// transmit ring as the guest last wrote it, as QMP's JSON answers.
pub(super) fn wire_nic_queues(run_dir: &Path, host: Host) -> String {
    let socket = match qmp_socket(run_dir, host) {
        Ok(socket) => socket,
        Err(why) => return format!("({why})"),
    };
    let backend = format!("/machine/peripheral/{WIRE_NIC_ID}/virtio-backend");
    let queries = [
        format!(r#"{{"execute":"x-query-virtio-queue-status","arguments":{{"path":"{backend}","queue":{TX_QUEUE}}}}}"#),
        format!(
            r#"{{"execute":"x-query-virtio-queue-element","arguments":{{"path":"{backend}","queue":{TX_QUEUE}}}}}"#
        ),
        format!(r#"{{"execute":"x-query-virtio-queue-status","arguments":{{"path":"{backend}","queue":{RX_QUEUE}}}}}"#),
    ];
    match ask(&socket, &queries) {
        Ok(answers) => answers,
        Err(e) => format!("(QMP at {}: {e})", socket.display()),
    }
}

/// The next line from QEMU that is not an event.
fn next_answer(reader: &mut BufReader<UnixStream>) -> std::io::Result<String> {
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "QEMU closed the socket"));
        }
        if !line.starts_with(r#"{"event""#) {
            return Ok(line.trim_end().to_string());
        }
    }
}

/// Sends each query after the capabilities handshake and returns the
/// queries with their answers, one pair a line; events QEMU sends in
/// between are skipped.
fn ask(socket: &Path, queries: &[String]) -> std::io::Result<String> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(ANSWER_WITHIN))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let _greeting = next_answer(&mut reader)?;
    writeln!(stream, r#"{{"execute":"qmp_capabilities"}}"#)?;
    let _ = next_answer(&mut reader)?;
    let mut out = String::new();
    for query in queries {
        writeln!(stream, "{query}")?;
        out += &format!("{query}\n  -> {}\n", next_answer(&mut reader)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A QMP peer that greets, sends an event before the handshake's
    /// answer, and answers each query with its own line number.
    #[test]
    fn skips_events_and_pairs_each_query_with_its_answer() {
        let dir = std::env::temp_dir().join(format!("sluice-qmp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let socket = dir.join("g.qmp");
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).expect("bind");
        let peer = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().expect("accept");
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            writeln!(stream, r#"{{"QMP": {{"version": {{}}}}}}"#).expect("greet");
            let mut line = String::new();
            reader.read_line(&mut line).expect("handshake");
            assert!(line.contains("qmp_capabilities"), "{line}");
            writeln!(stream, r#"{{"event": "NIC_RX_FILTER_CHANGED"}}"#).expect("event");
            writeln!(stream, r#"{{"return": {{}}}}"#).expect("handshake answer");
            for n in 0..2 {
                line.clear();
                reader.read_line(&mut line).expect("query");
                writeln!(stream, r#"{{"return": {{"n": {n}}}}}"#).expect("answer");
            }
        });
        let out = ask(&socket, &["q0".to_string(), "q1".to_string()]).expect("ask");
        peer.join().expect("peer");
        assert_eq!(out, "q0\n  -> {\"return\": {\"n\": 0}}\nq1\n  -> {\"return\": {\"n\": 1}}\n");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
