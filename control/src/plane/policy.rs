//! The steering policy and the eBPF trace as the control API shows and
//! swaps them (the BPF side is the node binary's, behind [`PolicyControl`]).

use std::sync::{Arc, RwLock};

use sluice_proto::api::{PolicyInfo, PolicyReport, TraceSnapshot, Unloaded};

use super::{ControlError, ControlPlane};

/// Produces the eBPF trace snapshot `GET /v1/trace` serves.
pub type TraceSource = Arc<dyn Fn() -> TraceSnapshot + Send + Sync>;

/// The node's lane-steering policy as the control API manages it; the BPF
/// side lives with the node binary, which sets this at start with `--ebpf`.
pub trait PolicyControl: Send + Sync {
    /// The policy attached now, decision counts, swaps so far.
    fn show(&self) -> PolicyReport;
    /// Loads `object` (a BPF ELF object) as the policy, replacing the one
    /// attached; on error the old one stays.
    fn load(&self, name: &str, object: &[u8]) -> Result<PolicyInfo, String>;
    /// Detaches the policy; the size threshold decides again.
    fn unload(&self) -> Result<Unloaded, String>;
}

/// Largest policy object `PUT /v1/policy` takes.
pub const POLICY_OBJECT_BYTES_MAX: usize = 4 << 20;

/// Whether policies may be loaded through the API, and which.
#[derive(Clone, Debug, Default)]
pub struct PolicyRules {
    /// `policy_load = true`: operators may swap the policy at run time.
    pub load_enabled: bool,
    /// `policy_allowlist`: the sha256 of every object that may be loaded;
    /// any object passing the checks when `None`.
    pub allowlist: Option<Vec<[u8; 32]>>,
}

const STEERING_OFF: &str = "lane steering is off: start sluiced with --ebpf (as root)";

/// What this module owns of the plane: the trace source and the policy
/// control the node binary set, and the rules for loading policies.
#[derive(Default)]
pub(super) struct Steering {
    trace: RwLock<Option<TraceSource>>,
    control: RwLock<Option<Arc<dyn PolicyControl>>>,
    rules: RwLock<PolicyRules>,
}

impl ControlPlane {
    /// Sets where trace snapshots come from (the node's eBPF tracer).
    pub fn set_trace_source(&self, source: TraceSource) {
        if let Ok(mut trace) = self.steering.trace.write() {
            *trace = Some(source);
        }
    }

    /// Sets what manages the steering policy (the node's eBPF steering).
    pub fn set_policy_control(&self, control: Arc<dyn PolicyControl>) {
        if let Ok(mut policy) = self.steering.control.write() {
            *policy = Some(control);
        }
    }

    fn policy_control(&self) -> Result<Arc<dyn PolicyControl>, ControlError> {
        self.steering
            .control
            .read()
            .ok()
            .and_then(|p| p.clone())
            .ok_or_else(|| ControlError::Steering(STEERING_OFF.into()))
    }

    /// The steering policy now, or why there is none.
    pub fn policy(&self) -> PolicyReport {
        match self.policy_control() {
            Ok(control) => control.show(),
            Err(err) => PolicyReport::unavailable(err.to_string()),
        }
    }

    /// Whether operators may load policies at run time, and which objects.
    pub fn set_policy_rules(&self, rules: PolicyRules) {
        if let Ok(mut current) = self.steering.rules.write() {
            *current = rules;
        }
    }

    /// Swaps in the policy in `object`: only where the config allows
    /// loading, only an object on the allowlist when there is one; the
    /// steering side then checks what the object would do in the kernel.
    pub fn load_policy(&self, name: &str, object: &[u8]) -> Result<PolicyInfo, ControlError> {
        let rules = self.steering.rules.read().map(|r| r.clone()).unwrap_or_default();
        if !rules.load_enabled {
            return Err(ControlError::PolicyLoadOff);
        }
        if object.is_empty() || object.len() > POLICY_OBJECT_BYTES_MAX {
            return Err(ControlError::BadPolicy(format!(
                "a policy object is 1 to {POLICY_OBJECT_BYTES_MAX} bytes; got {}",
                object.len()
            )));
        }
        if let Some(allowed) = &rules.allowlist {
            use sha2::Digest;
            let digest: [u8; 32] = sha2::Sha256::digest(object).into();
            if !allowed.contains(&digest) {
                return Err(ControlError::BadPolicy(format!(
                    "object sha256:{} is not on this node's policy_allowlist",
                    crate::hex::encode(&digest)
                )));
            }
        }
        let loaded = self.policy_control()?.load(name, object).map_err(ControlError::BadPolicy)?;
        tracing::warn!(policy = name, "steering policy loaded through the control API");
        Ok(loaded)
    }

    /// Detaches the steering policy.
    pub fn unload_policy(&self) -> Result<Unloaded, ControlError> {
        self.policy_control()?.unload().map_err(ControlError::Steering)
    }

    /// The current trace snapshot, or why there is none.
    pub fn trace_snapshot(&self) -> TraceSnapshot {
        match self.steering.trace.read().ok().and_then(|t| t.clone()) {
            Some(source) => source(),
            None => TraceSnapshot::unavailable("eBPF tracing is off: start sluiced with --ebpf (as root)"),
        }
    }
}
