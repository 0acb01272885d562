//! The compute meter: measures each isolated container's share of SM time on the cards and
//! writes it into the container's isolation folder, where the isolation library's launch gates
//! steer by it (the files are described in `runtimekit-isolation-files`).
//!
//! The driver names processes by host PID. A process belongs to the container whose memory
//! ledger it maps, read from `/proc/<pid>/maps` and matched by device and inode: every process
//! the library runs in maps its ledger at its first CUDA call, and this needs neither the
//! container runtime's cgroup naming nor a container at all. Nothing is read from the cards
//! while no isolation folder exists, so a node without capped containers pays nothing.

use crate::backend::Backend;
use runtimekit_isolation_files::{self as files, Share};
use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Where the meter looks and how often.
#[derive(Debug, Clone)]
pub struct MeterOptions {
    /// `lj-runtime`'s `isolationStateDir`: one folder per container ID.
    pub state_dir: PathBuf,
    /// Where processes' maps are read (the host's `/proc`).
    pub proc_root: PathBuf,
    /// How often the shares are measured and written.
    pub interval: Duration,
}

/// A mapped file as `/proc/<pid>/maps` names it: device major, minor and inode.
type FileId = (u64, u64, u64);

/// The running meter; dropping it stops the thread after its current pass.
#[derive(Debug)]
pub struct Meter {
    stop: Arc<AtomicBool>,
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Starts the meter's thread.
pub fn spawn(backend: Arc<dyn Backend>, options: MeterOptions) -> std::io::Result<Meter> {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    std::thread::Builder::new()
        .name("compute-meter".into())
        .spawn(move || {
            let mut sequence = 0;
            while !stopped.load(Ordering::Relaxed) {
                sequence += 1;
                measure_once(backend.as_ref(), &options, sequence);
                std::thread::sleep(options.interval);
            }
        })?;
    Ok(Meter { stop })
}

/// One measurement: reads the cards' processes and writes every container folder's shares,
/// numbered `sequence`. Returns how many folders were written.
pub fn measure_once(backend: &dyn Backend, options: &MeterOptions, sequence: u64) -> usize {
    let folders = ledgers(&options.state_dir);
    if folders.is_empty() {
        return 0;
    }
    let devices = match backend.process_metrics() {
        Ok(answer) => answer.devices,
        Err(error) => {
            tracing::warn!(%error, "compute meter: the cards' processes cannot be read");
            return 0;
        }
    };
    let ids: Vec<FileId> = folders.keys().copied().collect();
    // A process on several cards is looked up once.
    let pids: BTreeSet<u32> = devices
        .iter()
        .flat_map(|d| d.processes.iter().map(|p| p.pid))
        .collect();
    let owner_of_pid = owners(pids.into_iter(), &options.proc_root, &ids);
    let measured = shares(&devices, &owner_of_pid, ids.len(), sequence);
    let mut written = 0;
    for (folder, lines) in folders.values().zip(measured) {
        match write_whole(folder, &files::render(&lines)) {
            Ok(()) => written += 1,
            // The container ended between the listing and now.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(folder = %folder.display(), %error, "compute meter: cannot write the shares");
            }
        }
    }
    written
}

/// The measurements folder of each container under `state_dir` whose ledger exists, by the
/// ledger's file ID. The ledger folder is the container's to write, so nothing there is
/// followed: a ledger that is not a plain file (a planted symlink) is skipped, and the shares
/// go only into the measurements folder, which is root's and read-only in the container.
fn ledgers(state_dir: &Path) -> BTreeMap<FileId, PathBuf> {
    let Ok(entries) = std::fs::read_dir(state_dir) else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let ledger = entry.path().join(files::LEDGER_FOLDER).join(files::LEDGER);
            let meta = std::fs::symlink_metadata(ledger).ok()?;
            let folder = entry.path().join(files::MEASURED_FOLDER);
            let measured = std::fs::symlink_metadata(&folder).ok()?;
            if !meta.file_type().is_file() || !measured.file_type().is_dir() {
                return None;
            }
            let device = meta.dev();
            Some((
                (
                    nix::sys::stat::major(device),
                    nix::sys::stat::minor(device),
                    meta.ino(),
                ),
                folder,
            ))
        })
        .collect()
}

/// The position in `ledgers` of the ledger each of `pids` maps, for those that map one.
fn owners(
    pids: impl Iterator<Item = u32>,
    proc_root: &Path,
    ledgers: &[FileId],
) -> BTreeMap<u32, usize> {
    pids.filter_map(|pid| {
        let maps = std::fs::read_to_string(proc_root.join(pid.to_string()).join("maps")).ok()?;
        let id = mapped_ledger(&maps, ledgers)?;
        Some((pid, ledgers.iter().position(|i| *i == id)?))
    })
    .collect()
}

/// Which of `ledgers` the process whose `/proc/<pid>/maps` is `maps` has mapped, if any.
fn mapped_ledger(maps: &str, ledgers: &[FileId]) -> Option<FileId> {
    maps.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let device = fields.nth(3)?;
        let inode: u64 = fields.next()?.parse().ok()?;
        let path = fields.next()?;
        if inode == 0 || !path.ends_with(&format!("/{}", files::LEDGER)) {
            return None;
        }
        let (major, minor) = device.split_once(':')?;
        let id = (
            u64::from_str_radix(major, 16).ok()?,
            u64::from_str_radix(minor, 16).ok()?,
            inode,
        );
        ledgers.contains(&id).then_some(id)
    })
}

/// Each of `containers` containers' shares of each card: its own processes' SM time, and
/// everyone else's (the other processes', or the card's busy time not its own when that is
/// more: processes the driver does not list still take the card), together at most the card. `owner_of_pid` maps a PID
/// to its container's position. A card the driver gives no per-process reading is left out:
/// an unknown share must not move a gate.
pub fn shares(
    devices: &[pb::DeviceMetrics],
    owner_of_pid: &BTreeMap<u32, usize>,
    containers: usize,
    sequence: u64,
) -> Vec<Vec<Share>> {
    let mut out = vec![Vec::new(); containers];
    for device in devices {
        let measured = !device.processes.is_empty()
            && device.processes.iter().all(|p| p.sm_util_percent.is_some());
        if !measured && (!device.processes.is_empty() || device.gpu_util_percent.is_none()) {
            continue;
        }
        let mut by_container = vec![0u32; containers];
        let mut total = 0u32;
        for process in &device.processes {
            let util = process.sm_util_percent.unwrap_or(0);
            total = total.saturating_add(util);
            if let Some(slot) = owner_of_pid
                .get(&process.pid)
                .and_then(|c| by_container.get_mut(*c))
            {
                *slot = slot.saturating_add(util);
            }
        }
        let card = device.gpu_util_percent.unwrap_or(0);
        for (mine, lines) in by_container.into_iter().zip(out.iter_mut()) {
            let others = (total - mine).max(card.saturating_sub(mine));
            // Time-sliced processes' readings overlap (the driver counts both across a
            // switch) and can add up to more than the card: scale them back to it.
            let scale = 100.0_f64.max(f64::from(mine) + f64::from(others));
            lines.push(Share {
                uuid: device.device_uuid.clone(),
                mine: f64::from(mine) / scale,
                others: f64::from(others) / scale,
                sequence,
            });
        }
    }
    out
}

/// Replaces `folder`'s shares file whole, so a reader never sees half of it.
fn write_whole(folder: &Path, text: &str) -> std::io::Result<()> {
    let temp = folder.join(format!(".{}.new", files::SHARES));
    std::fs::write(&temp, text)?;
    std::fs::rename(&temp, folder.join(files::SHARES))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(pid: u32, util: Option<u32>) -> pb::ProcessMetrics {
        pb::ProcessMetrics {
            pid,
            sm_util_percent: util,
            ..pb::ProcessMetrics::default()
        }
    }

    fn card(
        uuid: &str,
        util: Option<u32>,
        processes: Vec<pb::ProcessMetrics>,
    ) -> pb::DeviceMetrics {
        pb::DeviceMetrics {
            device_uuid: uuid.into(),
            gpu_util_percent: util,
            processes,
            ..pb::DeviceMetrics::default()
        }
    }

    #[test]
    fn each_container_gets_its_own_time_and_everyone_elses() {
        let devices = [card(
            "GPU-a",
            Some(95),
            vec![
                process(10, Some(30)),
                process(11, Some(5)),
                process(20, Some(60)),
                process(30, Some(0)),
            ],
        )];
        let owners = BTreeMap::from([(10, 0), (11, 0), (20, 1)]);
        let got = shares(&devices, &owners, 2, 7);
        let pair = |s: &Share| (s.uuid.clone(), s.mine, s.others, s.sequence);
        assert_eq!(pair(&got[0][0]), ("GPU-a".into(), 0.35, 0.6, 7));
        assert_eq!(pair(&got[1][0]), ("GPU-a".into(), 0.6, 0.35, 7));
    }

    #[test]
    fn busy_time_no_process_accounts_for_counts_as_others() {
        // The driver lists only the container's process, but the card is busy 90 %.
        let devices = [card("GPU-a", Some(90), vec![process(10, Some(30))])];
        let got = shares(&devices, &BTreeMap::from([(10, 0)]), 1, 1);
        assert_eq!((got[0][0].mine, got[0][0].others), (0.3, 0.6));
    }

    #[test]
    fn an_idle_card_reads_zero_and_an_unmeasured_one_is_left_out() {
        let devices = [
            card("GPU-idle", Some(0), vec![]),
            card("GPU-blind", Some(50), vec![process(10, None)]),
            card("GPU-unknown", None, vec![]),
        ];
        let got = shares(&devices, &BTreeMap::from([(10, 0)]), 1, 1);
        let cards: Vec<(&str, f64, f64)> = got[0]
            .iter()
            .map(|s| (s.uuid.as_str(), s.mine, s.others))
            .collect();
        assert_eq!(cards, vec![("GPU-idle", 0.0, 0.0)]);
    }

    #[test]
    fn overlapping_readings_are_scaled_back_to_the_card() {
        // As an H200 read two time-sliced processes: 33 % and 71 %.
        let devices = [card(
            "GPU-a",
            Some(100),
            vec![process(10, Some(33)), process(20, Some(71))],
        )];
        let got = shares(&devices, &BTreeMap::from([(10, 0)]), 1, 1);
        let (mine, others) = (got[0][0].mine, got[0][0].others);
        assert!((mine + others - 1.0).abs() < 1e-9, "{mine} {others}");
        assert!(
            (mine / others - 33.0 / 71.0).abs() < 1e-9,
            "{mine} {others}"
        );
        let devices = [card(
            "GPU-a",
            Some(100),
            vec![
                process(10, Some(100)),
                process(11, Some(100)),
                process(12, Some(100)),
            ],
        )];
        let got = shares(&devices, &BTreeMap::from([(10, 0), (11, 0)]), 1, 1);
        assert!((got[0][0].mine - 2.0 / 3.0).abs() < 1e-9, "{:?}", got[0][0]);
    }

    #[test]
    fn the_ledger_is_found_in_a_maps_file_by_device_and_inode() {
        let maps = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 fd:01 1311 /usr/bin/probe
7f1c2a000000-7f1c2a100000 rw-s 00000000 00:1a 4242 /run/runtimekit/isolation/ledger
7f1c2b000000-7f1c2b001000 rw-s 00000000 00:1b 4242 /other/ledger
7ffd1b5e0000-7ffd1b601000 rw-p 00000000 00:00 0 [stack]
";
        assert_eq!(
            mapped_ledger(maps, &[(0, 0x1a, 4242)]),
            Some((0, 0x1a, 4242))
        );
        assert_eq!(
            mapped_ledger(maps, &[(0, 0x1b, 4242)]),
            Some((0, 0x1b, 4242))
        );
        assert_eq!(
            mapped_ledger(maps, &[(0, 0x1a, 4243)]),
            None,
            "another inode"
        );
        assert_eq!(
            mapped_ledger(maps, &[(0, 0x1c, 4242)]),
            None,
            "another device"
        );
        assert_eq!(mapped_ledger("garbage\n\n1 2 3\n", &[(0, 0, 0)]), None);
    }

    /// A state folder with container folders `ids`, each holding a ledger file and a
    /// measurements folder, as lj-runtime makes them.
    fn state_dir(name: &str, ids: &[&str]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("meter-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for id in ids {
            let folder = dir.join(id).join(files::LEDGER_FOLDER);
            std::fs::create_dir_all(&folder).expect("folder");
            std::fs::create_dir_all(dir.join(id).join(files::MEASURED_FOLDER)).expect("folder");
            std::fs::write(folder.join(files::LEDGER), [0u8; 4096]).expect("ledger");
        }
        dir
    }

    #[test]
    fn a_process_mapping_a_ledger_belongs_to_its_container() {
        let dir = state_dir("owners", &["aaa", "bbb"]);
        // A process maps the files it runs: `sleep`, copied over bbb's ledger, maps it.
        let ledger = dir
            .join("bbb")
            .join(files::LEDGER_FOLDER)
            .join(files::LEDGER);
        let sleep = ["/bin/sleep", "/usr/bin/sleep"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("sleep");
        std::fs::copy(sleep, &ledger).expect("copy");
        let found = ledgers(&dir);
        assert_eq!(found.len(), 2);
        let (ids, folders): (Vec<FileId>, Vec<PathBuf>) = found.into_iter().unzip();
        let mut child = std::process::Command::new(&ledger)
            .arg("30")
            .spawn()
            .expect("run");
        let pid = child.id();
        // Until the child has exec'd, its maps are the test's.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut got = BTreeMap::new();
        while got.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            got = owners(
                [pid, std::process::id()].into_iter(),
                Path::new("/proc"),
                &ids,
            );
        }
        let _ = child.kill();
        let _ = child.wait();
        let folder = got.get(&pid).map(|c| folders[*c].clone());
        assert_eq!(folder, Some(dir.join("bbb").join(files::MEASURED_FOLDER)));
        assert_eq!(got.len(), 1, "{got:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_meter_writes_every_folder_and_reads_nothing_without_one() {
        let backend =
            crate::sim::SimulatedBackend::from_profile("h800-8", crate::sim::SimOptions::default())
                .expect("profile");
        let empty = state_dir("none", &[]);
        fn options(state_dir: &Path) -> MeterOptions {
            MeterOptions {
                state_dir: state_dir.to_path_buf(),
                proc_root: PathBuf::from("/proc"),
                interval: Duration::from_secs(1),
            }
        }
        assert_eq!(measure_once(&backend, &options(&empty), 1), 0);
        let dir = state_dir("write", &["aaa", "bbb"]);
        assert_eq!(measure_once(&backend, &options(&dir), 3), 2);
        for id in ["aaa", "bbb"] {
            let text = std::fs::read_to_string(
                dir.join(id)
                    .join(files::MEASURED_FOLDER)
                    .join(files::SHARES),
            )
            .expect("shares written");
            let read = files::parse(&text);
            assert_eq!(read.len(), 8, "one line per card: {text}");
            assert!(
                read.iter().all(|s| s.sequence == 3 && s.mine == 0.0),
                "{text}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&empty);
    }

    #[test]
    fn nothing_the_container_plants_is_followed() {
        let dir = state_dir("planted", &["aaa", "bbb", "ccc"]);
        let target = dir.join("host-file");
        std::fs::write(&target, "the host's").expect("write");
        // aaa's ledger is a symlink to a host file; bbb's measurements folder is a symlink
        // into its own writable ledger folder.
        let aaa = dir
            .join("aaa")
            .join(files::LEDGER_FOLDER)
            .join(files::LEDGER);
        std::fs::remove_file(&aaa).expect("remove");
        std::os::unix::fs::symlink(&target, &aaa).expect("link");
        let bbb = dir.join("bbb").join(files::MEASURED_FOLDER);
        std::fs::remove_dir(&bbb).expect("remove");
        std::os::unix::fs::symlink(dir.join("bbb").join(files::LEDGER_FOLDER), &bbb).expect("link");
        let found: Vec<PathBuf> = ledgers(&dir).into_values().collect();
        assert_eq!(found, vec![dir.join("ccc").join(files::MEASURED_FOLDER)]);
        assert_eq!(
            std::fs::read_to_string(&target).expect("read"),
            "the host's"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
