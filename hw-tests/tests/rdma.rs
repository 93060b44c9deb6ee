//! soft-RoCE across the rig's virtual wire: verbs traffic from the training
//! guest reaches the storage guest.

use std::time::Duration;

use hw_tests::{require, Host, Rig};

#[test]
fn rc_pingpong_crosses_the_wire_between_the_guests() {
    let Some(rig) = require(Rig::builder("rdma-pingpong").hosts(2).rdma(true).boot()) else { return };
    let device = rig.rdma_device().expect("an RDMA rig has a device");
    let state = rig.sh(Host::Storage, &format!("ibv_devinfo -d {device}")).expect("ibv_devinfo");
    assert!(state.contains("PORT_ACTIVE"), "{device} is not active:\n{state}");
    // RoCE v2 needs the GID that carries the wire address; find its index.
    let gid_index = |host: Host| {
        let script = format!(
            "for g in /sys/class/infiniband/{device}/ports/1/gid_attrs/types/*; do \
               i=$(basename $g); t=$(cat $g 2>/dev/null); \
               gid=$(cat /sys/class/infiniband/{device}/ports/1/gids/$i); \
               case \"$t $gid\" in 'RoCE v2 0000:0000:0000:0000:0000:ffff:'*) echo $i; break;; esac; done"
        );
        let index = rig.sh(host, &script).expect("gid table");
        assert!(!index.trim().is_empty(), "{device} on {} has no IPv4 RoCE v2 GID", host.name());
        index.trim().to_string()
    };
    let (server_gid, client_gid) = (gid_index(Host::Storage), gid_index(Host::Training));
    rig.sh(
        Host::Storage,
        &format!("setsid ibv_rc_pingpong -d {device} -g {server_gid} -n 200 > /tmp/pingpong.log 2>&1 &"),
    )
    .expect("start server");
    std::thread::sleep(Duration::from_secs(2));
    let client = rig
        .exec_with(
            Host::Training,
            &format!("ibv_rc_pingpong -d {device} -g {client_gid} -n 200 {}", rig.addr(Host::Storage)),
            Duration::from_secs(90),
        )
        .expect("run client");
    assert!(client.success(), "ibv_rc_pingpong client failed: {}\n{}", client.stderr, client.stdout);
    let report = format!("{}{}", client.stdout, client.stderr);
    assert!(report.contains("200 iters"), "client report: {report}");
    let server = rig.sh(Host::Storage, "sleep 1; cat /tmp/pingpong.log").expect("server log");
    assert!(server.contains("200 iters"), "server log: {server}");
}
