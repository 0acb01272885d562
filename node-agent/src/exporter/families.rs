//! What a scrape shows, built from one sample of the node, with no I/O: the card families under
//! dcgm-exporter's names, the container families of each slice (use and limit side by side),
//! and the health families.
//!
//! - Card series carry `gpu`, `UUID`, `modelName`, `Hostname`, `NodeName`, `device`,
//!   `pci_bus_id` and `DCGM_FI_DRIVER_VERSION`; a reading the card does not give has no sample
//!   (as dcgm-exporter skips blanks).
//! - Container series (`DCGM_FI_CONTAINER_*`) add `pod`, `namespace`, `container_name`, and
//!   `GPU_I_PROFILE`/`GPU_I_ID` on MIG slices. They carry only that container's use, never a
//!   copy of the card's: the memory and SM time of its own processes (on MIG, of its instance).
//!   One series per slice, so series of ended pods go with their slices; a prepared
//!   ResourceClaim's card gets one per container using it, labelled alike.
//! - dcgm-exporter's counters (energy, ECC, replays, throttle time...) are exported as gauges:
//!   Prometheus' text format wants a counter's name to end in `_total`, and the DCGM names must
//!   stay as dashboards query them.

use super::holdings::{Holding, holdings};
use crate::model::NodeState;
use runtimekit_crds::SliceMode;
use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::BTreeMap;

/// One series: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

/// One metric family.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub samples: Vec<Sample>,
}

/// Everything one sample of the node says.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub node_name: &'a str,
    pub hostname: &'a str,
    pub driver_version: &'a str,
    /// What the agent knows of the node: its cards, slices and faults.
    pub state: &'a NodeState,
    /// Each card's readings, with its processes.
    pub metrics: &'a [pb::DeviceMetrics],
    /// The readings of the MIG instances, by instance key.
    pub instances: &'a [pb::InstanceMetrics],
    /// The pod UID each process runs in, by PID (from its cgroup).
    pub pod_of_pid: &'a BTreeMap<u32, String>,
}

impl Inputs<'_> {
    /// The cards, as the inventory lists them.
    fn devices(&self) -> impl Iterator<Item = &pb::Device> {
        self.state.inventory.iter().flat_map(|i| i.devices.values())
    }
}

/// A card reading: family name, help, and how to read it.
type Reading = (
    &'static str,
    &'static str,
    fn(&pb::DeviceMetrics) -> Option<f64>,
);

fn f<T: Into<f64>>(v: Option<T>) -> Option<f64> {
    v.map(Into::into)
}

/// A 64-bit count as a float (exact up to 2^53, far beyond any counter here).
fn count(v: Option<u64>) -> Option<f64> {
    v.map(|v| v as f64)
}

/// Every card family, with dcgm-exporter's names and help texts.
const READINGS: &[Reading] = &[
    (
        "DCGM_FI_DEV_SM_CLOCK",
        "SM clock frequency (in MHz).",
        |m| f(m.sm_clock_mhz),
    ),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        "Memory clock frequency (in MHz).",
        |m| f(m.mem_clock_mhz),
    ),
    (
        "DCGM_FI_DEV_MEMORY_TEMP",
        "Memory temperature (in C).",
        |m| f(m.memory_temp_c),
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", |m| {
        f(m.gpu_temp_c)
    }),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", |m| {
        m.power_usage_w
    }),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        |m| count(m.total_energy_mj),
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "Total number of PCIe retries.",
        |m| count(m.pcie_replay_count),
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", |m| {
        f(m.gpu_util_percent)
    }),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "Memory utilization (in %).",
        |m| f(m.mem_copy_util_percent),
    ),
    ("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", |m| {
        f(m.enc_util_percent)
    }),
    ("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", |m| {
        f(m.dec_util_percent)
    }),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered.",
        |m| count(m.xid_last),
    ),
    (
        "DCGM_FI_DEV_POWER_VIOLATION",
        "Throttling duration due to power constraints (in us).",
        |m| count(m.power_violation_ns).map(|ns| ns / 1000.0),
    ),
    (
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "Throttling duration due to thermal constraints (in us).",
        |m| count(m.thermal_violation_ns).map(|ns| ns / 1000.0),
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        |m| count(m.fb_free_mib),
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB).",
        |m| count(m.fb_used_mib),
    ),
    (
        "DCGM_FI_DEV_FB_RESERVED",
        "Framebuffer memory reserved (in MiB).",
        |m| count(m.fb_reserved_mib),
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
        |m| count(m.ecc_sbe_volatile),
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
        |m| count(m.ecc_dbe_volatile),
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "Total number of single-bit persistent ECC errors.",
        |m| count(m.ecc_sbe_aggregate),
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Total number of double-bit persistent ECC errors.",
        |m| count(m.ecc_dbe_aggregate),
    ),
    (
        "DCGM_FI_DEV_RETIRED_SBE",
        "Total number of retired pages due to single-bit errors.",
        |m| count(m.retired_pages_sbe),
    ),
    (
        "DCGM_FI_DEV_RETIRED_DBE",
        "Total number of retired pages due to double-bit errors.",
        |m| count(m.retired_pages_dbe),
    ),
    (
        "DCGM_FI_DEV_RETIRED_PENDING",
        "Total number of pages pending retirement.",
        |m| m.retired_pages_pending.map(|p| f64::from(u8::from(p))),
    ),
    (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "Total number of NVLink flow-control CRC errors.",
        |m| count(m.nvlink_crc_flit_errors),
    ),
    (
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "Total number of NVLink data CRC errors.",
        |m| count(m.nvlink_crc_data_errors),
    ),
    (
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "Total number of NVLink retries.",
        |m| count(m.nvlink_replay_errors),
    ),
    (
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "Total number of NVLink recovery errors.",
        |m| count(m.nvlink_recovery_errors),
    ),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "Total number of NVLink bandwidth counters for all lanes.",
        |m| match (m.nvlink_tx_bytes, m.nvlink_rx_bytes) {
            (None, None) => None,
            (tx, rx) => Some(tx.unwrap_or(0) as f64 + rx.unwrap_or(0) as f64),
        },
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors",
        |m| count(m.remapped_rows_uncorrectable),
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors",
        |m| count(m.remapped_rows_correctable),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "Whether remapping of rows has failed",
        |m| m.row_remap_failure.map(|p| f64::from(u8::from(p))),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "Whether remapping of rows is pending",
        |m| m.row_remap_pending.map(|p| f64::from(u8::from(p))),
    ),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active.",
        |m| m.gr_engine_active,
    ),
    (
        "DCGM_FI_PROF_SM_ACTIVE",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        |m| m.sm_active,
    ),
    (
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "The ratio of number of warps resident on an SM.",
        |m| m.sm_occupancy,
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        |m| m.pipe_tensor_active,
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        |m| m.dram_active,
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
        |m| count(m.pcie_tx_bytes_per_s),
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
        |m| count(m.pcie_rx_bytes_per_s),
    ),
];

/// The DCGM health watches a fault can belong to, each with its own gauge (`ALL`: faults of the
/// whole card, such as XID 79).
pub const WATCHES: [(&str, &str); 8] = [
    ("PCIE", "DCGM_FI_HEALTH_WATCH_PCIE"),
    ("NVLINK", "DCGM_FI_HEALTH_WATCH_NVLINK"),
    ("MEM", "DCGM_FI_HEALTH_WATCH_MEM"),
    ("SM", "DCGM_FI_HEALTH_WATCH_SM"),
    ("THERMAL", "DCGM_FI_HEALTH_WATCH_THERMAL"),
    ("POWER", "DCGM_FI_HEALTH_WATCH_POWER"),
    ("DRIVER", "DCGM_FI_HEALTH_WATCH_DRIVER"),
    ("ALL", "DCGM_FI_HEALTH_WATCH_ALL"),
];

/// The labels of card `device`.
fn card_labels(inputs: &Inputs<'_>, device: &pb::Device) -> Vec<(&'static str, String)> {
    vec![
        ("gpu", device.index.to_string()),
        ("UUID", device.uuid.clone()),
        ("modelName", device.model.clone()),
        ("Hostname", inputs.hostname.to_owned()),
        ("NodeName", inputs.node_name.to_owned()),
        ("device", format!("nvidia{}", device.index)),
        ("pci_bus_id", device.pci_bus_id.clone()),
        ("DCGM_FI_DRIVER_VERSION", inputs.driver_version.to_owned()),
    ]
}

/// The families of one sample of the node.
pub fn families(inputs: &Inputs<'_>) -> Vec<Family> {
    let mut out = card_families(inputs);
    out.extend(container_families(inputs));
    out.extend(health_families(inputs));
    out
}

fn card_families(inputs: &Inputs<'_>) -> Vec<Family> {
    READINGS
        .iter()
        .map(|(name, help, read)| Family {
            name,
            help,
            samples: inputs
                .devices()
                .filter_map(|device| {
                    let m = inputs
                        .metrics
                        .iter()
                        .find(|m| m.device_index == device.index)?;
                    Some(Sample {
                        labels: card_labels(inputs, device),
                        value: read(m)?,
                    })
                })
                .collect(),
        })
        .collect()
}

/// One slice's use of its card: memory (MiB) and SM time (%), and its limits.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct SliceUse {
    memory_mib: Option<f64>,
    sm_percent: Option<f64>,
    memory_limit_mib: Option<f64>,
    core_limit_percent: Option<f64>,
}

/// What holding `slice` on `device` uses and may use.
fn slice_use(inputs: &Inputs<'_>, device: &pb::Device, slice: &Holding) -> SliceUse {
    let card = inputs
        .metrics
        .iter()
        .find(|m| m.device_index == device.index);
    match slice.mode {
        SliceMode::Mig => {
            let instance = inputs
                .instances
                .iter()
                .find(|i| i.key == slice.instance_key);
            SliceUse {
                memory_mib: count(instance.and_then(|i| i.memory_used_mib)),
                sm_percent: f(instance.and_then(|i| i.sm_util_percent)),
                memory_limit_mib: instance
                    .map(|i| i.memory_limit_mib as f64)
                    .filter(|m| *m > 0.0)
                    .or_else(|| count(slice.memory_mib)),
                core_limit_percent: None,
            }
        }
        SliceMode::Tdm | SliceMode::Whole => {
            // The container's own processes on the card, found by their pod.
            let own: Vec<&pb::ProcessMetrics> = card
                .map(|m| m.processes.as_slice())
                .unwrap_or_default()
                .iter()
                .filter(|p| inputs.pod_of_pid.get(&p.pid) == Some(&slice.pod_uid))
                .collect();
            let whole = slice.mode == SliceMode::Whole;
            SliceUse {
                memory_mib: Some(own.iter().filter_map(|p| p.used_memory_mib).sum::<u64>() as f64),
                sm_percent: Some(
                    f64::from(own.iter().filter_map(|p| p.sm_util_percent).sum::<u32>()).min(100.0),
                ),
                memory_limit_mib: if whole {
                    Some(device.memory_mib as f64)
                } else {
                    count(slice.memory_mib).or(Some(device.memory_mib as f64))
                },
                core_limit_percent: if whole {
                    Some(100.0)
                } else {
                    slice.core.map(f64::from).or(Some(100.0))
                },
            }
        }
    }
}

fn container_families(inputs: &Inputs<'_>) -> Vec<Family> {
    let mut used = Vec::new();
    let mut sm = Vec::new();
    let mut memory_limit = Vec::new();
    let mut core_limit = Vec::new();
    for slice in &holdings(inputs.state) {
        let Some(device) = inputs.devices().find(|d| d.index == slice.card) else {
            continue;
        };
        let mut labels = card_labels(inputs, device);
        labels.extend([
            ("pod", slice.pod_name.clone()),
            ("namespace", slice.pod_namespace.clone()),
            ("container_name", slice.container.clone()),
        ]);
        if slice.mode == SliceMode::Mig {
            let instance = device
                .instances
                .iter()
                .find(|i| i.key == slice.instance_key);
            let gi = instance
                .and_then(|i| i.mig.as_ref())
                .map(|m| m.gpu_instance_id.to_string())
                .unwrap_or_default();
            // A claim's profile is its instance's.
            let profile = slice.mig_profile.clone().or_else(|| {
                match instance?.spec.as_ref()?.kind.as_ref()? {
                    pb::instance_spec::Kind::Mig(mig) => Some(mig.profile.clone()),
                    _ => None,
                }
            });
            labels.extend([
                ("GPU_I_PROFILE", profile.unwrap_or_default()),
                ("GPU_I_ID", gi),
            ]);
        }
        let usage = slice_use(inputs, device, slice);
        for (family, value) in [
            (&mut used, usage.memory_mib),
            (&mut sm, usage.sm_percent),
            (&mut memory_limit, usage.memory_limit_mib),
            (&mut core_limit, usage.core_limit_percent),
        ] {
            if let Some(value) = value {
                family.push(Sample {
                    labels: labels.clone(),
                    value,
                });
            }
        }
    }
    vec![
        Family {
            name: "DCGM_FI_CONTAINER_FB_USED",
            help: "Card memory the container's processes use (in MiB); on MIG, its instance's.",
            samples: used,
        },
        Family {
            name: "DCGM_FI_CONTAINER_SM_UTIL",
            help: "SM time the container's processes use (in %); on MIG, its instance's.",
            samples: sm,
        },
        Family {
            name: "DCGM_FI_CONTAINER_FB_LIMIT",
            help: "Card memory the container may use (in MiB): its slice's memory, its MIG instance's, or the whole card's.",
            samples: memory_limit,
        },
        Family {
            name: "DCGM_FI_CONTAINER_CORE_LIMIT",
            help: "SM time the container may use (in %): its slice's gpu-core, 100 for a whole card.",
            samples: core_limit,
        },
    ]
}

/// DCGM's health result codes.
const PASS: f64 = 0.0;
const WARN: f64 = 10.0;
const FAIL: f64 = 20.0;

fn health_families(inputs: &Inputs<'_>) -> Vec<Family> {
    let mut overall = Vec::new();
    let mut per_watch: Vec<Vec<Sample>> = vec![Vec::new(); WATCHES.len()];
    let mut status = Vec::new();
    for device in inputs.devices() {
        let labels = card_labels(inputs, device);
        let lost = device.state() == pb::DeviceState::Lost;
        let healthy = inputs.state.healthy(device);
        overall.push(Sample {
            labels: labels.clone(),
            value: f64::from(u8::from(healthy)),
        });
        let faults = inputs.state.faults.faults(device.index);
        for (w, (watch, _)) in WATCHES.iter().enumerate() {
            let of_watch = faults
                .iter()
                .filter(|f| f.health_watch == *watch && f.gpu_instance_id.is_none());
            let (mut result, mut code) = (PASS, "DCGM_FR_OK".to_owned());
            for fault in of_watch {
                let this = if fault.severity() == pb::Severity::Critical {
                    FAIL
                } else {
                    WARN
                };
                if this > result {
                    result = this;
                    code = format!(
                        "DCGM_FR_{}",
                        fault.kind().as_str_name().trim_start_matches("FAULT_KIND_")
                    );
                }
            }
            if lost && *watch == "PCIE" {
                result = FAIL;
                code = "DCGM_FR_GPU_LOST".into();
            }
            per_watch[w].push(Sample {
                labels: labels.clone(),
                value: f64::from(u8::from(result < FAIL)),
            });
            let mut with_watch = labels.clone();
            with_watch.extend([
                ("health_watch", (*watch).to_owned()),
                ("health_error_code", code),
            ]);
            status.push(Sample {
                labels: with_watch,
                value: result,
            });
        }
    }
    let mut out = vec![Family {
        name: "DCGM_FI_HEALTH_WATCH_OVERALL",
        help: "Whether the card is healthy: 1 healthy, 0 not (a critical fault, or lost).",
        samples: overall,
    }];
    for ((_, name), samples) in WATCHES.iter().zip(per_watch) {
        out.push(Family {
            name,
            help: "Whether the card passes this DCGM health watch: 1 pass or warn, 0 fail.",
            samples,
        });
    }
    out.push(Family {
        name: "DCGM_EXP_GPU_HEALTH_STATUS",
        help: "DCGM reported health status: 0 pass, 10 warn, 20 fail, per health watch.",
        samples: status,
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{fault, four_cards, slice};
    use runtimekit_crds::SlicePhase;

    /// A family, labels its series must have, and the value it must show (none: no series).
    type Expected<'a> = (&'a str, &'a [(&'a str, &'a str)], Option<f64>);

    /// The value of the series of `family` whose labels include every pair of `with`.
    fn value(families: &[Family], family: &str, with: &[(&str, &str)]) -> Option<f64> {
        families
            .iter()
            .find(|f| f.name == family)?
            .samples
            .iter()
            .find(|s| {
                with.iter()
                    .all(|(k, v)| s.labels.iter().any(|(l, x)| l == k && x == v))
            })
            .map(|s| s.value)
    }

    fn process(pid: u32, mib: u64, sm: u32) -> pb::ProcessMetrics {
        pb::ProcessMetrics {
            pid,
            used_memory_mib: Some(mib),
            sm_util_percent: Some(sm),
            ..Default::default()
        }
    }

    #[test]
    fn cards_slices_and_health_as_series() {
        let mut state = four_cards();
        state.slices = vec![
            slice("t", 0, SliceMode::Tdm, SlicePhase::Ready),
            slice("a", 3, SliceMode::Mig, SlicePhase::Ready),
        ];
        state.faults.apply(&pb::HealthEvent {
            device_index: 2,
            device_uuid: "GPU-2".into(),
            active: true,
            fault: Some(pb::Fault {
                health_watch: "ALL".into(),
                ..fault(pb::FaultKind::Xid, 79, pb::Severity::Critical)
            }),
            ..Default::default()
        });
        let metrics = vec![
            pb::DeviceMetrics {
                device_index: 0,
                gpu_temp_c: Some(41),
                fb_used_mib: Some(9_000),
                total_energy_mj: Some(123_456),
                // The TDM pod's process, and another pod's, on the same card.
                processes: vec![process(10, 3_000, 35), process(11, 6_000, 60)],
                ..Default::default()
            },
            pb::DeviceMetrics {
                device_index: 1,
                gpu_temp_c: None,
                ..Default::default()
            },
        ];
        let instances = vec![pb::InstanceMetrics {
            key: "ns/a".into(),
            memory_used_mib: Some(1_500),
            memory_limit_mib: 40_320,
            sm_util_percent: Some(20),
            ..Default::default()
        }];
        let pods = BTreeMap::from([(10, "uid-t".to_owned()), (11, "uid-other".to_owned())]);
        let families = families(&Inputs {
            node_name: "n1",
            hostname: "n1",
            driver_version: "550.90.07",
            state: &state,
            metrics: &metrics,
            instances: &instances,
            pod_of_pid: &pods,
        });
        let card0: &[(&str, &str)] = &[
            ("gpu", "0"),
            ("UUID", "GPU-0"),
            ("modelName", "NVIDIA H800"),
        ];
        // The TDM pod: its own process only, and its limits beside.
        let pod: &[(&str, &str)] = &[
            ("pod", "pod-t"),
            ("namespace", "ns"),
            ("container_name", "app"),
        ];
        // The MIG pod: its instance's readings, with the instance's labels.
        let mig: &[(&str, &str)] = &[
            ("pod", "pod-a"),
            ("GPU_I_PROFILE", "3g.40gb"),
            ("GPU_I_ID", "2"),
            ("gpu", "3"),
        ];
        let expected: &[Expected] = &[
            ("DCGM_FI_DEV_GPU_TEMP", card0, Some(41.0)),
            (
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                card0,
                Some(123_456.0),
            ),
            // A reading the card does not give has no sample.
            ("DCGM_FI_DEV_GPU_TEMP", &[("gpu", "1")], None),
            ("DCGM_FI_CONTAINER_FB_USED", pod, Some(3_000.0)),
            ("DCGM_FI_CONTAINER_SM_UTIL", pod, Some(35.0)),
            ("DCGM_FI_CONTAINER_FB_LIMIT", pod, Some(4_096.0)),
            ("DCGM_FI_CONTAINER_CORE_LIMIT", pod, Some(50.0)),
            ("DCGM_FI_CONTAINER_FB_USED", mig, Some(1_500.0)),
            ("DCGM_FI_CONTAINER_FB_LIMIT", mig, Some(40_320.0)),
            // Card 2 has XID 79 (watch ALL).
            ("DCGM_FI_HEALTH_WATCH_OVERALL", &[("gpu", "2")], Some(0.0)),
            ("DCGM_FI_HEALTH_WATCH_OVERALL", &[("gpu", "0")], Some(1.0)),
            ("DCGM_FI_HEALTH_WATCH_ALL", &[("gpu", "2")], Some(0.0)),
            ("DCGM_FI_HEALTH_WATCH_MEM", &[("gpu", "2")], Some(1.0)),
            (
                "DCGM_EXP_GPU_HEALTH_STATUS",
                &[
                    ("gpu", "2"),
                    ("health_watch", "ALL"),
                    ("health_error_code", "DCGM_FR_XID"),
                ],
                Some(20.0),
            ),
            (
                "DCGM_EXP_GPU_HEALTH_STATUS",
                &[("gpu", "0"), ("health_watch", "ALL")],
                Some(0.0),
            ),
        ];
        for (family, labels, want) in expected {
            assert_eq!(
                value(&families, family, labels),
                *want,
                "{family} {labels:?}"
            );
        }
    }

    /// The families of the fixture node with nothing running.
    fn idle_families() -> Vec<Family> {
        families(&Inputs {
            node_name: "n1",
            hostname: "n1",
            driver_version: "",
            state: &four_cards(),
            metrics: &[],
            instances: &[],
            pod_of_pid: &BTreeMap::new(),
        })
    }

    #[test]
    fn every_family_is_in_the_metrics_definition() {
        let doc = include_str!("../../../docs/metrics-definition.md");
        let all = idle_families();
        for family in all {
            let suffix = family.name.rsplit('_').next().unwrap_or_default();
            let listed = doc.contains(&format!("`{}`", family.name))
                || (family.name.starts_with("DCGM_FI_HEALTH_WATCH_")
                    && doc.contains(&format!("`_{suffix}`")));
            assert!(
                listed,
                "{} is not in docs/metrics-definition.md",
                family.name
            );
        }
    }

    #[test]
    fn series_of_ended_pods_go_with_their_slices() {
        let families = idle_families();
        assert!(
            families
                .iter()
                .filter(|f| f.name.starts_with("DCGM_FI_CONTAINER_"))
                .all(|f| f.samples.is_empty())
        );
    }
}
