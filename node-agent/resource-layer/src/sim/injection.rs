//! Fault injection: XID, volatile double-bit ECC, card lost, hanging calls and memory held by
//! a dead process, raised on the health hub; clearing a fault sends its clear event.

use super::SimulatedBackend;
use crate::backend::FaultInjector;
use crate::error::LayerError;
use crate::faults;
use crate::util::{lock, stable_hash};
use runtimekit_proto::resource::v1alpha1 as pb;

/// An injected CALL_HANG: unlike one the hang watch raises, it lasts until it is cleared.
fn injected_hang() -> faults::NewFault {
    let mut hang = faults::call_hang(0);
    hang.reason = "calls on the card block until the fault is cleared (injected)".into();
    hang
}

impl FaultInjector for SimulatedBackend {
    fn inject(&self, request: &pb::InjectFaultRequest) -> Result<pb::DeviceFault, LayerError> {
        let index = request.device_index;
        self.check_device(index, None)?;
        let uuid = self.uuids[index as usize].clone();
        let now = self.options.clock.now_ms();
        // Not `enter`: injecting and clearing must work while the card hangs.
        let mut state = lock(&self.state);
        let fault = match request.kind() {
            pb::FaultKind::Xid => {
                if request.xid == 0 {
                    return Err(LayerError::InvalidArgument(
                        "an XID fault needs its code".into(),
                    ));
                }
                let card = &mut state.cards[index as usize];
                card.xids.insert(request.xid);
                card.last_xid = Some(request.xid);
                faults::xid(request.xid)
            }
            pb::FaultKind::EccDbe => {
                let count = u64::from(request.count.max(1));
                let card = &mut state.cards[index as usize];
                card.dbe_volatile += count;
                card.dbe_aggregate += count;
                faults::ecc_dbe(card.dbe_volatile)
            }
            pb::FaultKind::GpuLost => {
                state.cards[index as usize].lost = true;
                faults::gpu_lost()
            }
            pb::FaultKind::CallHang => {
                state.cards[index as usize].hang = true;
                let hang = injected_hang();
                return Ok(pb::DeviceFault {
                    device_index: index,
                    device_uuid: uuid,
                    fault: Some(hang.at(now)),
                });
            }
            pb::FaultKind::DeadProcessMemory => {
                let memory_mib = if request.memory_mib == 0 {
                    1024
                } else {
                    request.memory_mib
                };
                let card = &mut state.cards[index as usize];
                let pid = if request.pid == 0 {
                    20_000
                        + u32::try_from(
                            stable_hash(&[uuid.as_bytes(), &card.dead.len().to_le_bytes()])
                                % 900_000,
                        )
                        .unwrap_or(0)
                } else {
                    request.pid
                };
                card.dead.push((pid, memory_mib));
                faults::dead_process_memory(pid, memory_mib)
            }
            other => {
                return Err(LayerError::InvalidArgument(format!(
                    "fault kind {} cannot be injected; use XID, ECC_DBE, GPU_LOST, CALL_HANG or DEAD_PROCESS_MEMORY",
                    other.as_str_name()
                )));
            }
        };
        drop(state);
        self.hub.raise(index, &uuid, fault.clone());
        Ok(pb::DeviceFault {
            device_index: index,
            device_uuid: uuid,
            fault: Some(fault.at(now)),
        })
    }

    fn clear(
        &self,
        device: u32,
        kind: Option<pb::FaultKind>,
        xid: Option<u32>,
    ) -> Result<u32, LayerError> {
        self.check_device(device, None)?;
        let wants = |k: pb::FaultKind| kind.is_none_or(|want| want == k);
        let mut cleared = 0u32;
        let mut hub_clears: Vec<(pb::FaultKind, Option<u32>)> = Vec::new();
        {
            let mut state = lock(&self.state);
            let card = &mut state.cards[device as usize];
            if wants(pb::FaultKind::Xid) {
                let codes: Vec<u32> = card
                    .xids
                    .iter()
                    .copied()
                    .filter(|c| xid.is_none_or(|x| x == *c))
                    .collect();
                for code in codes {
                    card.xids.remove(&code);
                    hub_clears.push((pb::FaultKind::Xid, Some(code)));
                    cleared += 1;
                }
            }
            if wants(pb::FaultKind::EccDbe) && card.dbe_volatile > 0 {
                card.dbe_volatile = 0;
                hub_clears.push((pb::FaultKind::EccDbe, None));
                cleared += 1;
            }
            if wants(pb::FaultKind::GpuLost) && card.lost {
                card.lost = false;
                hub_clears.push((pb::FaultKind::GpuLost, None));
                cleared += 1;
            }
            if wants(pb::FaultKind::CallHang) && card.hang {
                // The hang watch clears CALL_HANG when the blocked calls return.
                card.hang = false;
                cleared += 1;
            }
            if wants(pb::FaultKind::DeadProcessMemory) && !card.dead.is_empty() {
                cleared += u32::try_from(card.dead.len()).unwrap_or(u32::MAX);
                card.dead.clear();
                hub_clears.push((pb::FaultKind::DeadProcessMemory, None));
            }
        }
        self.unhang.notify_all();
        for (kind, xid) in hub_clears {
            self.hub.clear(device, Some(kind), xid);
        }
        Ok(cleared)
    }

    fn set_process_load(&self, device: u32, pid: u32, sm_percent: u32) -> Result<(), LayerError> {
        self.check_device(device, None)?;
        if pid == 0 || sm_percent > 100 {
            return Err(LayerError::InvalidArgument(format!(
                "a process load needs a PID and a percent from 0 to 100 (got PID {pid}, {sm_percent} %)"
            )));
        }
        let mut state = lock(&self.state);
        let loads = &mut state.cards[device as usize].loads;
        if sm_percent == 0 {
            loads.remove(&pid);
        } else {
            loads.insert(pid, sm_percent);
        }
        Ok(())
    }

    fn list(&self) -> Vec<pb::DeviceFault> {
        let state = lock(&self.state);
        let now = self.options.clock.now_ms();
        let mut out = Vec::new();
        for (i, card) in state.cards.iter().enumerate() {
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            let mut push = |fault: faults::NewFault| {
                let since = self
                    .hub
                    .faults_of(index)
                    .into_iter()
                    .find(|f| f.kind == fault.kind as i32 && f.xid == fault.xid)
                    .map_or(now, |f| f.since_unix_ms);
                out.push(pb::DeviceFault {
                    device_index: index,
                    device_uuid: self.uuids[i].clone(),
                    fault: Some(fault.at(since)),
                });
            };
            for &code in &card.xids {
                push(faults::xid(code));
            }
            if card.dbe_volatile > 0 {
                push(faults::ecc_dbe(card.dbe_volatile));
            }
            if card.lost {
                push(faults::gpu_lost());
            }
            if card.hang {
                push(injected_hang());
            }
            for &(pid, mib) in &card.dead {
                push(faults::dead_process_memory(pid, mib));
            }
        }
        out
    }
}
