//! The ConfigMap users deploy (`config/operator/config.yaml`) reads as the shared configuration
//! and spells out exactly the defaults, so the file cannot drift from the code.

use runtimekit_contract::RuntimeKitConfig;

#[test]
fn the_shipped_config_map_spells_out_the_defaults() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../config/operator/config.yaml"
    );
    let text = std::fs::read_to_string(path).expect("the shipped ConfigMap");
    let config_map: serde_yaml::Value = serde_yaml::from_str(&text).expect("YAML");
    let embedded = config_map["data"]["config.yaml"]
        .as_str()
        .expect("data.config.yaml");
    let config: RuntimeKitConfig = serde_yaml::from_str(embedded).expect("a RuntimeKitConfig");
    assert_eq!(config, RuntimeKitConfig::default());
    assert_eq!(config.validate(), Ok(()));
}
