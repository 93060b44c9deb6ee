//! eBPF steering: the latency-lane workers, the policy the control API
//! swaps, and the trace `sluicectl top` shows.

use sluice_proto::api::{FlowDecisions, PolicyInfo, PolicyReport, Unloaded, WorkerConnections};

use super::*;

/// The node's steering: the BPF side, and the connections each worker
/// socket took.
pub(super) struct NodeSteering {
    steering: std::sync::Mutex<sluice_ebpf::steer::Steering>,
    plane: Arc<DataPlane>,
    pub(super) latency_connections: Arc<std::sync::atomic::AtomicU64>,
    pub(super) bulk_connections: Arc<std::sync::atomic::AtomicU64>,
}

/// Creates the steering maps, points the data plane at the decision
/// array, and attaches the default policy.
pub(super) async fn start_steering(plane: &Arc<DataPlane>) -> Result<Arc<NodeSteering>, String> {
    use sluice_ebpf::steer::{Steering, DEFAULT_POLICY_OBJECT};
    probes_must_be_distinct()?;
    let exe = std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
    let mut steering = Steering::start(&exe, sluice_ebpf::Scope::ThisProcess).map_err(|e| {
        if e.is_permission() {
            format!("{e} (steering needs root, or CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN)")
        } else {
            e.to_string()
        }
    })?;
    plane.steer_with(steering.decisions()).await.map_err(|e| e.to_string())?;
    steering.load_policy("default", DEFAULT_POLICY_OBJECT).map_err(|e| format!("default policy: {e}"))?;
    tracing::info!("eBPF lane steering on, default policy attached");
    Ok(Arc::new(NodeSteering {
        steering: std::sync::Mutex::new(steering),
        plane: Arc::clone(plane),
        latency_connections: Arc::default(),
        bulk_connections: Arc::default(),
    }))
}

impl NodeSteering {
    pub(super) fn attach_listeners(
        &self,
        latency: &std::net::TcpListener,
        bulk: &std::net::TcpListener,
    ) -> Result<(), String> {
        let mut steering = self.steering.lock().map_err(|_| "steering state poisoned".to_string())?;
        steering.steer_listeners(latency, bulk).map_err(|e| format!("sk_reuseport: {e}"))
    }
}

impl sluice_control::PolicyControl for NodeSteering {
    fn show(&self) -> PolicyReport {
        let Ok(steering) = self.steering.lock() else {
            return PolicyReport::unavailable("steering state poisoned");
        };
        let (none, latency, bulk) = steering.decision_counts();
        let ordering = std::sync::atomic::Ordering::Relaxed;
        PolicyReport {
            available: true,
            reason: None,
            policy: steering.policy(),
            swaps: steering.swaps(),
            flows: FlowDecisions {
                open: self.plane.flows_open() as u64,
                undecided: u64::from(none),
                latency: u64::from(latency),
                bulk: u64::from(bulk),
            },
            connections: WorkerConnections {
                latency_workers: self.latency_connections.load(ordering),
                bulk_workers: self.bulk_connections.load(ordering),
            },
        }
    }

    fn load(&self, name: &str, object: &[u8]) -> Result<PolicyInfo, String> {
        let mut steering = self.steering.lock().map_err(|_| "steering state poisoned".to_string())?;
        let info = steering.load_policy(name, object).map_err(|e| e.to_string())?;
        tracing::info!(policy = %info.name, hash = %info.object_hash, "steering policy swapped");
        Ok(info)
    }

    fn unload(&self) -> Result<Unloaded, String> {
        let mut steering = self.steering.lock().map_err(|_| "steering state poisoned".to_string())?;
        let old = steering.unload_policy().map_err(|e| e.to_string())?;
        tracing::info!("steering policy unloaded; lanes by batch size");
        Ok(Unloaded { unloaded: old })
    }
}

/// A uprobe on a probe function that shares its address with another
/// would fire for both: refuse rather than count batches twice.
pub(super) fn probes_must_be_distinct() -> Result<(), String> {
    if sluice_dataplane::probe::probes_are_distinct() {
        Ok(())
    } else {
        Err("this build's probe functions share an address (folded by the linker); uprobes would miscount".into())
    }
}

/// Slow batches kept for `GET /v1/trace`.
const SLOW_BATCHES_KEPT: usize = 64;

/// Attaches the trace program to this process's probe functions and serves
/// its maps through the control plane.
pub(super) fn attach_tracer(control: &Arc<ControlPlane>, kernel_trace: Result<(), &str>) -> Result<(), String> {
    use sluice_ebpf::{Scope, Tracer};
    use sluice_proto::api::{KernelTrace, SlowBatch, TraceEntry, TraceSnapshot};
    use sluice_proto::Lane;
    probes_must_be_distinct()?;
    let exe = std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
    // The kernel's side: the io_uring backend's requests, from tracepoints.
    let kernel = kernel_trace.map_err(str::to_string).and_then(|()| {
        use sluice_ebpf::uring::{UringTracer, DEFAULT_SAMPLE_SHIFT};
        UringTracer::attach(std::process::id(), DEFAULT_SAMPLE_SHIFT).map_err(|err| {
            tracing::warn!("io_uring tracepoints unavailable: {err}");
            err.to_string()
        })
    });
    let tracer = Tracer::attach(&exe, Scope::ThisProcess, std::time::Duration::from_millis(10)).map_err(|e| {
        if e.is_permission() {
            format!("{e} (loading BPF needs root, or CAP_BPF and CAP_PERFMON)")
        } else {
            e.to_string()
        }
    })?;
    let state = std::sync::Mutex::new((tracer, std::collections::VecDeque::new()));
    let catalog = Arc::downgrade(control);
    control.set_trace_source(Arc::new(move || {
        let Ok(mut state) = state.lock() else {
            return TraceSnapshot::unavailable("trace state poisoned");
        };
        let (tracer, slow) = &mut *state;
        if let Ok(batches) = tracer.slow_batches() {
            for batch in batches {
                if slow.len() == SLOW_BATCHES_KEPT {
                    slow.pop_front();
                }
                slow.push_back(batch);
            }
        }
        let names: std::collections::HashMap<u64, String> = catalog
            .upgrade()
            .and_then(|c| c.list().ok())
            .map(|records| records.into_iter().map(|r| (r.id, r.name)).collect())
            .unwrap_or_default();
        let lane = |l: u32| if l == 0 { Lane::Latency } else { Lane::Bulk };
        let entries = match tracer.snapshot() {
            Ok(entries) => entries
                .iter()
                .map(|(key, stats)| TraceEntry {
                    dataset_id: key.dataset_id,
                    dataset: names.get(&key.dataset_id).cloned(),
                    lane: lane(key.lane),
                    batches: stats.batches,
                    ranges: stats.ranges,
                    bytes: stats.bytes,
                    failed_ranges: stats.failed_ranges,
                    size_log2: stats.size_log2.to_vec(),
                    latency_log2_us: stats.latency_log2_us.to_vec(),
                })
                .collect(),
            Err(err) => return TraceSnapshot::unavailable(err.to_string()),
        };
        let slow_batches = slow
            .iter()
            .map(|b| SlowBatch {
                dataset_id: b.dataset_id,
                client_id: u64::from(b.client_id),
                lane: lane(u32::from(b.lane)),
                ranges: u64::from(b.ranges),
                bytes: b.bytes,
                latency_us: b.complete_ns.saturating_sub(b.submit_ns) / 1000,
            })
            .collect();
        let kernel = match kernel.as_ref().map(|t| (t.snapshot(), t.sampled_one_in())) {
            Ok((Ok(stats), sampled_one_in)) => KernelTrace {
                available: true,
                reason: None,
                source: Some("io_uring:io_uring_submit_req -> io_uring:io_uring_complete".into()),
                requests: stats.requests,
                sampled_one_in,
                errors: stats.errors,
                latency_log2_us: stats.latency_log2_us.to_vec(),
            },
            Ok((Err(err), _)) => KernelTrace::unavailable(err.to_string()),
            Err(reason) => KernelTrace::unavailable(reason.clone()),
        };
        TraceSnapshot { available: true, reason: None, entries, slow_batches, kernel }
    }));
    Ok(())
}
