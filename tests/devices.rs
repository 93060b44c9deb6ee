//! Namespace devices as a node owns them, on loop devices (real block
//! devices: O_EXCL, O_DIRECT, BLKDISCARD): one carrying someone else's
//! signature is left alone until the operator claims it; one held by
//! another process stops the start with a reason; and a node started as
//! root with `--user` drops every capability before serving, reads its
//! namespace device byte-exact through the descriptors it kept, and hands
//! nothing outside its data directory over through a planted link.

mod common;

use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::loopdev::LoopDevice;
use common::{random_file, NodeProcess};
use serde_json::Value;

fn root() -> bool {
    let root = nix::unistd::Uid::effective().is_root();
    if !root {
        let why = "SKIP: namespace devices and --user need root";
        assert!(std::env::var_os("CI").is_none(), "{why}");
        eprintln!("{why}");
    }
    root
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn namespace_kind(node: &NodeProcess, name: &str) -> String {
    let stat: Value = serde_json::from_str(&node.ctl_ok(&["--json", "dataset", "stat", name])).expect("json");
    stat["namespace"]["kind"].as_str().unwrap_or_default().to_string()
}

#[test]
fn a_device_with_a_filesystem_signature_is_left_alone_until_claimed() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(device) = LoopDevice::new(dir.path(), "ext4", 16 << 20) else { return };
    // An ext4 superblock's magic where libblkid looks for it.
    let file = std::fs::OpenOptions::new().write(true).open(&device.path).expect("open device");
    std::os::unix::fs::FileExt::write_all_at(&file, &[0x53, 0xef], 0x438).expect("write magic");
    file.sync_all().expect("sync");
    drop(file);
    let data = dir.path().join("node");
    let node = NodeProcess::start_secure_with(&data, &["--namespace-device", device.path_str()]);
    node.ctl_ok(&["dataset", "create", "a", "--kind", "bytes"]);
    assert_eq!(namespace_kind(&node, "a"), "file", "the signed device is not used");
    let devices: Value = serde_json::from_str(&node.ctl_ok(&["--json", "devices", "ls"])).expect("json");
    let report = devices
        .as_array()
        .and_then(|d| d.iter().find(|d| d["path"] == device.path_str()).cloned())
        .expect("the device is reported");
    let refused = report["refused"].as_str().unwrap_or_default();
    assert!(refused.contains("ext2/3/4") && refused.contains("--claim-device"), "{report}");
    drop(node);

    let node = NodeProcess::start_secure_with(
        &data,
        &["--namespace-device", device.path_str(), "--claim-device", device.path_str()],
    );
    node.ctl_ok(&["dataset", "create", "b", "--kind", "bytes"]);
    assert_eq!(namespace_kind(&node, "b"), "device", "claimed, the device takes the next dataset");
}

#[test]
fn a_device_another_process_holds_stops_the_start() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(device) = LoopDevice::new(dir.path(), "held", 8 << 20) else { return };
    let held =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_EXCL).open(&device.path).expect("hold O_EXCL");
    let log = dir.path().join("sluiced.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluiced"))
        .args(["--data-dir", path(&dir.path().join("node")), "--listen", "127.0.0.1:0", "--control", "127.0.0.1:0"])
        .args(["--namespace-device", device.path_str()])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("run sluiced");
    // A node that took the device anyway would serve on: wait a bounded time.
    let mut exited = None;
    common::eventually(20, || {
        exited = child.try_wait().expect("wait");
        exited.is_some()
    });
    if exited.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    drop(held);
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(exited.is_some_and(|status| !status.success()), "the start fails ({exited:?}): {stderr}");
    assert!(stderr.contains("is in use") && stderr.contains(device.path_str()), "{stderr}");
}

/// The account `--user` drops to in these tests.
const USER: &str = "nobody";

fn status_field(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status.lines().find_map(|l| l.strip_prefix(&format!("{field}:"))).unwrap_or_default().trim().to_string()
}

#[test]
fn user_with_a_namespace_device_serves_byte_exact_with_no_capability() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // The service user must reach its data directory.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let Some(device) = LoopDevice::new(dir.path(), "ns", 32 << 20) else { return };
    let outside = dir.path().join("root-owned");
    std::fs::create_dir(&outside).expect("outside dir");
    std::fs::write(outside.join("secret"), b"root's").expect("secret");
    let data = dir.path().join("node");
    std::fs::create_dir(&data).expect("data dir");
    std::os::unix::fs::symlink(&outside, data.join("planted")).expect("plant a link");

    let node = NodeProcess::start_secure_with(&data, &["--user", USER, "--namespace-device", device.path_str()]);
    let pid = node.child.id();
    let nobody = nix::unistd::User::from_name(USER).expect("lookup").expect("user nobody");
    assert_eq!(status_field(pid, "Uid").split_whitespace().next(), Some(nobody.uid.to_string().as_str()));
    for caps in ["CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(status_field(pid, caps), "0000000000000000", "{caps} of the node");
    }
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");

    let expected = random_file(&dir.path().join("corpus.bin"), (5 << 20) + 777, 9);
    node.ctl_ok(&["dataset", "create", "corpus", "--kind", "bytes"]);
    assert_eq!(namespace_kind(&node, "corpus"), "device");
    node.ctl_ok(&["dataset", "ingest", "corpus", path(&dir.path().join("corpus.bin"))]);
    node.ctl_ok(&["dataset", "seal", "corpus"]);
    let grant: Value =
        serde_json::from_str(&node.ctl_ok(&["--json", "grant", "create", "corpus", "--client", "t"])).expect("json");
    let options = sluice_client::OpenOptions {
        token: grant["token"].as_str().map(String::from),
        ..sluice_client::OpenOptions::default()
    };
    let client = sluice_client::blocking::Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open_with("corpus", options).expect("open");
    let mut buf = vec![0u8; expected.len()];
    let ranges = [sluice_client::ReadRange { offset: 0, len: expected.len() as u32, dest: 0 }];
    assert_eq!(dataset.read_batch(&ranges, &mut buf).expect("read"), [sluice_client::RangeStatus::Ok]);
    assert!(buf == expected, "byte-exact from the device, as {USER}");

    assert_eq!(std::fs::metadata(data.join("catalog.redb")).expect("catalog").uid(), nobody.uid.as_raw());
    assert_eq!(std::fs::metadata(&outside).expect("outside").uid(), 0, "the link's target keeps its owner");
    assert_eq!(std::fs::metadata(outside.join("secret")).expect("secret").uid(), 0);
}

/// Processes whose parent is `pid` and whose command line has `marker`.
fn children_with(pid: u32, marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("proc").flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(cmdline) = std::fs::read(format!("/proc/{child}/cmdline")) else { continue };
        let parent = std::fs::read_to_string(format!("/proc/{child}/status"))
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("PPid:")).map(|p| p.trim().to_string()));
        if parent.as_deref() == Some(pid.to_string().as_str())
            && cmdline.split(|b| *b == 0).any(|arg| arg == marker.as_bytes())
        {
            found.push(child);
        }
    }
    found
}

/// `--user` with an NVMe controller: the node drops everything and leaves
/// the controller's admin commands to one helper process that keeps
/// `CAP_SYS_ADMIN` alone, reaches the controller through it (this machine
/// has none, so the helper's error comes back through `devices ls` and the
/// allocator's reason), and takes the helper along when it is killed. The
/// rig attaches, reads and detaches real namespaces this way
/// (`hw-tests/tests/sluice.rs`).
#[test]
fn user_with_a_controller_leaves_admin_commands_to_one_narrow_helper() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let data = dir.path().join("node");
    let controller = dir.path().join("nvme-absent");
    let mut node = NodeProcess::start_secure_with(&data, &["--user", USER, "--nvme-controller", path(&controller)]);
    let pid = node.child.id();
    for caps in ["CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(status_field(pid, caps), "0000000000000000", "{caps} of the node");
    }
    let helpers = children_with(pid, "--nvme-admin-helper");
    let [helper] = helpers[..] else { panic!("one helper process, not {helpers:?}") };
    assert_eq!(status_field(helper, "Uid").split_whitespace().next(), Some("0"), "the helper stays root");
    let sys_admin = format!("{:016x}", 1u64 << 21);
    for caps in ["CapPrm", "CapEff", "CapBnd"] {
        assert_eq!(status_field(helper, caps), sys_admin, "{caps} of the helper: CAP_SYS_ADMIN alone");
    }
    assert_eq!(status_field(helper, "CapAmb"), "0000000000000000");
    assert_eq!(status_field(helper, "CapInh"), "0000000000000000");
    assert_eq!(status_field(helper, "NoNewPrivs"), "1");

    let devices: Value = serde_json::from_str(&node.ctl_ok(&["--json", "devices", "ls"])).expect("json");
    let reported = devices.as_array().expect("devices").iter().find(|d| d["path"] == path(&controller)).cloned();
    let reported = reported.unwrap_or_else(|| panic!("the controller is listed: {devices}"));
    assert_eq!(reported["kind"], "nvme_controller_unreadable", "{reported}");
    assert!(reported["refused"].as_str().unwrap_or("").contains("No such file"), "the helper's error: {reported}");
    node.ctl_ok(&["dataset", "create", "first", "--kind", "bytes"]);
    let stat: Value = serde_json::from_str(&node.ctl_ok(&["--json", "dataset", "stat", "first"])).expect("json");
    assert_eq!(stat["namespace"]["kind"], "file", "{stat}");
    let reason = stat["namespace"]["reason"].as_str().unwrap_or("");
    assert!(reason.contains(path(&controller)) && reason.contains("No such file"), "asked the helper: {stat}");

    node.kill();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{helper}")).exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let left = std::fs::read_to_string(format!("/proc/{helper}/status")).unwrap_or_default();
    assert!(left.is_empty() || left.contains("State:\tZ"), "the helper outlived the killed node: {left}");
}
