//! Topology arithmetic shared by the backends, free of I/O: CPU lists, PCIe switch naming,
//! peer-link counting between cards, and interconnect groups.

use runtimekit_proto::resource::v1alpha1::{DevicePath, Link, LinkKind, LinkRemote};
use std::collections::BTreeMap;

/// A Linux cpulist (`0-3,8,10-11`) of the CPUs whose bits are set in a CPU mask (word `i`
/// holds CPUs `64 i` to `64 i + 63`).
pub fn cpulist_from_mask<W: Copy + Into<u64>>(words: &[W]) -> String {
    let cpus = words.iter().enumerate().flat_map(|(w, &bits)| {
        let bits: u64 = bits.into();
        (0..64u32)
            .filter(move |b| bits & (1u64 << b) != 0)
            .map(move |b| u32::try_from(w).unwrap_or(u32::MAX).saturating_mul(64) + b)
    });
    cpulist(cpus)
}

/// A Linux cpulist of increasing CPU numbers.
pub fn cpulist(cpus: impl IntoIterator<Item = u32>) -> String {
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for cpu in cpus {
        match ranges.last_mut() {
            Some((_, end)) if *end + 1 == cpu => *end = cpu,
            _ => ranges.push((cpu, cpu)),
        }
    }
    ranges
        .iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The CPUs of a Linux cpulist; `None` when it does not parse.
pub fn parse_cpulist(list: &str) -> Option<Vec<u32>> {
    let list = list.trim();
    if list.is_empty() {
        return Some(Vec::new());
    }
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if a > b {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    Some(cpus)
}

/// The name of the PCIe switch a device sits under, from the PCI bridges between the root
/// complex and the device (root port first, the device itself excluded). A device right under
/// a root port has no switch. Under a switch, the name is the switch's upstream port below
/// the root port, so devices under nested switches of one top-level switch share a name: they
/// talk without crossing a host bridge (PIX or PXB), which is what GPU/NIC affinity needs.
pub fn pcie_switch_name(bridges: &[String]) -> Option<String> {
    // Root port, then at least the switch's upstream and downstream ports.
    (bridges.len() >= 3).then(|| format!("pcie-{}", bridges[1]))
}

/// The peer links of one card, for [`peer_links`].
#[derive(Debug, Clone, Default)]
pub struct CardLinks {
    pub index: u32,
    pub links: Vec<Link>,
}

/// Peer links usable between every two cards, as (a, b) -> (links, kind, via switch): direct
/// links between them, plus, when both have active links to a switch, the switch links of the
/// one with fewer (an NVSwitch fabric gives every pair that bandwidth).
pub fn peer_links(cards: &[CardLinks]) -> BTreeMap<(u32, u32), (u32, LinkKind, bool)> {
    let mut out = BTreeMap::new();
    fn active(c: &CardLinks, remote: LinkRemote) -> Vec<&Link> {
        c.links
            .iter()
            .filter(|l| l.active && l.remote() == remote)
            .collect()
    }
    for (i, a) in cards.iter().enumerate() {
        for b in &cards[i + 1..] {
            let (lo, hi) = if a.index < b.index { (a, b) } else { (b, a) };
            let direct: Vec<&Link> = active(lo, LinkRemote::Device)
                .into_iter()
                .filter(|l| l.remote_device_index == Some(hi.index))
                .collect();
            let switch_lo = active(lo, LinkRemote::Switch);
            let switch_hi = active(hi, LinkRemote::Switch);
            let via_switch = u32::try_from(switch_lo.len().min(switch_hi.len())).unwrap_or(0);
            let total = u32::try_from(direct.len()).unwrap_or(0) + via_switch;
            if total == 0 {
                continue;
            }
            let kind = direct
                .first()
                .or(switch_lo.first())
                .map_or(LinkKind::Unspecified, |l| l.kind());
            out.insert((lo.index, hi.index), (total, kind, via_switch > 0));
        }
    }
    out
}

/// Fills the peer-link fields of the paths from [`peer_links`].
pub fn apply_peer_links(paths: &mut [DevicePath], cards: &[CardLinks]) {
    let links = peer_links(cards);
    for path in paths {
        if let Some(&(count, kind, via_switch)) = links.get(&(path.a, path.b)) {
            path.links = count;
            path.set_link_kind(kind);
            path.via_switch = via_switch;
        }
    }
}

/// Interconnect groups: cards joined by peer links, transitively, get `<prefix>-<n>` (groups
/// numbered by their lowest card); cards with no peer link get no group.
pub fn link_groups(indexes: &[u32], paths: &[DevicePath], prefix: &str) -> BTreeMap<u32, String> {
    let mut parent: BTreeMap<u32, u32> = indexes.iter().map(|&i| (i, i)).collect();
    fn root(parent: &BTreeMap<u32, u32>, mut i: u32) -> u32 {
        while let Some(&p) = parent.get(&i) {
            if p == i {
                break;
            }
            i = p;
        }
        i
    }
    for path in paths.iter().filter(|p| p.links > 0) {
        let (ra, rb) = (root(&parent, path.a), root(&parent, path.b));
        if ra != rb {
            parent.insert(ra.max(rb), ra.min(rb));
        }
    }
    let linked: Vec<u32> = paths
        .iter()
        .filter(|p| p.links > 0)
        .flat_map(|p| [p.a, p.b])
        .collect();
    let mut roots: Vec<u32> = indexes
        .iter()
        .filter(|i| linked.contains(i))
        .map(|&i| root(&parent, i))
        .collect();
    roots.sort_unstable();
    roots.dedup();
    indexes
        .iter()
        .filter(|i| linked.contains(i))
        .filter_map(|&i| {
            let r = root(&parent, i);
            let n = roots.iter().position(|&x| x == r)?;
            Some((i, format!("{prefix}-{n}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(n: u32, remote: LinkRemote, peer: Option<u32>) -> Link {
        let mut l = Link {
            link: n,
            active: true,
            remote_device_index: peer,
            ..Default::default()
        };
        l.set_kind(LinkKind::Nvlink);
        l.set_remote(remote);
        l
    }

    #[test]
    fn cpulists_round_trip() {
        assert_eq!(cpulist([0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpulist([]), "");
        assert_eq!(cpulist_from_mask(&[0b1111u64, 1]), "0-3,64");
        assert_eq!(cpulist_from_mask(&[u64::MAX, u64::MAX]), "0-127");
        assert_eq!(
            parse_cpulist("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("x"), None);
    }

    #[test]
    fn switch_name_needs_a_switch() {
        let chain = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(pcie_switch_name(&chain(&["0000:00:01.0"])), None);
        assert_eq!(
            pcie_switch_name(&chain(&["0000:00:01.0", "0000:01:00.0", "0000:02:00.0"])),
            Some("pcie-0000:01:00.0".into())
        );
        // Nested switches share the top-level name.
        assert_eq!(
            pcie_switch_name(&chain(&[
                "0000:00:01.0",
                "0000:01:00.0",
                "0000:02:04.0",
                "0000:05:00.0",
                "0000:06:00.0"
            ])),
            Some("pcie-0000:01:00.0".into())
        );
    }

    #[test]
    fn nvswitch_gives_every_pair_the_smaller_link_count() {
        let cards: Vec<CardLinks> = (0..3)
            .map(|i| CardLinks {
                index: i,
                links: (0..if i == 2 { 4 } else { 8 })
                    .map(|n| link(n, LinkRemote::Switch, None))
                    .collect(),
            })
            .collect();
        let links = peer_links(&cards);
        assert_eq!(links.get(&(0, 1)), Some(&(8, LinkKind::Nvlink, true)));
        assert_eq!(links.get(&(0, 2)), Some(&(4, LinkKind::Nvlink, true)));
        assert_eq!(links.len(), 3);
    }

    #[test]
    fn direct_links_are_counted_per_pair_and_groups_follow() {
        // 0=1 with two links, 2-3 with one, 4 alone.
        let cards = vec![
            CardLinks {
                index: 0,
                links: vec![
                    link(0, LinkRemote::Device, Some(1)),
                    link(1, LinkRemote::Device, Some(1)),
                ],
            },
            CardLinks {
                index: 1,
                links: vec![
                    link(0, LinkRemote::Device, Some(0)),
                    link(1, LinkRemote::Device, Some(0)),
                ],
            },
            CardLinks {
                index: 2,
                links: vec![link(0, LinkRemote::Device, Some(3))],
            },
            CardLinks {
                index: 3,
                links: vec![link(0, LinkRemote::Device, Some(2))],
            },
            CardLinks {
                index: 4,
                links: vec![],
            },
        ];
        let mut paths: Vec<DevicePath> = (0..5u32)
            .flat_map(|a| {
                (a + 1..5).map(move |b| DevicePath {
                    a,
                    b,
                    ..Default::default()
                })
            })
            .collect();
        apply_peer_links(&mut paths, &cards);
        let count = |a, b| paths.iter().find(|p| p.a == a && p.b == b).map(|p| p.links);
        assert_eq!(count(0, 1), Some(2));
        assert_eq!(count(2, 3), Some(1));
        assert_eq!(count(0, 2), Some(0));
        let groups = link_groups(&[0, 1, 2, 3, 4], &paths, "nvlink");
        assert_eq!(groups.get(&0).map(String::as_str), Some("nvlink-0"));
        assert_eq!(groups.get(&1).map(String::as_str), Some("nvlink-0"));
        assert_eq!(groups.get(&3).map(String::as_str), Some("nvlink-1"));
        assert_eq!(groups.get(&4), None);
    }
}
