//! The NVMe admin command layouts sluice uses, without I/O: Identify pages
//! parsed, and the data pages of Namespace Management and Namespace
//! Attachment built. Both admin paths read controllers through it: the
//! kernel's passthrough ioctls (`sluice_control::nvme`) and SPDK
//! (`driver::spdk`), so an offset is written once and a controller's page
//! is read the same way whichever driver owns it.
//!
//! Offsets are those of the NVMe Base Specification 1.4 (Identify
//! Controller figure 247, Identify Namespace figure 245, Controller List
//! figure 250). Every parser takes a page of any length and refuses one
//! shorter than an Identify page instead of indexing past it: the bytes
//! come from a device.

/// Admin opcode: Identify.
pub const OPCODE_IDENTIFY: u8 = 0x06;
/// Admin opcode: Namespace Management (create, delete).
pub const OPCODE_NS_MANAGEMENT: u8 = 0x0d;
/// Admin opcode: Namespace Attachment (attach, detach).
pub const OPCODE_NS_ATTACHMENT: u8 = 0x15;
/// Namespace Management SEL (CDW10 bits 3:0): create.
pub const NS_MANAGEMENT_CREATE: u32 = 0;
/// Namespace Management SEL: delete.
pub const NS_MANAGEMENT_DELETE: u32 = 1;
/// Namespace Attachment SEL (CDW10 bits 3:0): attach.
pub const NS_ATTACH: u32 = 0;
/// Namespace Attachment SEL: detach.
pub const NS_DETACH: u32 = 1;

/// Identify CNS: the namespace NSID names (active on this controller).
pub const CNS_NAMESPACE: u32 = 0x00;
/// Identify CNS: the controller.
pub const CNS_CONTROLLER: u32 = 0x01;
/// Identify CNS: the NSIDs active on this controller.
pub const CNS_ACTIVE_NSIDS: u32 = 0x02;
/// Identify CNS: the NSIDs allocated in the subsystem.
pub const CNS_ALLOCATED_NSIDS: u32 = 0x10;
/// Identify CNS: the namespace of an allocated NSID, attached here or not.
pub const CNS_ALLOCATED_NAMESPACE: u32 = 0x11;

/// The NSID that names every namespace (Identify Namespace with it: the
/// capabilities common to all).
pub const NSID_ALL: u32 = 0xffff_ffff;
/// Every Identify data structure and every admin data page here is 4 KiB.
pub const PAGE_BYTES: usize = 4096;
/// The most NSIDs one Identify list page holds (4 bytes each).
pub const NSID_LIST_MAX: usize = PAGE_BYTES / 4;
/// The block size assumed where a controller reports no valid LBA format
/// (the one every NVMe namespace format supports).
pub const DEFAULT_BLOCK_BYTES: u64 = 512;

/// Identify Controller CNTLID (bytes 79:78).
const CNTLID_AT: usize = 78;
/// Identify Controller OACS (bytes 257:256).
const OACS_AT: usize = 256;
/// OACS bit 3: Namespace Management and Attachment.
const OACS_NS_MANAGEMENT: u16 = 1 << 3;
/// Identify Namespace NSZE (bytes 7:0), NCAP (15:8).
const NSZE_AT: usize = 0;
const NCAP_AT: usize = 8;
/// Identify Namespace FLBAS (byte 26): bits 3:0 the LBA format in use.
const FLBAS_AT: usize = 26;
/// Identify Namespace NMIC (byte 30): bit 0, shared by several controllers.
const NMIC_AT: usize = 30;
/// Identify Namespace NGUID (bytes 119:104) and EUI64 (127:120).
const NGUID_AT: usize = 104;
const EUI64_AT: usize = 120;
/// Identify Namespace LBAF0 (bytes 131:128); LBADS is its byte 2. Sixteen
/// formats of 4 bytes each follow.
const LBAF_AT: usize = 128;

/// A page that cannot be an Identify data structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("an Identify page is {PAGE_BYTES} bytes; this one is {len_bytes}")]
pub struct ShortPage {
    pub len_bytes: usize,
}

fn page_of(bytes: &[u8]) -> Result<&[u8; PAGE_BYTES], ShortPage> {
    bytes.get(..PAGE_BYTES).and_then(|p| p.try_into().ok()).ok_or(ShortPage { len_bytes: bytes.len() })
}

fn u16_at(page: &[u8; PAGE_BYTES], at: usize) -> u16 {
    u16::from_le_bytes([page[at], page[at + 1]])
}

fn u64_at(page: &[u8; PAGE_BYTES], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&page[at..at + 8]);
    u64::from_le_bytes(word)
}

/// What sluice reads of Identify Controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControllerInfo {
    /// CNTLID: the id Namespace Attachment names this controller by.
    pub controller_id: u16,
    /// OACS bit 3. Some controllers advertise it and still refuse create
    /// (QEMU 7.2): callers fall back to the detached pool.
    pub manages_namespaces: bool,
}

impl ControllerInfo {
    pub fn parse(bytes: &[u8]) -> Result<Self, ShortPage> {
        let page = page_of(bytes)?;
        Ok(Self {
            controller_id: u16_at(page, CNTLID_AT),
            manages_namespaces: u16_at(page, OACS_AT) & OACS_NS_MANAGEMENT != 0,
        })
    }
}

/// What sluice reads of Identify Namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// NSZE: the namespace's size in blocks of its format.
    pub size_blocks: u64,
    /// The block size of the LBA format FLBAS names; `None` where that
    /// format's LBADS is not a size NVMe allows (2^9 to 2^16).
    pub block_bytes: Option<u64>,
    /// NMIC bit 0: the namespace may be attached to more than one
    /// controller, so another host may write it. Never taken for a dataset.
    pub shared: bool,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
}

impl NamespaceInfo {
    pub fn parse(bytes: &[u8]) -> Result<Self, ShortPage> {
        let page = page_of(bytes)?;
        let format = usize::from(page[FLBAS_AT] & 0x0f);
        let mut nguid = [0u8; 16];
        nguid.copy_from_slice(&page[NGUID_AT..NGUID_AT + 16]);
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&page[EUI64_AT..EUI64_AT + 8]);
        Ok(Self {
            size_blocks: u64_at(page, NSZE_AT),
            block_bytes: lbads_bytes(page[LBAF_AT + 4 * format + 2]),
            shared: page[NMIC_AT] & 1 != 0,
            nguid,
            eui64,
        })
    }

    /// NSZE blocks of the format in use; 0 where the format names no valid
    /// block size (never a wrong number).
    pub fn capacity_bytes(&self) -> u64 {
        self.block_bytes.map_or(0, |block| self.size_blocks.saturating_mul(block))
    }

    /// NGUID and EUI64 as hex, `NGUID-EUI64`: what identifies a namespace
    /// whatever its NSID. All zeros where the controller reports neither
    /// ([`identity_is_blank`]).
    pub fn identity(&self) -> String {
        format!("{}-{}", hex(&self.nguid), hex(&self.eui64))
    }
}

/// An identity of all zeros: the controller reports no NGUID or EUI64.
pub fn identity_is_blank(identity: &str) -> bool {
    identity.bytes().all(|b| b == b'0' || b == b'-')
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `2^lbads` where NVMe allows it (512 B to 64 KiB).
fn lbads_bytes(lbads: u8) -> Option<u64> {
    (9..=16).contains(&lbads).then(|| 1u64 << lbads)
}

/// The block size of LBA format 0 from Identify Namespace of
/// [`NSID_ALL`] (what a namespace created in format 0 gets);
/// [`DEFAULT_BLOCK_BYTES`] where the page is missing or names none.
pub fn format0_block_bytes(common: Option<&[u8]>) -> u64 {
    common
        .and_then(|bytes| page_of(bytes).ok())
        .and_then(|page| lbads_bytes(page[LBAF_AT + 2]))
        .unwrap_or(DEFAULT_BLOCK_BYTES)
}

/// The NSIDs of an Identify list page (CNS 02h, 10h): ascending, ended by
/// the first zero. A list that is not ascending is refused: a controller
/// that sends one is not to be trusted with which namespace is which.
pub fn nsid_list(bytes: &[u8]) -> Result<Vec<u32>, NsidListError> {
    let page = page_of(bytes).map_err(NsidListError::Short)?;
    let mut out: Vec<u32> = Vec::new();
    for word in page.chunks_exact(4) {
        let nsid = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        if nsid == 0 {
            break;
        }
        if nsid == NSID_ALL || out.last().is_some_and(|&last| nsid <= last) {
            return Err(NsidListError::NotAscending { at: out.len(), nsid });
        }
        out.push(nsid);
    }
    Ok(out)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NsidListError {
    #[error(transparent)]
    Short(ShortPage),
    #[error("NSID list entry {at} ({nsid:#x}) is not above the one before it")]
    NotAscending { at: usize, nsid: u32 },
}

/// The Namespace Management create page: NSZE = NCAP = the blocks of
/// `block_bytes` that hold `bytes` (at least one), LBA format 0, NMIC 0
/// (private to the subsystem's controllers, never shared).
pub fn create_namespace_page(bytes: u64, block_bytes: u64) -> Box<[u8; PAGE_BYTES]> {
    assert!(block_bytes.is_power_of_two() && (512..=65536).contains(&block_bytes), "block size {block_bytes}");
    let blocks = bytes.max(1).div_ceil(block_bytes);
    // Format 0 is named by FLBAS 0; its LBADS is the controller's, so none
    // is written (`block_bytes: None`).
    NamespaceInfo { size_blocks: blocks, block_bytes: None, shared: false, nguid: [0; 16], eui64: [0; 8] }.page()
}

/// The Namespace Attachment page: a Controller List of one, this
/// controller (count, then ids, 16 bits each).
pub fn controller_list_page(controller_id: u16) -> Box<[u8; PAGE_BYTES]> {
    let mut page = Box::new([0u8; PAGE_BYTES]);
    page[0..2].copy_from_slice(&1u16.to_le_bytes());
    page[2..4].copy_from_slice(&controller_id.to_le_bytes());
    page
}

/// The pages a controller answers Identify with, built from what sluice
/// reads of them: the inverse of the parsers above. The SPDK driver's test
/// double answers with these, and the round-trip tests below hold the two
/// directions to one layout.
impl ControllerInfo {
    pub fn page(&self) -> Box<[u8; PAGE_BYTES]> {
        let mut page = Box::new([0u8; PAGE_BYTES]);
        page[CNTLID_AT..CNTLID_AT + 2].copy_from_slice(&self.controller_id.to_le_bytes());
        let oacs = if self.manages_namespaces { OACS_NS_MANAGEMENT } else { 0 };
        page[OACS_AT..OACS_AT + 2].copy_from_slice(&oacs.to_le_bytes());
        page
    }
}

impl NamespaceInfo {
    /// The page in LBA format 0 (LBADS 0, no valid size, where
    /// `block_bytes` is `None` or not a power of two NVMe allows).
    pub fn page(&self) -> Box<[u8; PAGE_BYTES]> {
        let mut page = Box::new([0u8; PAGE_BYTES]);
        page[NSZE_AT..NSZE_AT + 8].copy_from_slice(&self.size_blocks.to_le_bytes());
        page[NCAP_AT..NCAP_AT + 8].copy_from_slice(&self.size_blocks.to_le_bytes());
        page[NMIC_AT] = u8::from(self.shared);
        page[NGUID_AT..NGUID_AT + 16].copy_from_slice(&self.nguid);
        page[EUI64_AT..EUI64_AT + 8].copy_from_slice(&self.eui64);
        let lbads = self.block_bytes.filter(|b| b.is_power_of_two()).map_or(0, |b| b.trailing_zeros() as u8);
        page[LBAF_AT + 2] = if lbads_bytes(lbads).is_some() { lbads } else { 0 };
        page
    }
}

/// An Identify NSID list page (CNS 02h, 10h) of `nsids`, at most
/// [`NSID_LIST_MAX`] of them, zero after the last.
pub fn nsid_list_page(nsids: &[u32]) -> Box<[u8; PAGE_BYTES]> {
    assert!(nsids.len() <= NSID_LIST_MAX, "{} NSIDs do not fit a list page", nsids.len());
    let mut page = Box::new([0u8; PAGE_BYTES]);
    for (word, nsid) in page.chunks_exact_mut(4).zip(nsids) {
        word.copy_from_slice(&nsid.to_le_bytes());
    }
    page
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A namespace page with `blocks` of format `format`, whose LBADS is
    /// `lbads` (format 0 says 512 B where it is another).
    fn namespace_page(blocks: u64, format: u8, lbads: u8) -> Box<[u8; PAGE_BYTES]> {
        let mut page = Box::new([0u8; PAGE_BYTES]);
        page[0..8].copy_from_slice(&blocks.to_le_bytes());
        page[26] = format;
        page[128 + 2] = 9;
        page[128 + 4 * usize::from(format & 0x0f) + 2] = lbads;
        page
    }

    /// 16384 blocks of format 1 (4 KiB: LBADS 12) is 64 MiB; a page that
    /// names no valid block size gives 0, not a wrong number.
    #[test]
    fn namespace_size_from_identify() {
        let info = NamespaceInfo::parse(&namespace_page(16384, 1, 12)[..]).expect("page");
        assert_eq!((info.block_bytes, info.capacity_bytes()), (Some(4096), 64 << 20));
        let info = NamespaceInfo::parse(&namespace_page(16384, 0, 9)[..]).expect("page");
        assert_eq!(info.capacity_bytes(), 16384 * 512);
        let info = NamespaceInfo::parse(&namespace_page(16384, 0, 0)[..]).expect("page");
        assert_eq!((info.block_bytes, info.capacity_bytes()), (None, 0));
    }

    /// NMIC and the identifiers sit where NVMe 1.4 figure 245 puts them.
    #[test]
    fn sharing_and_identity_from_identify() {
        let mut page = Box::new([0u8; PAGE_BYTES]);
        let info = NamespaceInfo::parse(&page[..]).expect("page");
        assert!(!info.shared);
        assert_eq!(info.identity(), format!("{}-{}", "00".repeat(16), "00".repeat(8)));
        assert!(identity_is_blank(&info.identity()));
        page[30] = 1;
        page[104] = 0xab;
        page[127] = 0x01;
        let info = NamespaceInfo::parse(&page[..]).expect("page");
        assert!(info.shared);
        assert_eq!(info.identity(), format!("ab{}-{}01", "00".repeat(15), "00".repeat(7)));
        assert!(!identity_is_blank(&info.identity()));
    }

    /// CNTLID and OACS bit 3 where figure 247 puts them.
    #[test]
    fn controller_id_and_namespace_management_from_identify() {
        let mut page = Box::new([0u8; PAGE_BYTES]);
        page[78..80].copy_from_slice(&0x1234u16.to_le_bytes());
        page[256] = 1 << 3;
        let info = ControllerInfo::parse(&page[..]).expect("page");
        assert_eq!(info, ControllerInfo { controller_id: 0x1234, manages_namespaces: true });
        page[256] = !(1 << 3);
        assert!(!ControllerInfo::parse(&page[..]).expect("page").manages_namespaces);
    }

    #[test]
    fn format0_block_size_defaults_to_512() {
        assert_eq!(format0_block_bytes(None), 512);
        assert_eq!(format0_block_bytes(Some(&[0u8; 100])), 512);
        assert_eq!(format0_block_bytes(Some(&namespace_page(1, 0, 12)[..])), 4096);
        assert_eq!(format0_block_bytes(Some(&namespace_page(1, 0, 17)[..])), 512);
    }

    #[test]
    fn short_pages_are_refused_not_indexed() {
        assert_eq!(NamespaceInfo::parse(&[0u8; 4095]), Err(ShortPage { len_bytes: 4095 }));
        assert_eq!(ControllerInfo::parse(&[]), Err(ShortPage { len_bytes: 0 }));
        assert_eq!(nsid_list(&[1, 0, 0]), Err(NsidListError::Short(ShortPage { len_bytes: 3 })));
    }

    #[test]
    fn nsid_lists_end_at_zero_and_must_ascend() {
        let mut page = [0u8; PAGE_BYTES];
        for (i, nsid) in [1u32, 2, 7].iter().enumerate() {
            page[i * 4..i * 4 + 4].copy_from_slice(&nsid.to_le_bytes());
        }
        page[16..20].copy_from_slice(&9u32.to_le_bytes()); // after the zero: not listed
        assert_eq!(nsid_list(&page), Ok(vec![1, 2, 7]));
        page[12..16].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(nsid_list(&page), Err(NsidListError::NotAscending { at: 3, nsid: 7 }));
        page[0..4].copy_from_slice(&NSID_ALL.to_le_bytes());
        assert_eq!(nsid_list(&page), Err(NsidListError::NotAscending { at: 0, nsid: NSID_ALL }));
    }

    #[test]
    fn admin_pages_hold_what_the_controller_reads() {
        let page = controller_list_page(0x0102);
        assert_eq!(&page[..4], &[1, 0, 2, 1]);
        assert!(page[4..].iter().all(|&b| b == 0));
        let page = create_namespace_page(4097, 4096);
        assert_eq!(u64::from_le_bytes(page[0..8].try_into().expect("8")), 2);
        assert_eq!(page[0..8], page[8..16]);
        assert!(page[16..].iter().all(|&b| b == 0), "format 0, not shared");
    }

    proptest! {
        /// Whatever a device sends, parsing returns, never panics.
        #[test]
        fn any_bytes_parse_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let long = bytes.len() >= PAGE_BYTES;
            prop_assert_eq!(NamespaceInfo::parse(&bytes).is_ok(), long);
            prop_assert_eq!(ControllerInfo::parse(&bytes).is_ok(), long);
            let _ = nsid_list(&bytes);
            let _ = format0_block_bytes(Some(&bytes));
        }

        /// A page built for a size reads back as that size rounded up to
        /// whole blocks, the same whichever format slot carries it.
        #[test]
        fn capacity_round_trips(bytes in 0u64..(1 << 50), lbads in 9u8..=16, format in 0u8..16) {
            let block = 1u64 << lbads;
            let created = create_namespace_page(bytes, block);
            let blocks = u64::from_le_bytes(created[0..8].try_into().expect("8"));
            let read = NamespaceInfo::parse(&namespace_page(blocks, format, lbads)[..]).expect("page");
            prop_assert!(read.capacity_bytes() >= bytes.max(1));
            prop_assert!(read.capacity_bytes() - bytes.max(1) < block);
        }

        /// What a built page says reads back as it was said.
        #[test]
        fn identify_pages_round_trip(
            controller_id in any::<u16>(),
            manages_namespaces in any::<bool>(),
            size_blocks in any::<u64>(),
            lbads in 9u8..=16,
            shared in any::<bool>(),
            nguid in any::<[u8; 16]>(),
            eui64 in any::<[u8; 8]>(),
        ) {
            let controller = ControllerInfo { controller_id, manages_namespaces };
            prop_assert_eq!(ControllerInfo::parse(&controller.page()[..]), Ok(controller));
            let namespace = NamespaceInfo { size_blocks, block_bytes: Some(1 << lbads), shared, nguid, eui64 };
            prop_assert_eq!(NamespaceInfo::parse(&namespace.page()[..]), Ok(namespace));
            prop_assert_eq!(format0_block_bytes(Some(&namespace.page()[..])), 1 << lbads);
        }

        /// An ascending list reads back whole.
        #[test]
        fn ascending_lists_round_trip(nsids in proptest::collection::btree_set(1u32..NSID_ALL, 0..NSID_LIST_MAX)) {
            let nsids: Vec<u32> = nsids.into_iter().collect();
            prop_assert_eq!(nsid_list(&nsid_list_page(&nsids)[..]), Ok(nsids));
        }
    }
}
