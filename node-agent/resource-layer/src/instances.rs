//! Instances as the backends keep them, and the rules every backend shares: request checks,
//! idempotent creation by key, adoption of unkeyed MIG instances, and the MIG placement rules
//! of `runtimekit_contract::mig`.

use crate::error::LayerError;
use runtimekit_contract::mig::{MigProfile, MigTable, Placement};
use runtimekit_proto::resource::v1alpha1 as pb;
use serde::{Deserialize, Serialize};

/// The longest instance key (a Kubernetes object name).
pub const MAX_KEY_LEN: usize = 253;

/// What an instance is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ShareSpec {
    /// A time-division share; 0 means no cap.
    #[serde(rename_all = "camelCase")]
    Tdm { core_percent: u32, memory_mib: u64 },
    /// A MIG instance of a profile at a placement start.
    #[serde(rename_all = "camelCase")]
    Mig { profile: String, start: u8 },
}

impl std::fmt::Display for ShareSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tdm {
                core_percent,
                memory_mib,
            } => write!(f, "TDM core {core_percent}% memory {memory_mib} MiB"),
            Self::Mig { profile, start } => write!(f, "MIG {profile} at {start}"),
        }
    }
}

/// The hardware identity of a MIG instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigIds {
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// `MIG-<uuid>`, when known.
    pub device_uuid: String,
    /// The GPU instance has no compute instance (nothing can run in it yet).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_compute_instance: bool,
}

/// One instance on one card.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRecord {
    /// The caller's key; `None` for an instance found on the card that no key owns.
    pub key: Option<String>,
    pub device_index: u32,
    pub device_uuid: String,
    pub spec: ShareSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigIds>,
    pub created_unix_ms: u64,
}

impl InstanceRecord {
    /// The memory slices a MIG instance occupies, given its card's table.
    pub fn placement(&self, table: &MigTable) -> Option<Placement> {
        let ShareSpec::Mig { profile, start } = &self.spec else {
            return None;
        };
        let profile = table.profile(profile)?;
        Some(Placement {
            start: *start,
            memory_slices: profile.memory_slices,
        })
    }

    /// Whether the record is keyed and its key is among `keys` (any key when `keys` is empty).
    pub fn keyed_among(&self, keys: &[String]) -> bool {
        self.key
            .as_ref()
            .is_some_and(|k| keys.is_empty() || keys.contains(k))
    }

    /// A short description for error messages.
    pub fn describe(&self) -> String {
        match &self.key {
            Some(key) => format!("instance {key} ({})", self.spec),
            None => format!("an unkeyed instance ({})", self.spec),
        }
    }

    /// The instance on the wire. `profiles` are the MIG profiles of its card as the card
    /// reports them; the record's own gives its memory, compute slices and multiprocessors.
    pub fn to_proto(&self, profiles: &[pb::MigProfileInfo]) -> pb::Instance {
        let mig_profile = match &self.spec {
            ShareSpec::Mig { profile, .. } => profiles.iter().find(|p| &p.name == profile),
            ShareSpec::Tdm { .. } => None,
        };
        let (kind, spec_kind) = match &self.spec {
            ShareSpec::Tdm {
                core_percent,
                memory_mib,
            } => (
                pb::InstanceKind::Tdm,
                pb::instance_spec::Kind::Tdm(pb::TdmSpec {
                    core_percent: *core_percent,
                    memory_mib: *memory_mib,
                }),
            ),
            ShareSpec::Mig { profile, start } => (
                pb::InstanceKind::Mig,
                pb::instance_spec::Kind::Mig(pb::MigSpec {
                    profile: profile.clone(),
                    placement_start: u32::from(*start),
                }),
            ),
        };
        let mig = self.mig.as_ref().map(|ids| pb::MigInstance {
            gpu_instance_id: ids.gpu_instance_id,
            compute_instance_id: ids.compute_instance_id,
            device_uuid: ids.device_uuid.clone(),
            memory_mib: mig_profile.map_or(0, |p| p.memory_mib),
            compute_slices: mig_profile.map_or(0, |p| p.slices),
            memory_slices: mig_profile.map_or(0, |p| p.memory_slices),
            multiprocessors: mig_profile.map_or(0, |p| p.multiprocessors),
            device_nodes: Vec::new(),
            no_compute_instance: ids.no_compute_instance,
        });
        pb::Instance {
            key: self.key.clone().unwrap_or_default(),
            spec: Some(pb::InstanceSpec {
                device_index: self.device_index,
                device_uuid: self.device_uuid.clone(),
                kind: Some(spec_kind),
            }),
            kind: kind.into(),
            mig,
            created_unix_ms: self.created_unix_ms,
        }
    }
}

/// A checked create request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateRequest {
    pub key: String,
    pub device_index: u32,
    /// The UUID the caller expects at the index, if it said.
    pub device_uuid: Option<String>,
    pub spec: ShareSpec,
}

impl CreateRequest {
    /// Checks a create request from the wire (the parts that need no card).
    pub fn from_proto(request: pb::CreateInstanceRequest) -> Result<Self, LayerError> {
        let key = request.key;
        check_key(&key)?;
        let Some(spec) = request.spec else {
            return Err(LayerError::InvalidArgument(format!(
                "instance {key}: spec is missing"
            )));
        };
        let spec_kind = match spec.kind {
            Some(pb::instance_spec::Kind::Tdm(tdm)) => {
                if tdm.core_percent > 100 {
                    return Err(LayerError::InvalidArgument(format!(
                        "instance {key}: core percent must be 0-100, not {}",
                        tdm.core_percent
                    )));
                }
                ShareSpec::Tdm {
                    core_percent: tdm.core_percent,
                    memory_mib: tdm.memory_mib,
                }
            }
            Some(pb::instance_spec::Kind::Mig(mig)) => {
                if mig.profile.is_empty() {
                    return Err(LayerError::InvalidArgument(format!(
                        "instance {key}: MIG profile is missing"
                    )));
                }
                let start = u8::try_from(mig.placement_start)
                    .ok()
                    .filter(|s| *s < 8)
                    .ok_or_else(|| {
                        LayerError::InvalidArgument(format!(
                            "instance {key}: placement start {} is not a memory slice (0-7)",
                            mig.placement_start
                        ))
                    })?;
                ShareSpec::Mig {
                    profile: mig.profile,
                    start,
                }
            }
            None => {
                return Err(LayerError::InvalidArgument(format!(
                    "instance {key}: spec says neither tdm nor mig"
                )));
            }
        };
        Ok(Self {
            key,
            device_index: spec.device_index,
            device_uuid: (!spec.device_uuid.is_empty()).then_some(spec.device_uuid),
            spec: spec_kind,
        })
    }
}

/// Checks an instance key.
pub fn check_key(key: &str) -> Result<(), LayerError> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(LayerError::InvalidArgument(format!(
            "instance key must be 1-{MAX_KEY_LEN} characters, not {}",
            key.len()
        )));
    }
    if key.chars().any(char::is_control) {
        return Err(LayerError::InvalidArgument(
            "instance key must not contain control characters".into(),
        ));
    }
    Ok(())
}

/// What to do with a create request, given the instances that exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The key names this instance (position in the list) with the same spec: return it.
    Existing(usize),
    /// This unkeyed MIG instance has the same card, profile and start: give it the key.
    Adopt(usize),
    /// Nothing matches: create it.
    New,
}

/// Decides what a create request means against the instances that exist.
pub fn resolve(
    existing: &[InstanceRecord],
    request: &CreateRequest,
    device_uuid: &str,
) -> Result<Resolution, LayerError> {
    if let Some((i, record)) = existing
        .iter()
        .enumerate()
        .find(|(_, r)| r.key.as_deref() == Some(request.key.as_str()))
    {
        if record.device_uuid == device_uuid && record.spec == request.spec {
            return Ok(Resolution::Existing(i));
        }
        return Err(LayerError::KeyConflict {
            key: request.key.clone(),
            existing: format!(
                "{} on card {} ({})",
                record.spec, record.device_index, record.device_uuid
            ),
        });
    }
    if matches!(request.spec, ShareSpec::Mig { .. })
        && let Some(i) = existing
            .iter()
            .position(|r| r.key.is_none() && r.device_uuid == device_uuid && r.spec == request.spec)
    {
        return Ok(Resolution::Adopt(i));
    }
    Ok(Resolution::New)
}

/// Checks a MIG instance against the card's table and the instances on the card (`others`:
/// the records of that card), and returns its profile.
pub fn check_mig_placement(
    table: &'static MigTable,
    device_index: u32,
    profile_name: &str,
    start: u8,
    others: &[&InstanceRecord],
) -> Result<&'static MigProfile, LayerError> {
    let Some(profile) = table.profile(profile_name) else {
        return Err(LayerError::UnknownProfile {
            table: table.model.to_string(),
            profile: profile_name.to_string(),
            offered: table
                .profiles
                .iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    let fits = |s: u8| s + profile.memory_slices <= table.memory_slices;
    if !profile.starts.contains(&start) || !fits(start) {
        let legal: Vec<String> = profile
            .starts
            .iter()
            .filter(|s| fits(**s))
            .map(u8::to_string)
            .collect();
        return Err(LayerError::IllegalPlacement {
            table: table.model.to_string(),
            profile: profile.name.to_string(),
            start: u32::from(start),
            legal: legal.join(", "),
        });
    }
    let mask = profile.mask_at(start);
    for other in others {
        if let Some(placement) = other.placement(table)
            && placement.mask() & mask != 0
        {
            return Err(LayerError::Overlap {
                index: device_index,
                profile: profile.name.to_string(),
                start: u32::from(start),
                other: other.describe(),
            });
        }
    }
    Ok(profile)
}

/// The profiles of a MIG table on the wire, with the memory each name states (backends with
/// real sizes overwrite `memory_mib`).
pub fn table_profiles(table: &MigTable) -> Vec<pb::MigProfileInfo> {
    table
        .profiles
        .iter()
        .map(|p| pb::MigProfileInfo {
            name: p.name.to_string(),
            slices: u32::from(p.slices),
            memory_slices: u32::from(p.memory_slices),
            memory_mib: p.memory_mib(),
            starts: p.starts.iter().map(|s| u32::from(*s)).collect(),
            max_instances: max_alone(table, p),
            nvml_profile_id: 0,
            multiprocessors: 0,
            hardware_name: String::new(),
        })
        .collect()
}

/// How many instances of a profile alone fit on an empty card.
pub fn max_alone(table: &MigTable, profile: &MigProfile) -> u32 {
    let mut mask = 0;
    let mut n = 0;
    while let Some(&start) = table.legal_starts(profile, mask).first() {
        mask |= profile.mask_at(start);
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtimekit_contract::mig::{A30_24GB, H800_80GB};

    fn mig(key: Option<&str>, uuid: &str, profile: &str, start: u8) -> InstanceRecord {
        InstanceRecord {
            key: key.map(str::to_string),
            device_index: 0,
            device_uuid: uuid.into(),
            spec: ShareSpec::Mig {
                profile: profile.into(),
                start,
            },
            mig: Some(MigIds {
                gpu_instance_id: 1,
                compute_instance_id: 0,
                device_uuid: "MIG-x".into(),
                no_compute_instance: false,
            }),
            created_unix_ms: 0,
        }
    }

    fn request(key: &str, profile: &str, start: u8) -> CreateRequest {
        CreateRequest {
            key: key.into(),
            device_index: 0,
            device_uuid: None,
            spec: ShareSpec::Mig {
                profile: profile.into(),
                start,
            },
        }
    }

    #[test]
    fn same_key_same_spec_is_existing_other_spec_conflicts() {
        let existing = [mig(Some("a"), "GPU-0", "3g.40gb", 4)];
        assert_eq!(
            resolve(&existing, &request("a", "3g.40gb", 4), "GPU-0"),
            Ok(Resolution::Existing(0))
        );
        let err = resolve(&existing, &request("a", "3g.40gb", 0), "GPU-0").expect_err("conflict");
        assert_eq!(err.reason().as_str(), "InstanceKeyConflict");
        let err = resolve(&existing, &request("a", "3g.40gb", 4), "GPU-1").expect_err("other card");
        assert_eq!(err.reason().as_str(), "InstanceKeyConflict");
        assert_eq!(
            resolve(&existing, &request("b", "3g.40gb", 0), "GPU-0"),
            Ok(Resolution::New)
        );
    }

    #[test]
    fn unkeyed_mig_instance_with_same_placement_is_adopted() {
        let existing = [
            mig(Some("a"), "GPU-0", "1g.10gb", 0),
            mig(None, "GPU-0", "3g.40gb", 4),
        ];
        assert_eq!(
            resolve(&existing, &request("b", "3g.40gb", 4), "GPU-0"),
            Ok(Resolution::Adopt(1))
        );
        // Another card, or another start, is not the same instance.
        assert_eq!(
            resolve(&existing, &request("b", "3g.40gb", 4), "GPU-1"),
            Ok(Resolution::New)
        );
    }

    #[test]
    fn mig_placement_rules() {
        let t = &H800_80GB;
        let ok = check_mig_placement(t, 0, "3g.40gb", 4, &[]).expect("legal");
        assert_eq!(ok.name, "3g.40gb");
        let err = check_mig_placement(t, 0, "4g.40gb", 4, &[]).expect_err("4g at 4");
        assert_eq!(err.reason().as_str(), "IllegalPlacement");
        assert_eq!(
            err.to_string(),
            "4g.40gb cannot start at memory slice 4 on H800-80GB; its legal starts are 0"
        );
        let err = check_mig_placement(t, 0, "2g.20gb", 1, &[]).expect_err("2g at 1");
        assert!(
            err.to_string().ends_with("its legal starts are 0, 2, 4"),
            "{err}"
        );
        let err = check_mig_placement(t, 0, "3g.20gb", 0, &[]).expect_err("A100 name");
        assert_eq!(err.reason().as_str(), "UnknownMigProfile");
        assert!(
            err.to_string().contains("it offers 1g.10gb, 1g.20gb"),
            "{err}"
        );

        let taken = mig(Some("a"), "GPU-0", "2g.20gb", 2);
        let err = check_mig_placement(t, 5, "3g.40gb", 0, &[&taken]).expect_err("overlap");
        assert_eq!(err.reason().as_str(), "InstanceOverlap");
        assert_eq!(
            err.to_string(),
            "3g.40gb at memory slice 0 on card 5 overlaps instance a (MIG 2g.20gb at 2)"
        );
        assert!(check_mig_placement(t, 5, "3g.40gb", 4, &[&taken]).is_ok());
        assert!(check_mig_placement(t, 5, "1g.10gb", 1, &[&taken]).is_ok());
    }

    #[test]
    fn a30_has_four_slices() {
        let t = &A30_24GB;
        assert!(check_mig_placement(t, 0, "2g.12gb", 2, &[]).is_ok());
        let err = check_mig_placement(t, 0, "1g.6gb", 4, &[]).expect_err("slot 4 of 4");
        assert!(
            err.to_string().ends_with("its legal starts are 0, 1, 2, 3"),
            "{err}"
        );
        let err = check_mig_placement(t, 0, "3g.12gb", 0, &[]).expect_err("no 3g");
        assert_eq!(err.reason().as_str(), "UnknownMigProfile");
        let profiles = table_profiles(t);
        let max: Vec<u32> = profiles.iter().map(|p| p.max_instances).collect();
        assert_eq!(max, [4, 2, 1]);
    }

    #[test]
    fn create_request_checks() {
        let make = |key: &str, kind| pb::CreateInstanceRequest {
            key: key.into(),
            spec: Some(pb::InstanceSpec {
                device_index: 1,
                device_uuid: String::new(),
                kind,
            }),
        };
        let tdm = |core| {
            Some(pb::instance_spec::Kind::Tdm(pb::TdmSpec {
                core_percent: core,
                memory_mib: 4096,
            }))
        };
        let ok = CreateRequest::from_proto(make("s", tdm(50))).expect("valid");
        assert_eq!(ok.device_uuid, None);
        assert_eq!(
            ok.spec,
            ShareSpec::Tdm {
                core_percent: 50,
                memory_mib: 4096
            }
        );
        for (request, why) in [
            (make("", tdm(50)), "empty key"),
            (make(&"k".repeat(254), tdm(50)), "long key"),
            (make("s", tdm(101)), "core over 100"),
            (make("s", None), "no kind"),
            (
                make(
                    "s",
                    Some(pb::instance_spec::Kind::Mig(pb::MigSpec {
                        profile: "1g.10gb".into(),
                        placement_start: 8,
                    })),
                ),
                "start 8",
            ),
            (
                make(
                    "s",
                    Some(pb::instance_spec::Kind::Mig(pb::MigSpec {
                        profile: String::new(),
                        placement_start: 0,
                    })),
                ),
                "no profile",
            ),
        ] {
            let err = CreateRequest::from_proto(request).expect_err(why);
            assert_eq!(err.reason().as_str(), "InvalidArgument", "{why}");
        }
        let no_spec = pb::CreateInstanceRequest {
            key: "s".into(),
            spec: None,
        };
        assert!(CreateRequest::from_proto(no_spec).is_err());
    }

    #[test]
    fn record_round_trips_through_json_and_proto() {
        let record = mig(Some("a"), "GPU-0", "3g.40gb", 4);
        let json = serde_json::to_string(&record).expect("json");
        assert!(json.contains(r#""kind":"mig""#), "{json}");
        let back: InstanceRecord = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, record);
        let wire = record.to_proto(&[]);
        assert_eq!(wire.key, "a");
        assert_eq!(wire.kind(), pb::InstanceKind::Mig);
        assert_eq!(wire.mig.map(|m| m.gpu_instance_id), Some(1));
    }
}
