//! NVMe in the storage guest: controllers and namespaces as the rig made
//! them, attach and detach of a detached namespace, and handing a controller
//! to vfio-pci (what SPDK needs) and back.

use hw_tests::{require, Host, NvmeController, Rig};

const CONTROLLERS: usize = 2;
const NAMESPACES_EACH: usize = 3;
const DETACHED_EACH: usize = 1;

fn rig(test: &str) -> Option<Rig> {
    require(Rig::builder(test).nvme(CONTROLLERS, NAMESPACES_EACH).detached(DETACHED_EACH).boot())
}

/// The namespace ids of `controller` the kernel exposes as block devices.
fn attached_nsids(rig: &Rig, controller: &NvmeController) -> Vec<u32> {
    rig.namespace_devices(controller).expect("list namespaces").into_iter().map(|(nsid, _)| nsid).collect()
}

#[test]
fn boots_with_the_controllers_and_namespaces_it_was_given() {
    let Some(rig) = rig("nvme-boot") else { return };
    if rig.is_emulated() {
        let release = rig.sh(Host::Storage, "uname -r").expect("uname");
        assert!(release.trim().ends_with("-amd64"), "guest runs Debian's kernel, got {release}");
    }
    assert_eq!(rig.nvme_controllers().len(), CONTROLLERS);
    for controller in rig.nvme_controllers() {
        let attached = attached_nsids(&rig, controller);
        if rig.is_emulated() {
            let expected: Vec<u32> = (1..=(NAMESPACES_EACH - DETACHED_EACH) as u32).collect();
            assert_eq!(attached, expected, "attached namespaces of {controller:?}");
        } else {
            assert!(!attached.is_empty(), "{controller:?} exposes no namespace");
        }
        // The controller answers admin commands through the kernel.
        let id_ctrl = rig.sh(Host::Storage, &format!("nvme id-ctrl /dev/{}", controller.name)).expect("id-ctrl");
        assert!(id_ctrl.contains("sn "), "id-ctrl output: {id_ctrl}");
    }
}

#[test]
fn attaches_and_detaches_a_detached_namespace() {
    let Some(rig) = rig("nvme-attach") else { return };
    if !rig.is_emulated() {
        eprintln!("SKIPPED: attach/detach changes a real controller's namespaces; run it in the rig only");
        return;
    }
    let ctrl = rig.nvme_controllers()[0].clone();
    let controller = ctrl.name.clone();
    let nsid = NAMESPACES_EACH as u32;
    assert!(!attached_nsids(&rig, &ctrl).contains(&nsid), "namespace {nsid} starts detached");
    let cntlid = rig
        .sh(Host::Storage, &format!("nvme id-ctrl /dev/{controller} | awk '$1 == \"cntlid\" {{print $3}}'"))
        .expect("cntlid");
    let cntlid = cntlid.trim();
    rig.sh(
        Host::Storage,
        &format!(
            "nvme attach-ns /dev/{controller} --namespace-id={nsid} --controllers={cntlid} && \
             nvme ns-rescan /dev/{controller}"
        ),
    )
    .expect("attach-ns");
    let devices = rig.namespace_devices(&ctrl).expect("list namespaces");
    let dev = &devices.iter().find(|(id, _)| *id == nsid).expect("namespace attached").1;
    // The attached namespace takes I/O: write a block, read it back.
    let roundtrip = rig
        .sh(
            Host::Storage,
            &format!(
                "head -c 4096 /dev/urandom > /tmp/block && dd if=/tmp/block of={dev} oflag=direct bs=4096 count=1 2>/dev/null && \
                 dd if={dev} iflag=direct bs=4096 count=1 2>/dev/null | cmp - /tmp/block && echo same"
            ),
        )
        .expect("block round trip");
    assert_eq!(roundtrip.trim(), "same");
    rig.sh(
        Host::Storage,
        &format!("nvme detach-ns /dev/{controller} --namespace-id={nsid} --controllers={cntlid} && nvme ns-rescan /dev/{controller}"),
    )
    .expect("detach-ns");
    assert!(!attached_nsids(&rig, &ctrl).contains(&nsid), "namespace {nsid} detached again");
}

#[test]
fn hands_a_controller_to_vfio_and_back() {
    let Some(rig) = rig("nvme-vfio") else { return };
    if !rig.is_emulated() {
        eprintln!("SKIPPED: rebinding a real controller takes it from the kernel; run it in the rig only");
        return;
    }
    let controller = rig.nvme_controllers()[CONTROLLERS - 1].clone();
    let pci = &controller.pci;
    let bound = |rig: &Rig| {
        rig.sh(Host::Storage, &format!("basename $(readlink -f /sys/bus/pci/devices/{pci}/driver)")).expect("driver")
    };
    assert_eq!(bound(&rig).trim(), "nvme");
    let group = rig
        .sh(
            Host::Storage,
            &format!(
                "echo {pci} > /sys/bus/pci/drivers/nvme/unbind && \
                 echo vfio-pci > /sys/bus/pci/devices/{pci}/driver_override && \
                 echo {pci} > /sys/bus/pci/drivers_probe && \
                 basename $(readlink -f /sys/bus/pci/devices/{pci}/iommu_group)"
            ),
        )
        .expect("bind vfio-pci");
    assert_eq!(bound(&rig).trim(), "vfio-pci");
    rig.sh(Host::Storage, &format!("test -c /dev/vfio/{}", group.trim())).expect("the vfio group device exists");
    assert!(
        !rig.sh(Host::Storage, "ls /sys/class/nvme").expect("ls").contains(&controller.name),
        "the kernel let go of {}",
        controller.name
    );
    rig.sh(
        Host::Storage,
        &format!(
            "echo {pci} > /sys/bus/pci/drivers/vfio-pci/unbind && \
             echo > /sys/bus/pci/devices/{pci}/driver_override && \
             echo {pci} > /sys/bus/pci/drivers_probe"
        ),
    )
    .expect("back to nvme");
    assert_eq!(bound(&rig).trim(), "nvme");
}
