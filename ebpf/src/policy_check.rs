//! What a steering policy object may be, checked before any of it reaches
//! the kernel.
//!
//! A policy is a uprobe program, and a uprobe program runs as a tracing
//! program inside a root process: with the wrong helpers it could write
//! the node's memory (`bpf_probe_write_user`), read the kernel's
//! (`bpf_probe_read_kernel`) or signal processes (`bpf_send_signal`). The
//! verifier allows all of that to a privileged loader, so the node checks
//! first, from the ELF alone:
//!
//! - exactly one program, `lane_policy`, of the (non-sleepable) uprobe
//!   type; the node attaches it to its own probe symbol, whatever the
//!   object's section names;
//! - its maps are the shared maps of `sluice_steer.h`, declared exactly as
//!   there, plus at most the policy's own per-flow state array
//!   (`flow_states`); none pinned by name, no global data sections;
//! - every call instruction in every function calls a helper a policy
//!   needs ([`HELPERS_ALLOWED`]): no kfuncs, no `__ksym` references.
//!
//! Refusals name what was found, so an operator can fix the object.

use aya_obj::maps::PinningType;
use aya_obj::{EbpfSectionKind, ProgramSection};
use sluice_dataplane::steer::FLOWS_MAX;

use crate::steer::POLICY_PROGRAM;

/// Helpers a policy may call: map lookup, update and delete, the clocks,
/// and reading the probe's argument struct from the node's memory.
pub const HELPERS_ALLOWED: &[(i32, &str)] = &[
    (1, "bpf_map_lookup_elem"),
    (2, "bpf_map_update_elem"),
    (3, "bpf_map_delete_elem"),
    (5, "bpf_ktime_get_ns"),
    (112, "bpf_probe_read_user"),
    (125, "bpf_ktime_get_boot_ns"),
];

/// Names of helpers a refusal is likely to meet, for its message.
const HELPER_NAMES: &[(i32, &str)] = &[
    (4, "bpf_probe_read"),
    (6, "bpf_trace_printk"),
    (12, "bpf_tail_call"),
    (14, "bpf_get_current_pid_tgid"),
    (35, "bpf_get_current_task"),
    (36, "bpf_probe_write_user"),
    (45, "bpf_probe_read_str"),
    (58, "bpf_override_return"),
    (109, "bpf_send_signal"),
    (113, "bpf_probe_read_kernel"),
    (114, "bpf_probe_read_user_str"),
    (115, "bpf_probe_read_kernel_str"),
    (117, "bpf_send_signal_thread"),
    (130, "bpf_ringbuf_output"),
];

const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
const BPF_F_MMAPABLE: u32 = 1 << 10;
/// `SLUICE_PEERS_MAX` in `sluice_steer.h`.
const PEERS_MAX: u32 = 65_536;
/// Largest per-flow state a policy keeps in `flow_states`.
pub const FLOW_STATE_BYTES_MAX: u32 = 256;

/// `BPF_JMP | BPF_CALL`.
const OP_CALL: u8 = 0x85;
/// `BPF_LD | BPF_DW | BPF_IMM`: the two-slot load of a 64-bit constant.
const OP_LD_IMM64: u8 = 0x18;
const PSEUDO_CALL: u8 = 1;
const PSEUDO_KFUNC_CALL: u8 = 2;
const PSEUDO_BTF_ID: u8 = 3;

/// A map as the policy must declare it.
struct MapRule {
    name: &'static str,
    map_type: u32,
    key_size: u32,
    /// Exact value size, or the largest allowed when `value_size_exact`
    /// is false.
    value_size: u32,
    value_size_exact: bool,
    max_entries: u32,
    flags: u32,
    required: bool,
}

const MAP_RULES: &[MapRule] = &[
    MapRule {
        name: "lane_decisions",
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: 8,
        value_size_exact: true,
        max_entries: FLOWS_MAX,
        flags: BPF_F_MMAPABLE,
        required: true,
    },
    MapRule {
        name: "peer_lanes",
        map_type: BPF_MAP_TYPE_LRU_HASH,
        key_size: 16,
        value_size: 4,
        value_size_exact: true,
        max_entries: PEERS_MAX,
        flags: 0,
        required: true,
    },
    MapRule {
        name: "flow_states",
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: FLOW_STATE_BYTES_MAX,
        value_size_exact: false,
        max_entries: FLOWS_MAX,
        flags: 0,
        required: false,
    },
];

/// Why a policy object was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyRefusal {
    #[error("not a BPF object: {0}")]
    Unparsable(String),
    #[error("it has {0} programs; a policy has exactly one, the uprobe `lane_policy`")]
    ProgramCount(usize),
    #[error("its program is {found:?}; a policy's is the uprobe `lane_policy`")]
    ProgramName { found: String },
    #[error("program `lane_policy` is {section}; a policy is a (non-sleepable) uprobe")]
    ProgramType { section: String },
    #[error("map `{0}` is not one a policy may declare (only lane_decisions, peer_lanes and flow_states)")]
    ExtraMap(String),
    #[error("map `{0}` is pinned by name; a policy's maps are the node's, never pinned")]
    PinnedMap(String),
    #[error("map `{name}` is declared {found}; sluice_steer.h declares it {expected}")]
    MapShape { name: String, found: String, expected: String },
    #[error("the object lacks map `{0}` (include sluice_steer.h)")]
    MissingMap(&'static str),
    #[error("global data ({0}) is not allowed in a policy")]
    GlobalData(&'static str),
    #[error("function `{function}` calls helper {helper}, which a policy may not use (allowed: {allowed})")]
    Helper { function: String, helper: String, allowed: String },
    #[error("function `{0}` calls a kernel function (kfunc); a policy may not")]
    Kfunc(String),
    #[error("function `{0}` references a kernel symbol (__ksym); a policy may not")]
    Ksym(String),
}

/// What the check saw of an accepted object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyReport {
    pub maps: Vec<String>,
    pub helpers: Vec<&'static str>,
}

fn helper_words(id: i32) -> String {
    match HELPER_NAMES.iter().chain(HELPERS_ALLOWED).find(|(n, _)| *n == id) {
        Some((_, name)) => format!("#{id} ({name})"),
        None => format!("#{id}"),
    }
}

/// Checks a policy object; see the module documentation for the rules.
pub fn check(object: &[u8]) -> Result<PolicyReport, PolicyRefusal> {
    let parsed = aya_obj::Object::parse(object).map_err(|e| PolicyRefusal::Unparsable(e.to_string()))?;
    check_program(&parsed)?;
    let maps = check_maps(&parsed)?;
    let helpers = check_calls(&parsed)?;
    Ok(PolicyReport { maps, helpers })
}

fn check_program(parsed: &aya_obj::Object) -> Result<(), PolicyRefusal> {
    if parsed.programs.len() != 1 {
        return Err(PolicyRefusal::ProgramCount(parsed.programs.len()));
    }
    let (name, program) = parsed.programs.iter().next().ok_or(PolicyRefusal::ProgramCount(0))?;
    if name != POLICY_PROGRAM {
        return Err(PolicyRefusal::ProgramName { found: name.clone() });
    }
    match program.section {
        ProgramSection::UProbe { sleepable: false } => Ok(()),
        ref other => Err(PolicyRefusal::ProgramType { section: format!("{other:?}") }),
    }
}

fn check_maps(parsed: &aya_obj::Object) -> Result<Vec<String>, PolicyRefusal> {
    let mut names: Vec<String> = Vec::with_capacity(parsed.maps.len());
    for (name, map) in &parsed.maps {
        match map.section_kind() {
            EbpfSectionKind::Data => return Err(PolicyRefusal::GlobalData(".data")),
            EbpfSectionKind::Rodata => return Err(PolicyRefusal::GlobalData(".rodata")),
            EbpfSectionKind::Bss => return Err(PolicyRefusal::GlobalData(".bss")),
            _ => {}
        }
        let rule = MAP_RULES.iter().find(|r| r.name == name).ok_or_else(|| PolicyRefusal::ExtraMap(name.clone()))?;
        if map.pinning() != PinningType::None {
            return Err(PolicyRefusal::PinnedMap(name.clone()));
        }
        let value_ok = if rule.value_size_exact {
            map.value_size() == rule.value_size
        } else {
            map.value_size() <= rule.value_size
        };
        let shape_ok = map.map_type() == rule.map_type
            && map.key_size() == rule.key_size
            && value_ok
            && map.max_entries() == rule.max_entries
            && map.map_flags() == rule.flags;
        if !shape_ok {
            return Err(PolicyRefusal::MapShape {
                name: name.clone(),
                found: format!(
                    "type {} key {} value {} entries {} flags {:#x}",
                    map.map_type(),
                    map.key_size(),
                    map.value_size(),
                    map.max_entries(),
                    map.map_flags()
                ),
                expected: format!(
                    "type {} key {} value {}{} entries {} flags {:#x}",
                    rule.map_type,
                    rule.key_size,
                    if rule.value_size_exact { "" } else { "<= " },
                    rule.value_size,
                    rule.max_entries,
                    rule.flags
                ),
            });
        }
        names.push(name.clone());
    }
    for rule in MAP_RULES.iter().filter(|r| r.required) {
        if !parsed.maps.contains_key(rule.name) {
            return Err(PolicyRefusal::MissingMap(rule.name));
        }
    }
    names.sort();
    Ok(names)
}

fn check_calls(parsed: &aya_obj::Object) -> Result<Vec<&'static str>, PolicyRefusal> {
    let mut used: Vec<&'static str> = Vec::new();
    for function in parsed.functions.values() {
        for insn in &function.instructions {
            if insn.code == OP_LD_IMM64 && insn.src_reg() == PSEUDO_BTF_ID {
                return Err(PolicyRefusal::Ksym(function.name.clone()));
            }
            if insn.code != OP_CALL {
                continue;
            }
            match insn.src_reg() {
                PSEUDO_CALL => continue,
                PSEUDO_KFUNC_CALL => return Err(PolicyRefusal::Kfunc(function.name.clone())),
                _ => {}
            }
            match HELPERS_ALLOWED.iter().find(|(id, _)| *id == insn.imm) {
                Some((_, name)) => {
                    if !used.contains(name) {
                        used.push(name);
                    }
                }
                None => {
                    return Err(PolicyRefusal::Helper {
                        function: function.name.clone(),
                        helper: helper_words(insn.imm),
                        allowed: HELPERS_ALLOWED.iter().map(|(_, n)| *n).collect::<Vec<_>>().join(", "),
                    })
                }
            }
        }
    }
    used.sort_unstable();
    Ok(used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steer::{ALL_BULK_POLICY_OBJECT, DEFAULT_POLICY_OBJECT};

    /// The policies sluice ships pass, and say what they use.
    #[test]
    fn shipped_policies_pass() {
        let report = check(DEFAULT_POLICY_OBJECT).expect("default policy");
        assert_eq!(report.maps, ["flow_states", "lane_decisions", "peer_lanes"]);
        assert!(report.helpers.contains(&"bpf_probe_read_user"));
        let bulk = check(ALL_BULK_POLICY_OBJECT).expect("all-bulk policy");
        assert_eq!(bulk.maps, ["lane_decisions", "peer_lanes"]);
    }

    /// Objects that are not policies at all are refused, not loaded.
    #[test]
    fn other_objects_are_refused() {
        assert!(matches!(check(b"not an elf"), Err(PolicyRefusal::Unparsable(_))));
        // The node's own steering object: an sk_reuseport program.
        assert!(check(crate::steer::STEER_OBJECT).is_err());
        assert!(check(crate::TRACE_OBJECT).is_err());
    }
}
