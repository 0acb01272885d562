//! The character devices that give a container a card, a MIG instance or an RDMA NIC, as the
//! resource layer reports them: `lj-runtime` injects exactly these, and the device plugin hands
//! the same ones to pods of other schedulers, so both sides agree on what a card is.
//!
//! NVIDIA's layout: a card is `/dev/nvidia<minor>`; every container with a card also needs
//! `/dev/nvidiactl`, `/dev/nvidia-uvm` and `/dev/nvidia-uvm-tools`; a MIG instance adds its GPU
//! instance's and compute instance's capability devices, whose minors the driver lists in
//! `/proc/driver/nvidia-caps/mig-minors` (`gpu<minor>/gi<id>/access <n>` and
//! `gpu<minor>/gi<id>/ci<id>/access <n>`, the device being `/dev/nvidia-caps/nvidia-cap<n>`). An
//! RDMA NIC is its `uverbs` device (named in sysfs) and `/dev/infiniband/rdma_cm`.
//!
//! The simulated backend makes stand-ins for all of these under its own folder
//! ([`DeviceNodes::make_stand_ins`]): real character devices (NVIDIA's major 195 for cards),
//! which no driver answers, so injection can be seen on machines without GPUs. Only nodes that
//! exist are reported.

use runtimekit_proto::resource::v1alpha1 as pb;
use std::path::{Path, PathBuf};

/// The control devices of NVIDIA's driver, under the device root.
const CONTROL: [&str; 3] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"];
/// NVIDIA's character-device major, used for the stand-ins of cards and control devices.
const NVIDIA_MAJOR: u64 = 195;
/// The stand-ins' major for MIG capability devices (dynamic on real machines).
const CAPS_MAJOR: u64 = 511;
/// The InfiniBand verbs major and the first uverbs minor, as on real machines.
const UVERBS_MAJOR: u64 = 231;
const UVERBS_FIRST_MINOR: u64 = 192;
/// The misc major and rdma_cm's minor.
const RDMA_CM: (u64, u64) = (10, 58);
/// GPU-instance IDs the stand-ins cover (the driver allows up to 14).
const MAX_GPU_INSTANCE_ID: u32 = 14;

/// Where one node's device files are found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNodes {
    /// The device folder (`/dev`).
    pub dev_root: PathBuf,
    /// The sysfs root (`/sys`), for NICs' uverbs devices.
    pub sysfs_root: PathBuf,
    /// The driver's MIG capability table.
    pub mig_minors: PathBuf,
    /// Each card's device minor, by card index (NVML's minor number; the index when unknown).
    pub minors: Vec<u32>,
}

impl DeviceNodes {
    /// A real machine's layout, with the cards' minors.
    pub fn host(sysfs_root: &Path, minors: Vec<u32>) -> DeviceNodes {
        DeviceNodes {
            dev_root: PathBuf::from("/dev"),
            sysfs_root: sysfs_root.to_path_buf(),
            mig_minors: PathBuf::from("/proc/driver/nvidia-caps/mig-minors"),
            minors,
        }
    }

    /// The layout of stand-ins under `dir`, for `cards` cards whose minors are their indexes.
    pub fn stand_ins(dir: &Path, cards: u32) -> DeviceNodes {
        DeviceNodes {
            dev_root: dir.join("dev"),
            sysfs_root: dir.join("sys"),
            mig_minors: dir.join("mig-minors"),
            minors: (0..cards).collect(),
        }
    }

    fn minor(&self, index: u32) -> u32 {
        self.minors.get(index as usize).copied().unwrap_or(index)
    }

    fn existing(&self, relative: impl IntoIterator<Item = String>) -> Vec<String> {
        relative
            .into_iter()
            .map(|r| self.dev_root.join(r))
            .filter(|p| p.exists())
            .map(|p| p.display().to_string())
            .collect()
    }

    /// Fills the device nodes of every card, MIG instance and NIC of a listing, and the
    /// control nodes.
    pub fn fill_listing(&self, listing: &mut pb::ListDevicesResponse) {
        for device in &mut listing.devices {
            device.device_nodes = self.existing([format!("nvidia{}", self.minor(device.index))]);
            for instance in &mut device.instances {
                self.fill_instance(instance);
            }
        }
        listing.control_nodes = self.existing(CONTROL.map(str::to_owned));
        listing.device_root = self.dev_root.display().to_string();
        for nic in &mut listing.nics {
            nic.device_nodes = self.nic(&nic.name);
        }
    }

    /// Fills a MIG instance's capability devices.
    pub fn fill_instance(&self, instance: &mut pb::Instance) {
        let index = instance.spec.as_ref().map_or(0, |s| s.device_index);
        let minor = self.minor(index);
        if let Some(mig) = instance.mig.as_mut() {
            let table = std::fs::read_to_string(&self.mig_minors).unwrap_or_default();
            let caps = mig_caps(&table, minor, mig.gpu_instance_id, mig.compute_instance_id);
            mig.device_nodes = self.existing(
                caps.into_iter()
                    .map(|n| format!("nvidia-caps/nvidia-cap{n}")),
            );
        }
    }

    /// A NIC's uverbs device (from sysfs) and rdma_cm.
    fn nic(&self, name: &str) -> Vec<String> {
        let verbs = self
            .sysfs_root
            .join("class/infiniband")
            .join(name)
            .join("device/infiniband_verbs");
        let mut names: Vec<String> = std::fs::read_dir(verbs)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| n.starts_with("uverbs"))
                    .map(|n| format!("infiniband/{n}"))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        if names.is_empty() {
            return Vec::new();
        }
        names.push("infiniband/rdma_cm".into());
        self.existing(names)
    }

    /// Makes the stand-ins of [`DeviceNodes::stand_ins`]: a card device per card, the control
    /// devices, a capability table and devices for every GPU instance and its first compute
    /// instance, and for each NIC (`nics`, in order) a uverbs device with its sysfs entry.
    pub fn make_stand_ins(&self, nics: &[String]) -> std::io::Result<()> {
        let make = |relative: &str, major: u64, minor: u64| -> std::io::Result<()> {
            let path = self.dev_root.join(relative);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            if path.exists() {
                return Ok(());
            }
            nix::sys::stat::mknod(
                &path,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o666),
                nix::sys::stat::makedev(major, minor),
            )
            .map_err(std::io::Error::from)
        };
        for &minor in &self.minors {
            make(&format!("nvidia{minor}"), NVIDIA_MAJOR, u64::from(minor))?;
        }
        for (i, name) in CONTROL.iter().enumerate() {
            make(name, NVIDIA_MAJOR, 255 - i as u64)?;
        }
        let mut table = String::from("config 1\nmonitor 2\n");
        let mut next = 3u64;
        for &minor in &self.minors {
            for gi in 0..=MAX_GPU_INSTANCE_ID {
                for line in [
                    format!("gpu{minor}/gi{gi}/access"),
                    format!("gpu{minor}/gi{gi}/ci0/access"),
                ] {
                    make(&format!("nvidia-caps/nvidia-cap{next}"), CAPS_MAJOR, next)?;
                    table.push_str(&format!("{line} {next}\n"));
                    next += 1;
                }
            }
        }
        std::fs::write(&self.mig_minors, table)?;
        for (i, name) in nics.iter().enumerate() {
            let verbs = format!("uverbs{i}");
            std::fs::create_dir_all(
                self.sysfs_root
                    .join("class/infiniband")
                    .join(name)
                    .join("device/infiniband_verbs")
                    .join(&verbs),
            )?;
            make(
                &format!("infiniband/{verbs}"),
                UVERBS_MAJOR,
                UVERBS_FIRST_MINOR + i as u64,
            )?;
        }
        if !nics.is_empty() {
            make("infiniband/rdma_cm", RDMA_CM.0, RDMA_CM.1)?;
        }
        Ok(())
    }
}

/// Where a host device file appears in a container: under `/dev` at its path relative to the
/// listing's device root.
pub fn container_path(host: &str, device_root: &str) -> String {
    match Path::new(host).strip_prefix(device_root) {
        Ok(relative) if !device_root.is_empty() => {
            Path::new("/dev").join(relative).display().to_string()
        }
        _ => host.to_owned(),
    }
}

/// The capability minors of GPU instance `gi` and its compute instance `ci` on the card with
/// device minor `card`, from the driver's `mig-minors` table.
pub fn mig_caps(table: &str, card: u32, gi: u32, ci: u32) -> Vec<u32> {
    let wanted = [
        format!("gpu{card}/gi{gi}/access"),
        format!("gpu{card}/gi{gi}/ci{ci}/access"),
    ];
    wanted
        .iter()
        .filter_map(|key| {
            table.lines().find_map(|line| {
                let (name, minor) = line.split_once(' ')?;
                (name == key).then(|| minor.trim().parse().ok()).flatten()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::testdir::TestDir;

    #[test]
    fn device_files_appear_under_dev_in_containers() {
        assert_eq!(
            container_path("/sim/dev/nvidia-caps/nvidia-cap3", "/sim/dev"),
            "/dev/nvidia-caps/nvidia-cap3"
        );
        assert_eq!(container_path("/dev/nvidia0", "/dev"), "/dev/nvidia0");
        assert_eq!(container_path("/elsewhere/x", "/sim/dev"), "/elsewhere/x");
        assert_eq!(container_path("/dev/nvidia0", ""), "/dev/nvidia0");
    }

    #[test]
    fn capability_minors_come_from_the_drivers_table() {
        let table =
            "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu1/gi1/access 30\n";
        assert_eq!(mig_caps(table, 0, 1, 0), [12, 13]);
        assert_eq!(mig_caps(table, 1, 1, 0), [30], "no compute-instance line");
        assert!(mig_caps(table, 0, 2, 0).is_empty());
    }

    #[test]
    fn stand_ins_are_listed_like_real_nodes() {
        let dir = TestDir::new("device-nodes");
        let nodes = DeviceNodes::stand_ins(dir.path(), 2);
        nodes
            .make_stand_ins(&["mlx5_0".to_owned()])
            .expect("mknod (needs root)");
        let mut listing = pb::ListDevicesResponse {
            devices: vec![pb::Device {
                index: 1,
                instances: vec![pb::Instance {
                    spec: Some(pb::InstanceSpec {
                        device_index: 1,
                        ..Default::default()
                    }),
                    mig: Some(pb::MigInstance {
                        gpu_instance_id: 2,
                        compute_instance_id: 0,
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            nics: vec![pb::Nic {
                name: "mlx5_0".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        nodes.fill_listing(&mut listing);
        let dev = dir.path().join("dev");
        let at = |r: &str| dev.join(r).display().to_string();
        assert_eq!(listing.devices[0].device_nodes, [at("nvidia1")]);
        assert_eq!(
            listing.control_nodes,
            [at("nvidiactl"), at("nvidia-uvm"), at("nvidia-uvm-tools")]
        );
        // Card minor 1 starts after card 0's 30 lines (3 + 30), GPU instance 2 is 4 lines in.
        assert_eq!(
            listing.devices[0].instances[0]
                .mig
                .as_ref()
                .map(|m| m.device_nodes.clone()),
            Some(vec![
                at("nvidia-caps/nvidia-cap37"),
                at("nvidia-caps/nvidia-cap38")
            ])
        );
        assert_eq!(
            listing.nics[0].device_nodes,
            [at("infiniband/uverbs0"), at("infiniband/rdma_cm")]
        );
        use std::os::unix::fs::FileTypeExt;
        let kind = std::fs::metadata(dev.join("nvidia1"))
            .expect("stat")
            .file_type();
        assert!(kind.is_char_device());
    }
}
