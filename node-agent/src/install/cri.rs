//! What the installer asks the node's container runtime over CRI: its version (which decides
//! where the handler goes) and whether the `lj-runtime` handler is live (containerd has read
//! it). The answers' parsing is pure and tested without a runtime.

use runtimekit_proto::cri::v1::runtime_service_client::RuntimeServiceClient;
use runtimekit_proto::cri::v1::{
    ListPodSandboxRequest, PodSandbox, PodSandboxState, StatusRequest, VersionRequest,
};
use std::path::Path;
use std::time::Duration;
use tonic::transport::Channel;

/// How long one question may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The container runtime, as its `Version` answer names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    /// `containerd`.
    pub name: String,
    /// Its version, `v2.4.2` or `1.7.27`.
    pub version: String,
    /// Its major version.
    pub major: u32,
}

/// A client of the runtime on `socket`, or why there is none.
pub async fn connect(socket: &Path) -> Result<RuntimeServiceClient<Channel>, String> {
    let channel = tokio::time::timeout(
        CALL_TIMEOUT,
        runtimekit_resource_layer::client::connect(socket),
    )
    .await
    .map_err(|_| {
        format!(
            "the container runtime on {} does not answer",
            socket.display()
        )
    })?
    .map_err(|e| {
        format!(
            "cannot reach the container runtime on {}: {e}",
            socket.display()
        )
    })?;
    Ok(RuntimeServiceClient::new(channel))
}

/// The runtime's name and version.
pub async fn runtime(client: &mut RuntimeServiceClient<Channel>) -> Result<Runtime, String> {
    let answer = tokio::time::timeout(CALL_TIMEOUT, client.version(VersionRequest::default()))
        .await
        .map_err(|_| "the container runtime's Version call timed out".to_owned())?
        .map_err(|e| {
            format!(
                "the container runtime's Version call failed: {}",
                e.message()
            )
        })?
        .into_inner();
    let major = major(&answer.runtime_version).ok_or_else(|| {
        format!(
            "the container runtime {} reports version {:?}, which is not a version number",
            answer.runtime_name, answer.runtime_version
        )
    })?;
    if answer.runtime_name != "containerd" {
        return Err(format!(
            "the node's container runtime is {} {}; the installer configures containerd only",
            answer.runtime_name, answer.runtime_version
        ));
    }
    Ok(Runtime {
        name: answer.runtime_name,
        version: answer.runtime_version,
        major,
    })
}

/// The binary the runtime's live configuration gives the handler `name`, `None` while the
/// runtime does not know the handler.
pub async fn live_binary(
    client: &mut RuntimeServiceClient<Channel>,
    name: &str,
) -> Result<Option<String>, String> {
    let answer = tokio::time::timeout(CALL_TIMEOUT, client.status(StatusRequest { verbose: true }))
        .await
        .map_err(|_| "the container runtime's Status call timed out".to_owned())?
        .map_err(|e| {
            format!(
                "the container runtime's Status call failed: {}",
                e.message()
            )
        })?
        .into_inner();
    let config = answer
        .info
        .get("config")
        .map(String::as_str)
        .unwrap_or("{}");
    Ok(handler_binary(config, name))
}

/// The pods (`<namespace>/<name>`) whose sandbox is ready and runs under the handler `name`.
pub async fn pods_using(
    client: &mut RuntimeServiceClient<Channel>,
    name: &str,
) -> Result<Vec<String>, String> {
    let answer = tokio::time::timeout(
        CALL_TIMEOUT,
        client.list_pod_sandbox(ListPodSandboxRequest::default()),
    )
    .await
    .map_err(|_| "the container runtime's ListPodSandbox call timed out".to_owned())?
    .map_err(|e| {
        format!(
            "the container runtime's ListPodSandbox call failed: {}",
            e.message()
        )
    })?
    .into_inner();
    Ok(running_under(&answer.items, name))
}

/// The ready sandboxes of `sandboxes` that run under the handler `name`, as `<namespace>/<pod>`.
pub fn running_under(sandboxes: &[PodSandbox], name: &str) -> Vec<String> {
    let mut pods: Vec<String> = sandboxes
        .iter()
        .filter(|s| s.runtime_handler == name && s.state == PodSandboxState::SandboxReady as i32)
        .map(|s| match &s.metadata {
            Some(m) => format!("{}/{}", m.namespace, m.name),
            None => s.id.clone(),
        })
        .collect();
    pods.sort();
    pods
}

/// The major version in a runtime version such as `v2.4.2`, `1.7.27` or `2.1.0-rc.1`.
pub fn major(version: &str) -> Option<u32> {
    let version = version.strip_prefix('v').unwrap_or(version);
    let (major, rest) = version.split_once('.')?;
    rest.split('.').next()?.parse::<u32>().ok()?;
    major.parse().ok()
}

/// The handler's `BinaryName` in the CRI plugin's configuration as containerd's verbose status
/// gives it (JSON, `containerd.runtimes.<name>.options.BinaryName`); an empty string when the
/// handler is there with runc's default binary.
pub fn handler_binary(config: &str, name: &str) -> Option<String> {
    let config: serde_json::Value = serde_json::from_str(config).ok()?;
    let handler = config.get("containerd")?.get("runtimes")?.get(name)?;
    Some(
        handler
            .get("options")
            .and_then(|o| o.get("BinaryName"))
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majors_are_read_from_runtime_versions() {
        assert_eq!(major("v2.4.2"), Some(2));
        assert_eq!(major("1.7.27"), Some(1));
        assert_eq!(major("1.6.20~ds1"), Some(1));
        assert_eq!(major("v2.1.0-rc.1"), Some(2));
        assert_eq!(major("v3"), None);
        assert_eq!(major("unknown"), None);
        assert_eq!(major(""), None);
    }

    #[test]
    fn pods_under_the_handler_are_the_ready_ones() {
        use runtimekit_proto::cri::v1::PodSandboxMetadata;
        let sandbox = |name: &str, handler: &str, state: PodSandboxState| PodSandbox {
            id: format!("id-{name}"),
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                namespace: "team-a".into(),
                ..Default::default()
            }),
            state: state as i32,
            runtime_handler: handler.into(),
            ..Default::default()
        };
        let sandboxes = [
            sandbox("train", "lj-runtime", PodSandboxState::SandboxReady),
            sandbox("ended", "lj-runtime", PodSandboxState::SandboxNotready),
            sandbox("web", "", PodSandboxState::SandboxReady),
            sandbox("infer", "lj-runtime", PodSandboxState::SandboxReady),
        ];
        assert_eq!(
            running_under(&sandboxes, "lj-runtime"),
            ["team-a/infer", "team-a/train"]
        );
        assert!(running_under(&sandboxes, "kata").is_empty());
    }

    #[test]
    fn the_live_handler_is_read_from_the_verbose_status() {
        // As containerd 2.4 marshals its CRI configuration (trimmed).
        let config = r#"{"containerd":{"defaultRuntimeName":"runc","runtimes":{
            "runc":{"runtimeType":"io.containerd.runc.v2","options":{"SystemdCgroup":true}},
            "lj-runtime":{"runtimeType":"io.containerd.runc.v2","PodAnnotations":["aliyun.com/*"],
              "options":{"BinaryName":"/usr/local/bin/lj-runtime"}}}},"cni":{}}"#;
        assert_eq!(
            handler_binary(config, "lj-runtime").as_deref(),
            Some("/usr/local/bin/lj-runtime")
        );
        assert_eq!(handler_binary(config, "runc").as_deref(), Some(""));
        assert_eq!(handler_binary(config, "kata"), None);
        assert_eq!(handler_binary("not json", "lj-runtime"), None);
        assert_eq!(handler_binary("{}", "lj-runtime"), None);
    }
}
