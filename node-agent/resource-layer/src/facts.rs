//! The probe's facts: every figure the backend reads, one per line, tab-separated, so a script
//! can set each beside what `nvidia-smi` says (`e2e/gpu-check.sh`). Read-only, like the probe.
//!
//! Lines: `driver <version>`; `card <index> <field> <value>...` with the fields below;
//! `path <a> <b> <PIX|PXB|PHB|NODE|SYS|BOARD> <peer links>`; `liveness <why not watched>`.

use crate::backend::Backend;
use crate::error::LayerError;
use runtimekit_proto::resource::v1alpha1 as pb;
use std::fmt::Write as _;

/// One line of tab-separated words.
fn line(out: &mut String, words: &[&dyn std::fmt::Display]) {
    let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    let _ = writeln!(out, "{}", words.join("\t"));
}

/// A reading, `-` when the backend has none.
fn or_dash<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

/// The facts, as text.
pub fn facts(backend: &dyn Backend) -> Result<String, LayerError> {
    let mut out = String::new();
    let info = backend.info();
    line(&mut out, &[&"driver", &info.driver_version]);
    if !info.process_liveness_unavailable.is_empty() {
        line(&mut out, &[&"liveness", &info.process_liveness_unavailable]);
    }
    let listing = backend.list_devices(&[])?;
    for e in &listing.errors {
        line(
            &mut out,
            &[&"card", &e.device_index, &"error", &e.reason, &e.message],
        );
    }
    for d in &listing.devices {
        let card = |out: &mut String, field: &str, value: &dyn std::fmt::Display| {
            line(out, &[&"card", &d.index, &field, value]);
        };
        card(&mut out, "uuid", &d.uuid);
        card(
            &mut out,
            "state",
            &d.state().as_str_name().trim_start_matches("DEVICE_STATE_"),
        );
        card(&mut out, "name", &d.model);
        card(&mut out, "memory_total_mib", &d.memory_mib);
        card(&mut out, "pci_bus_id", &d.pci_bus_id);
        card(&mut out, "healthy", &u8::from(d.healthy));
        if let Some(t) = &d.topology {
            let active = t.links.iter().filter(|l| l.active).count();
            card(&mut out, "nvlink_active_links", &active);
        }
        if let Some(m) = d.mig.as_ref().filter(|m| m.capable) {
            card(&mut out, "mig_current", &u8::from(m.enabled));
            card(&mut out, "mig_pending", &u8::from(m.pending_enabled));
            for p in &m.profiles {
                let starts: Vec<String> = p.starts.iter().map(u32::to_string).collect();
                line(
                    &mut out,
                    &[
                        &"card",
                        &d.index,
                        &"mig_profile",
                        &p.name,
                        &p.nvml_profile_id,
                        &p.max_instances,
                        &p.memory_mib,
                        &starts.join(","),
                    ],
                );
            }
        }
        for i in &d.instances {
            let (Some(ids), Some(pb::instance_spec::Kind::Mig(spec))) = (
                i.mig.as_ref(),
                i.spec.as_ref().and_then(|s| s.kind.as_ref()),
            ) else {
                continue;
            };
            line(
                &mut out,
                &[
                    &"card",
                    &d.index,
                    &"mig_instance",
                    &ids.gpu_instance_id,
                    &if ids.no_compute_instance {
                        "-".to_string()
                    } else {
                        ids.compute_instance_id.to_string()
                    },
                    &spec.profile,
                    &spec.placement_start,
                ],
            );
        }
        for f in &d.faults {
            line(
                &mut out,
                &[
                    &"card",
                    &d.index,
                    &"fault",
                    &f.kind().as_str_name().trim_start_matches("FAULT_KIND_"),
                    &f.reason,
                ],
            );
        }
    }
    for p in &listing.paths {
        line(
            &mut out,
            &[
                &"path",
                &p.a,
                &p.b,
                &p.pcie().as_str_name().trim_start_matches("PATH_LEVEL_"),
                &p.links,
            ],
        );
    }
    let metrics = backend.device_metrics(&[], true)?;
    for e in &metrics.errors {
        line(
            &mut out,
            &[&"card", &e.device_index, &"error", &e.reason, &e.message],
        );
    }
    for m in &metrics.devices {
        let card = |out: &mut String, field: &str, value: String| {
            line(out, &[&"card", &m.device_index, &field, &value]);
        };
        card(&mut out, "gpu_temp_c", or_dash(m.gpu_temp_c));
        card(&mut out, "memory_temp_c", or_dash(m.memory_temp_c));
        card(&mut out, "power_w", or_dash(m.power_usage_w));
        card(&mut out, "energy_mj", or_dash(m.total_energy_mj));
        card(&mut out, "sm_clock_mhz", or_dash(m.sm_clock_mhz));
        card(&mut out, "mem_clock_mhz", or_dash(m.mem_clock_mhz));
        card(&mut out, "gpu_util_percent", or_dash(m.gpu_util_percent));
        card(
            &mut out,
            "mem_util_percent",
            or_dash(m.mem_copy_util_percent),
        );
        card(&mut out, "fb_used_mib", or_dash(m.fb_used_mib));
        card(&mut out, "fb_free_mib", or_dash(m.fb_free_mib));
        card(&mut out, "ecc_sbe_volatile", or_dash(m.ecc_sbe_volatile));
        card(&mut out, "ecc_dbe_volatile", or_dash(m.ecc_dbe_volatile));
        card(&mut out, "ecc_sbe_aggregate", or_dash(m.ecc_sbe_aggregate));
        card(&mut out, "ecc_dbe_aggregate", or_dash(m.ecc_dbe_aggregate));
        card(
            &mut out,
            "remapped_correctable",
            or_dash(m.remapped_rows_correctable),
        );
        card(
            &mut out,
            "remapped_uncorrectable",
            or_dash(m.remapped_rows_uncorrectable),
        );
        card(
            &mut out,
            "remap_pending",
            or_dash(m.row_remap_pending.map(u8::from)),
        );
        card(
            &mut out,
            "remap_failure",
            or_dash(m.row_remap_failure.map(u8::from)),
        );
        card(&mut out, "nvlink_tx_bytes", or_dash(m.nvlink_tx_bytes));
        card(&mut out, "nvlink_rx_bytes", or_dash(m.nvlink_rx_bytes));
        card(
            &mut out,
            "nvlink_crc_flit_errors",
            or_dash(m.nvlink_crc_flit_errors),
        );
        card(
            &mut out,
            "nvlink_replay_errors",
            or_dash(m.nvlink_replay_errors),
        );
        card(
            &mut out,
            "nvlink_recovery_errors",
            or_dash(m.nvlink_recovery_errors),
        );
        card(&mut out, "sm_active", or_dash(m.sm_active));
        for p in &m.processes {
            line(
                &mut out,
                &[
                    &"card",
                    &m.device_index,
                    &"process",
                    &p.pid,
                    &or_dash(p.used_memory_mib),
                    &or_dash(p.sm_util_percent),
                    &or_dash(p.alive.map(u8::from)),
                ],
            );
        }
    }
    Ok(out)
}
