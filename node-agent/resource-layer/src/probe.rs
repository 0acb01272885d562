//! A read-only report of what a backend sees: discovery, topology, MIG mode and instances,
//! metrics and health. It only lists and reads; it never creates, destroys or changes MIG mode.

use crate::backend::Backend;
use crate::error::LayerError;
use runtimekit_proto::resource::v1alpha1 as pb;
use std::fmt::Write as _;

fn opt<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn spec_text(instance: &pb::Instance) -> String {
    let spec = instance.spec.as_ref();
    match spec.and_then(|s| s.kind.as_ref()) {
        Some(pb::instance_spec::Kind::Tdm(t)) => {
            format!("TDM core {}% memory {} MiB", t.core_percent, t.memory_mib)
        }
        Some(pb::instance_spec::Kind::Mig(m)) => {
            let ids = instance.mig.as_ref();
            format!(
                "MIG {} at {} (GPU instance {}, compute instance {}, {})",
                m.profile,
                m.placement_start,
                opt(ids.map(|i| i.gpu_instance_id)),
                opt(ids.map(|i| i.compute_instance_id)),
                ids.map_or("-", |i| i.device_uuid.as_str())
            )
        }
        None => "?".into(),
    }
}

fn fault_text(fault: &pb::Fault) -> String {
    format!(
        "{} [{}, {}, watch {}]",
        fault.reason,
        fault.kind().as_str_name(),
        fault.severity().as_str_name(),
        fault.health_watch
    )
}

/// The report, as text. `metrics` says whether to read metrics (with processes) too.
pub fn report(backend: &dyn Backend, metrics: bool) -> Result<String, LayerError> {
    let mut out = String::new();
    let info = backend.info();
    let _ = writeln!(
        out,
        "backend: {} (resource layer {}), driver {}, node {}, {} card(s){}",
        info.backend().as_str_name(),
        info.version,
        if info.driver_version.is_empty() {
            "-"
        } else {
            &info.driver_version
        },
        if info.node_name.is_empty() {
            "-"
        } else {
            &info.node_name
        },
        info.device_count,
        if info.profile.is_empty() {
            String::new()
        } else {
            format!(", profile {}", info.profile)
        }
    );
    if !info.process_liveness_unavailable.is_empty() {
        let _ = writeln!(
            out,
            "memory held by dead processes: not watched ({})",
            info.process_liveness_unavailable
        );
    }
    let listing = backend.list_devices(&[])?;
    for e in &listing.errors {
        let _ = writeln!(
            out,
            "card {}: not read in full ({}: {})",
            e.device_index, e.reason, e.message
        );
    }
    for d in &listing.devices {
        let _ = writeln!(out);
        if d.state() == pb::DeviceState::Lost {
            let _ = writeln!(out, "card {}: {} LOST", d.index, d.uuid);
        } else if d.state() == pb::DeviceState::Partial && d.model.is_empty() {
            let _ = writeln!(out, "card {}: {} UNREADABLE", d.index, d.uuid);
        } else {
            let _ = writeln!(
                out,
                "card {}: {} {} ({}), {} MiB, PCI {} (device id {:#010x}), serial {}, {}",
                d.index,
                d.vendor().as_str_name(),
                d.model,
                d.uuid,
                d.memory_mib,
                d.pci_bus_id,
                d.pci_device_id,
                if d.serial.is_empty() { "-" } else { &d.serial },
                if d.healthy { "healthy" } else { "UNHEALTHY" }
            );
        }
        if let Some(t) = &d.topology {
            let active: Vec<&pb::Link> = t.links.iter().filter(|l| l.active).collect();
            let to_switch = active
                .iter()
                .filter(|l| l.remote() == pb::LinkRemote::Switch)
                .count();
            let _ = writeln!(
                out,
                "  topology: PCIe switch {}, NUMA {}, socket {}, CPUs {}, group {}, links {} active of {} ({} to a switch)",
                if t.pcie_switch.is_empty() {
                    "-"
                } else {
                    &t.pcie_switch
                },
                opt(t.numa_node),
                opt(t.socket),
                if t.cpu_affinity.is_empty() {
                    "-"
                } else {
                    &t.cpu_affinity
                },
                if t.interconnect_group.is_empty() {
                    "-"
                } else {
                    &t.interconnect_group
                },
                active.len(),
                t.links.len(),
                to_switch
            );
        }
        if let Some(m) = &d.mig {
            if m.capable {
                let profiles: Vec<String> = m
                    .profiles
                    .iter()
                    .map(|p| {
                        format!(
                            "{} ({} MiB, starts {:?}, up to {})",
                            p.name, p.memory_mib, p.starts, p.max_instances
                        )
                    })
                    .collect();
                let _ = writeln!(
                    out,
                    "  MIG: capable, enabled {} (after reset: {}), table {}, profiles: {}",
                    yes(m.enabled),
                    yes(m.pending_enabled),
                    if m.table.is_empty() { "-" } else { &m.table },
                    if profiles.is_empty() {
                        "-".to_string()
                    } else {
                        profiles.join(", ")
                    }
                );
            } else if d.state() != pb::DeviceState::Lost {
                let _ = writeln!(out, "  MIG: not capable");
            }
        }
        if d.instances.is_empty() {
            let _ = writeln!(out, "  instances: none");
        }
        for i in &d.instances {
            let _ = writeln!(
                out,
                "  instance {}: {}",
                if i.key.is_empty() {
                    "(unkeyed)"
                } else {
                    &i.key
                },
                spec_text(i)
            );
        }
        for f in &d.faults {
            let _ = writeln!(out, "  fault: {}", fault_text(f));
        }
    }
    if !listing.paths.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "paths:");
        for p in &listing.paths {
            let _ = writeln!(
                out,
                "  {}-{}: {} {}",
                p.a,
                p.b,
                p.pcie().as_str_name().trim_start_matches("PATH_LEVEL_"),
                if p.links > 0 {
                    format!(
                        "{} {} link(s){}",
                        p.links,
                        p.link_kind().as_str_name().trim_start_matches("LINK_KIND_"),
                        if p.via_switch { " via switch" } else { "" }
                    )
                } else {
                    "no peer link".into()
                }
            );
        }
    }
    let _ = writeln!(out);
    if listing.nics.is_empty() {
        let _ = writeln!(out, "RDMA NICs: none");
    }
    for n in &listing.nics {
        let _ = writeln!(
            out,
            "RDMA NIC {}: PCI {}, PCIe switch {}, NUMA {}, socket {}, netdev {}, {}",
            n.name,
            n.pci_bus_id,
            if n.pcie_switch.is_empty() {
                "-"
            } else {
                &n.pcie_switch
            },
            opt(n.numa_node),
            opt(n.socket),
            if n.netdev.is_empty() { "-" } else { &n.netdev },
            if n.link_layer.is_empty() {
                "-"
            } else {
                &n.link_layer
            }
        );
    }
    if metrics {
        let m = backend.device_metrics(&[], true)?;
        for x in &m.devices {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "metrics card {}: util {}%, mem copy {}%, enc {}%, dec {}%, FB used {} free {} reserved {} MiB",
                x.device_index,
                opt(x.gpu_util_percent),
                opt(x.mem_copy_util_percent),
                opt(x.enc_util_percent),
                opt(x.dec_util_percent),
                opt(x.fb_used_mib),
                opt(x.fb_free_mib),
                opt(x.fb_reserved_mib)
            );
            let _ = writeln!(
                out,
                "  temp {} C (memory {} C), power {} W, energy {} mJ, clocks SM {} MHz memory {} MHz",
                opt(x.gpu_temp_c),
                opt(x.memory_temp_c),
                opt(x.power_usage_w),
                opt(x.total_energy_mj),
                opt(x.sm_clock_mhz),
                opt(x.mem_clock_mhz)
            );
            let _ = writeln!(
                out,
                "  PCIe tx {} rx {} B/s, replays {}; NVLink tx {} rx {} B; violations power {} thermal {} ns",
                opt(x.pcie_tx_bytes_per_s),
                opt(x.pcie_rx_bytes_per_s),
                opt(x.pcie_replay_count),
                opt(x.nvlink_tx_bytes),
                opt(x.nvlink_rx_bytes),
                opt(x.power_violation_ns),
                opt(x.thermal_violation_ns)
            );
            let _ = writeln!(
                out,
                "  ECC SBE vol {} agg {}, DBE vol {} agg {}; retired SBE {} DBE {} pending {}; remapped rows cor {} unc {} pending {} failure {}; XID last {}",
                opt(x.ecc_sbe_volatile),
                opt(x.ecc_sbe_aggregate),
                opt(x.ecc_dbe_volatile),
                opt(x.ecc_dbe_aggregate),
                opt(x.retired_pages_sbe),
                opt(x.retired_pages_dbe),
                opt(x.retired_pages_pending),
                opt(x.remapped_rows_correctable),
                opt(x.remapped_rows_uncorrectable),
                opt(x.row_remap_pending),
                opt(x.row_remap_failure),
                opt(x.xid_last)
            );
            let _ = writeln!(
                out,
                "  NVLink errors CRC flit {} data {} replay {} recovery {}; DCP gr {} sm {} occupancy {} tensor {} dram {}",
                opt(x.nvlink_crc_flit_errors),
                opt(x.nvlink_crc_data_errors),
                opt(x.nvlink_replay_errors),
                opt(x.nvlink_recovery_errors),
                opt(x.gr_engine_active),
                opt(x.sm_active),
                opt(x.sm_occupancy),
                opt(x.pipe_tensor_active),
                opt(x.dram_active)
            );
            for p in &x.processes {
                let _ = writeln!(
                    out,
                    "  process {} {}: {} MiB, SM {}%, GPU instance {}, alive {}",
                    p.pid,
                    if p.name.is_empty() { "-" } else { &p.name },
                    opt(p.used_memory_mib),
                    opt(p.sm_util_percent),
                    opt(p.gpu_instance_id),
                    opt(p.alive)
                );
            }
        }
        for e in &m.errors {
            let _ = writeln!(
                out,
                "metrics card {}: unavailable ({}: {})",
                e.device_index, e.reason, e.message
            );
        }
    }
    let (snapshot, _) = backend.health().subscribe();
    let _ = writeln!(out);
    if snapshot.faults.is_empty() {
        let _ = writeln!(out, "health: no active faults");
    }
    for f in &snapshot.faults {
        if let Some(fault) = &f.fault {
            let _ = writeln!(
                out,
                "health: card {}: {}",
                f.device_index,
                fault_text(fault)
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::FaultInjector;
    use crate::sim::{SimOptions, SimulatedBackend};

    #[test]
    fn report_shows_discovery_topology_mig_metrics_and_health() {
        let backend =
            SimulatedBackend::from_profile("h800-8", SimOptions::default()).expect("profile");
        backend
            .inject(&pb::InjectFaultRequest {
                device_index: 3,
                kind: pb::FaultKind::Xid.into(),
                xid: 79,
                ..Default::default()
            })
            .expect("inject");
        let text = report(&backend, true).expect("report");
        for want in [
            "backend: BACKEND_KIND_SIMULATED",
            "8 card(s), profile h800-8",
            "card 0: VENDOR_NVIDIA NVIDIA H800",
            "links 8 active of 8 (8 to a switch)",
            "MIG: capable, enabled yes",
            "table H800-80GB",
            "0-1: PIX 8 NVLINK link(s) via switch",
            "RDMA NIC mlx5_0",
            "metrics card 7: util",
            "health: card 3: XID 79: GPU has fallen off the bus",
        ] {
            assert!(text.contains(want), "report lacks {want:?}:\n{text}");
        }
        assert!(text.contains("card 3: VENDOR_NVIDIA NVIDIA H800"));
        assert!(text.contains("UNHEALTHY"));
    }
}
