#!/bin/busybox sh
# PID 1 of a rig guest: load the modules the rig needs, make the host's root
# (shared read-only over 9p) the guest's root with a tmpfs overlay on top,
# mount the rig's shared directory at /rig and hand over to the agent.
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
host=unknown
for a in $(cat /proc/cmdline); do case $a in rig.host=*) host=${a#rig.host=};; esac; done
for m in @MODULES@; do modprobe $m 2>/dev/null || echo "rig: modprobe $m failed"; done
mkdir -p /lower /ov /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /lower || echo "rig: 9p hostroot failed"
mount -t tmpfs tmpfs /ov; mkdir -p /ov/up /ov/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/ov/up,workdir=/ov/work /newroot || echo "rig: overlay failed"
mount --move /proc /newroot/proc; mount --move /sys /newroot/sys; mount --move /dev /newroot/dev
mount -t tmpfs tmpfs /newroot/run
mount -t tmpfs tmpfs /newroot/dev/shm 2>/dev/null
mount -t hugetlbfs nodev /newroot/dev/hugepages 2>/dev/null
mkdir -p /newroot/rig
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 rigshare /newroot/rig || echo "rig: 9p rigshare failed"
echo "rig: guest $host up"
exec chroot /newroot /bin/sh /rig/agent.sh "$host"
