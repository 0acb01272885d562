//! What Linux sysfs says about PCI devices and RDMA NICs: PCIe bridges above a device, its NUMA
//! node, the CPU socket of a NUMA node, and the RDMA NICs with their network interface. The root
//! is a parameter (`/sys` in production, a fake tree in tests).

use crate::topology::{parse_cpulist, pcie_switch_name};
use runtimekit_proto::resource::v1alpha1::Nic;
use std::fs;
use std::path::{Path, PathBuf};

/// A sysfs tree.
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Self::new("/sys")
    }
}

/// Where a PCI device sits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PciPlace {
    /// PCI bridges from the root port down, the device excluded.
    pub bridges: Vec<String>,
    pub pcie_switch: Option<String>,
    pub numa_node: Option<u32>,
    pub socket: Option<u32>,
}

/// `00000000:18:00.0` (NVML) or `0000:18:00.0` to the sysfs form `0000:18:00.0`, lower case.
pub fn sysfs_bus_id(bus_id: &str) -> String {
    let lower = bus_id.trim().to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) => match u32::from_str_radix(domain, 16) {
            Ok(d) => format!("{d:04x}:{rest}"),
            Err(_) => lower,
        },
        None => lower,
    }
}

/// Whether a path component is a PCI address (`0000:00:01.0`).
fn is_pci_address(s: &str) -> bool {
    let parts: Vec<&str> = s.split([':', '.']).collect();
    parts.len() == 4
        && [4, 2, 2, 1]
            .iter()
            .zip(&parts)
            .all(|(n, p)| p.len() == *n && p.chars().all(|c| c.is_ascii_hexdigit()))
}

impl Sysfs {
    /// A sysfs tree rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn read(&self, path: impl AsRef<Path>) -> Option<String> {
        fs::read_to_string(self.root.join(path))
            .ok()
            .map(|s| s.trim().to_string())
    }

    /// Where the PCI device with this bus ID sits; empty when sysfs does not know it.
    pub fn pci_place(&self, bus_id: &str) -> PciPlace {
        let link = self.root.join("bus/pci/devices").join(sysfs_bus_id(bus_id));
        self.place_of(&link)
    }

    fn place_of(&self, device_dir: &Path) -> PciPlace {
        let Ok(real) = fs::canonicalize(device_dir) else {
            return PciPlace::default();
        };
        let mut chain: Vec<String> = real
            .components()
            .filter_map(|c| c.as_os_str().to_str())
            .filter(|c| is_pci_address(c))
            .map(str::to_string)
            .collect();
        chain.pop();
        let numa_node = fs::read_to_string(real.join("numa_node"))
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .and_then(|n| u32::try_from(n).ok());
        PciPlace {
            pcie_switch: pcie_switch_name(&chain),
            bridges: chain,
            numa_node,
            socket: numa_node.and_then(|n| self.socket_of_numa(n)),
        }
    }

    /// The CPUs of a NUMA node, as a cpulist.
    pub fn numa_cpulist(&self, node: u32) -> Option<String> {
        self.read(format!("devices/system/node/node{node}/cpulist"))
    }

    /// The CPU socket (physical package) of a NUMA node's first CPU.
    pub fn socket_of_numa(&self, node: u32) -> Option<u32> {
        let cpus = parse_cpulist(&self.numa_cpulist(node)?)?;
        self.socket_of_cpu(*cpus.first()?)
    }

    /// The CPU socket of a CPU.
    pub fn socket_of_cpu(&self, cpu: u32) -> Option<u32> {
        self.read(format!(
            "devices/system/cpu/cpu{cpu}/topology/physical_package_id"
        ))?
        .parse()
        .ok()
    }

    /// The RDMA NICs (`/sys/class/infiniband`), sorted by name.
    pub fn rdma_nics(&self) -> Vec<Nic> {
        let class = self.root.join("class/infiniband");
        let Ok(entries) = fs::read_dir(&class) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        names
            .into_iter()
            .map(|name| {
                let device = class.join(&name).join("device");
                let place = self.place_of(&device);
                let pci_bus_id = fs::canonicalize(&device)
                    .ok()
                    .and_then(|p| p.file_name()?.to_str().map(str::to_string))
                    .unwrap_or_default();
                let netdev = fs::read_dir(device.join("net"))
                    .ok()
                    .and_then(|mut d| d.find_map(Result::ok))
                    .and_then(|e| e.file_name().into_string().ok())
                    .unwrap_or_default();
                let link_layer = self
                    .read(format!("class/infiniband/{name}/ports/1/link_layer"))
                    .unwrap_or_default();
                Nic {
                    name,
                    pci_bus_id,
                    pcie_switch: place.pcie_switch.unwrap_or_default(),
                    numa_node: place.numa_node,
                    socket: place.socket,
                    netdev,
                    link_layer,
                    device_nodes: Vec::new(),
                }
            })
            .collect()
    }

    /// Whether a process exists (host PID namespace).
    pub fn process_alive(pid: u32) -> bool {
        Path::new("/proc").join(pid.to_string()).exists()
    }
}

/// The inode of the host's (initial) PID namespace, fixed by the kernel (`PROC_PID_INIT_INO`).
const HOST_PID_NAMESPACE: &str = "pid:[4026531836]";

/// Why the driver's process IDs cannot be looked up in this process's `/proc`, given the link
/// `/proc/self/ns/pid` (`link`): `None` in the host PID namespace, where they can.
pub fn pids_not_comparable(link: &Path) -> Option<String> {
    match fs::read_link(link) {
        Ok(target) if target.as_os_str() == HOST_PID_NAMESPACE => None,
        Ok(target) => Some(format!(
            "the resource layer runs in PID namespace {} and NVML reports host PIDs (run it with hostPID)",
            target.display()
        )),
        Err(e) => Some(format!("cannot read {}: {e}", link.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::testdir::TestDir;
    use std::os::unix::fs::symlink;

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        fs::write(path, text).expect("write");
    }

    /// A fake sysfs: one root port with a switch holding a GPU and a NIC, a GPU right under
    /// another root port, two NUMA nodes on two sockets.
    fn fake() -> TestDir {
        let dir = TestDir::new("sysfs");
        let root = dir.path();
        let switch = root.join("devices/pci0000:00/0000:00:01.0/0000:01:00.0");
        let gpu = switch.join("0000:02:00.0/0000:03:00.0");
        let nic = switch.join("0000:02:01.0/0000:04:00.0");
        let lone = root.join("devices/pci0000:80/0000:80:01.0/0000:81:00.0");
        write(&gpu.join("numa_node"), "1\n");
        write(&nic.join("numa_node"), "1\n");
        write(&lone.join("numa_node"), "-1\n");
        fs::create_dir_all(nic.join("net/ib0")).expect("netdev");
        fs::create_dir_all(root.join("bus/pci/devices")).expect("bus");
        symlink(&gpu, root.join("bus/pci/devices/0000:03:00.0")).expect("link");
        symlink(&lone, root.join("bus/pci/devices/0000:81:00.0")).expect("link");
        fs::create_dir_all(root.join("class/infiniband/mlx5_0")).expect("ib");
        symlink(&nic, root.join("class/infiniband/mlx5_0/device")).expect("link");
        write(
            &root.join("class/infiniband/mlx5_0/ports/1/link_layer"),
            "InfiniBand\n",
        );
        write(&root.join("devices/system/node/node0/cpulist"), "0-3\n");
        write(&root.join("devices/system/node/node1/cpulist"), "4-7\n");
        for cpu in 0..8 {
            write(
                &root.join(format!(
                    "devices/system/cpu/cpu{cpu}/topology/physical_package_id"
                )),
                if cpu < 4 { "0\n" } else { "1\n" },
            );
        }
        dir
    }

    #[test]
    fn bus_ids_are_normalised() {
        assert_eq!(sysfs_bus_id("00000000:18:00.0"), "0000:18:00.0");
        assert_eq!(sysfs_bus_id("00000001:AB:00.0"), "0001:ab:00.0");
        assert_eq!(sysfs_bus_id("0000:18:00.0"), "0000:18:00.0");
        assert!(is_pci_address("0000:00:01.0"));
        assert!(!is_pci_address("pci0000:00"));
    }

    #[test]
    fn gpu_under_a_switch_with_numa_and_socket() {
        let dir = fake();
        let sys = Sysfs::new(dir.path());
        let place = sys.pci_place("00000000:03:00.0");
        assert_eq!(
            place.bridges,
            ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0"]
        );
        assert_eq!(place.pcie_switch.as_deref(), Some("pcie-0000:01:00.0"));
        assert_eq!(place.numa_node, Some(1));
        assert_eq!(place.socket, Some(1));
        assert_eq!(sys.socket_of_numa(0), Some(0));
        let lone = sys.pci_place("00000000:81:00.0");
        assert_eq!(lone.pcie_switch, None);
        assert_eq!(lone.numa_node, None);
        assert_eq!(sys.pci_place("00000000:99:00.0"), PciPlace::default());
    }

    #[test]
    fn nics_share_the_gpu_switch_name() {
        let dir = fake();
        let sys = Sysfs::new(dir.path());
        let nics = sys.rdma_nics();
        assert_eq!(nics.len(), 1);
        let nic = &nics[0];
        assert_eq!(nic.name, "mlx5_0");
        assert_eq!(nic.pci_bus_id, "0000:04:00.0");
        assert_eq!(nic.pcie_switch, "pcie-0000:01:00.0");
        assert_eq!(nic.numa_node, Some(1));
        assert_eq!(nic.socket, Some(1));
        assert_eq!(nic.netdev, "ib0");
        assert_eq!(nic.link_layer, "InfiniBand");
        assert!(Sysfs::new("/nonexistent").rdma_nics().is_empty());
    }

    #[test]
    fn this_process_is_alive() {
        assert!(Sysfs::process_alive(std::process::id()));
        assert!(!Sysfs::process_alive(u32::MAX));
    }

    #[test]
    fn pids_compare_only_in_the_host_pid_namespace() {
        let dir = TestDir::new("pidns");
        let host = dir.path().join("host");
        symlink(HOST_PID_NAMESPACE, &host).expect("link");
        assert_eq!(pids_not_comparable(&host), None);
        let pod = dir.path().join("pod");
        symlink("pid:[4026532271]", &pod).expect("link");
        let why = pids_not_comparable(&pod).expect("a pod's namespace");
        assert!(
            why.contains("4026532271") && why.contains("hostPID"),
            "{why}"
        );
        assert!(pids_not_comparable(&dir.path().join("missing")).is_some());
    }
}
