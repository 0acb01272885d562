//! What each fault means: severity, DCGM health watch and a readable reason, the same for every
//! backend. XID meanings follow NVIDIA's XID catalogue; the application XIDs that the NVIDIA
//! device plugin ignores when it decides health are warnings here, every other XID is critical.

use runtimekit_proto::resource::v1alpha1::{Fault, FaultKind, Severity};

/// XIDs caused by the application rather than the card (the NVIDIA device plugin's list).
pub const APPLICATION_XIDS: [u32; 6] = [13, 31, 43, 45, 68, 109];

/// A fault before it gets its start time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFault {
    pub kind: FaultKind,
    pub severity: Severity,
    pub xid: u32,
    pub reason: String,
    pub health_watch: &'static str,
    /// The MIG instance (GPU, compute) the driver attributed it to.
    pub instance: Option<(u32, Option<u32>)>,
}

impl NewFault {
    /// The fault as it goes on the wire, started at `since_unix_ms`.
    pub fn at(self, since_unix_ms: u64) -> Fault {
        Fault {
            kind: self.kind.into(),
            severity: self.severity.into(),
            reason: self.reason,
            xid: self.xid,
            since_unix_ms,
            health_watch: self.health_watch.to_string(),
            gpu_instance_id: self.instance.map(|(gi, _)| gi),
            compute_instance_id: self.instance.and_then(|(_, ci)| ci),
        }
    }

    /// The fault, attributed to a MIG instance (GPU instance, compute instance if known).
    pub fn in_instance(mut self, gpu_instance: u32, compute_instance: Option<u32>) -> NewFault {
        self.reason = format!("{} (MIG GPU instance {gpu_instance})", self.reason);
        self.instance = Some((gpu_instance, compute_instance));
        self
    }
}

/// What an XID code means, when it is a well-known one.
pub fn xid_meaning(code: u32) -> Option<&'static str> {
    Some(match code {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup, due to previous errors",
        48 => "double-bit ECC error",
        61 => "internal micro-controller breakpoint/warning",
        62 => "internal micro-controller halt",
        63 => "ECC page retirement or row remapping recording event",
        64 => "ECC page retirement or row remapper recording failure",
        68 => "NVDEC0 exception",
        69 => "graphics engine class error",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        109 => "context switch timeout",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        140 => "unrecovered ECC error",
        _ => return None,
    })
}

/// The DCGM health watch an XID belongs to.
fn xid_watch(code: u32) -> &'static str {
    match code {
        79 | 95 => "ALL",
        48 | 63 | 64 | 92 | 94 | 140 => "MEM",
        74 => "NVLINK",
        c if APPLICATION_XIDS.contains(&c) => "SM",
        _ => "DRIVER",
    }
}

/// An XID error.
pub fn xid(code: u32) -> NewFault {
    let application = APPLICATION_XIDS.contains(&code);
    let meaning = xid_meaning(code).unwrap_or("unknown XID");
    NewFault {
        kind: FaultKind::Xid,
        severity: if application {
            Severity::Warning
        } else {
            Severity::Critical
        },
        xid: code,
        reason: if application {
            format!("XID {code}: {meaning} (caused by an application)")
        } else {
            format!("XID {code}: {meaning}")
        },
        health_watch: xid_watch(code),
        instance: None,
    }
}

/// Volatile double-bit ECC errors.
pub fn ecc_dbe(count: u64) -> NewFault {
    NewFault {
        kind: FaultKind::EccDbe,
        severity: Severity::Critical,
        xid: 0,
        reason: format!(
            "{count} volatile double-bit (uncorrectable) ECC error{}",
            if count == 1 { "" } else { "s" }
        ),
        health_watch: "MEM",
        instance: None,
    }
}

/// The card fell off the bus.
pub fn gpu_lost() -> NewFault {
    NewFault {
        kind: FaultKind::GpuLost,
        severity: Severity::Critical,
        xid: 0,
        reason: "GPU has fallen off the bus or is otherwise inaccessible".into(),
        health_watch: "PCIE",
        instance: None,
    }
}

/// NVLink links that were active are down (`links`: their numbers).
pub fn nvlink_down(links: &[u32]) -> NewFault {
    let list: Vec<String> = links.iter().map(u32::to_string).collect();
    NewFault {
        kind: FaultKind::NvlinkDown,
        severity: Severity::Critical,
        xid: 0,
        reason: format!("NVLink link(s) {} down", list.join(", ")),
        health_watch: "NVLINK",
        instance: None,
    }
}

/// NVLink error counters rose by `errors` between two polls: a warning (links retry).
pub fn nvlink_errors(errors: u64) -> NewFault {
    NewFault {
        kind: FaultKind::NvlinkErrors,
        severity: Severity::Warning,
        xid: 0,
        reason: format!("{errors} NVLink errors (CRC, replay, recovery) since the last poll"),
        health_watch: "NVLINK",
        instance: None,
    }
}

/// The card's compute mode keeps work off it: `prohibited` fails the card; an exclusive mode
/// (one process only, so slices cannot share it) is a warning.
pub fn compute_mode(mode: &str, prohibited: bool) -> NewFault {
    NewFault {
        kind: FaultKind::ComputeMode,
        severity: if prohibited {
            Severity::Critical
        } else {
            Severity::Warning
        },
        xid: 0,
        reason: if prohibited {
            format!("compute mode {mode}: no process may use the card")
        } else {
            format!("compute mode {mode}: one process at a time, so slices cannot share the card")
        },
        health_watch: "SM",
        instance: None,
    }
}

/// The card's XID and ECC events cannot be watched (its event types cannot be read, or it
/// refuses the registration): a warning, since nothing is known to be wrong with the card.
pub fn events_unwatched(error: &str) -> NewFault {
    NewFault {
        kind: FaultKind::EventsUnwatched,
        severity: Severity::Warning,
        xid: 0,
        reason: format!("the card's XID events cannot be watched: {error}"),
        health_watch: "DRIVER",
        instance: None,
    }
}

/// A hardware call on the card has not returned.
pub fn call_hang(waited_ms: u64) -> NewFault {
    NewFault {
        kind: FaultKind::CallHang,
        severity: Severity::Critical,
        xid: 0,
        reason: format!("a hardware call on the card has not returned for {waited_ms} ms"),
        health_watch: "DRIVER",
        instance: None,
    }
}

/// Memory held by a process that no longer exists.
pub fn dead_process_memory(pid: u32, memory_mib: u64) -> NewFault {
    NewFault {
        kind: FaultKind::DeadProcessMemory,
        severity: Severity::Critical,
        xid: 0,
        reason: format!("{memory_mib} MiB held by process {pid}, which no longer exists"),
        health_watch: "MEM",
        instance: None,
    }
}

/// Row remapping failed.
pub fn row_remap_failure() -> NewFault {
    NewFault {
        kind: FaultKind::RowRemapFailure,
        severity: Severity::Critical,
        xid: 0,
        reason: "row remapping failed".into(),
        health_watch: "MEM",
        instance: None,
    }
}

/// Uncorrectable rows were remapped and the remap waits for a GPU reset.
pub fn row_remap_pending(uncorrectable: u64) -> NewFault {
    NewFault {
        kind: FaultKind::RowRemapPending,
        severity: if uncorrectable > 0 {
            Severity::Critical
        } else {
            Severity::Warning
        },
        xid: 0,
        reason: format!(
            "a row remap is pending a GPU reset ({uncorrectable} uncorrectable rows remapped)"
        ),
        health_watch: "MEM",
        instance: None,
    }
}

/// Pages wait to be retired.
pub fn retired_pages_pending() -> NewFault {
    NewFault {
        kind: FaultKind::RetiredPagesPending,
        severity: Severity::Critical,
        xid: 0,
        reason: "pages are pending retirement (needs a GPU reset)".into(),
        health_watch: "MEM",
        instance: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_xids_are_warnings_others_critical() {
        for code in APPLICATION_XIDS {
            let f = xid(code);
            assert_eq!(f.severity, Severity::Warning, "{code}");
            assert_eq!(f.health_watch, "SM");
        }
        for code in [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140, 999] {
            assert_eq!(xid(code).severity, Severity::Critical, "{code}");
        }
    }

    #[test]
    fn xid_reasons_and_watches() {
        assert_eq!(xid(79).reason, "XID 79: GPU has fallen off the bus");
        assert_eq!(xid(79).health_watch, "ALL");
        assert_eq!(xid(95).health_watch, "ALL");
        assert_eq!(xid(48).health_watch, "MEM");
        assert_eq!(xid(74).health_watch, "NVLINK");
        assert_eq!(xid(119).health_watch, "DRIVER");
        assert_eq!(xid(999).reason, "XID 999: unknown XID");
        assert_eq!(
            xid(13).reason,
            "XID 13: graphics engine exception (caused by an application)"
        );
    }

    #[test]
    fn faults_go_on_the_wire_with_their_kind() {
        let fault = ecc_dbe(2).at(42);
        assert_eq!(fault.kind(), FaultKind::EccDbe);
        assert_eq!(fault.severity(), Severity::Critical);
        assert_eq!(fault.since_unix_ms, 42);
        assert_eq!(
            fault.reason,
            "2 volatile double-bit (uncorrectable) ECC errors"
        );
        assert_eq!(
            ecc_dbe(1).reason,
            "1 volatile double-bit (uncorrectable) ECC error"
        );
        assert_eq!(row_remap_pending(0).severity, Severity::Warning);
        assert_eq!(row_remap_pending(3).severity, Severity::Critical);
    }
}
