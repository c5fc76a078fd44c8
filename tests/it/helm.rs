//! The Helm chart (`deploy/helm/replicad`), rendered by the real `helm template` (v3.22.0,
//! installed by `.ci/run` into `target/test-tools/bin`): the same promises as the plain
//! manifests (`tests/it/deploy.rs`) — one writer, restore before start, a replicating sidecar
//! probed on its endpoints, non-root, a grace period longer than the shutdown sync, secrets by
//! reference only — plus a configuration replicad accepts, the optional ServiceMonitor and the
//! optional volume claim.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_norway::Value;

use crate::common::emulators::tool;
use crate::deploy::{container, strings};

fn helm() -> Option<PathBuf> {
    tool("bin/helm", "helm")
}

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/replicad")
}

/// The documents `helm template` renders with `--set` values.
fn render(helm: &Path, set: &[&str]) -> Vec<Value> {
    let mut cmd = Command::new(helm);
    cmd.args(["template", "app"]).arg(chart());
    for s in set {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("run helm");
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    text.split("\n---")
        .filter_map(|doc| {
            let v: Value = serde_norway::from_str(doc).unwrap_or_else(|e| panic!("{e}:\n{doc}"));
            (!v.is_null()).then_some(v)
        })
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect()
}

#[test]
fn the_chart_renders_a_single_writer_with_restore_sidecar_and_probes() {
    let Some(helm) = helm() else {
        return;
    };
    let docs = render(&helm, &[]);
    let sts = of_kind(&docs, "StatefulSet");
    assert_eq!(sts.len(), 1);
    let s = sts[0];
    assert_eq!(s["spec"]["replicas"].as_u64(), Some(1), "one writer");
    let pod = &s["spec"]["template"]["spec"];

    let init = container(&pod["initContainers"], "restore");
    let cmd = strings(&init["command"]);
    for want in [
        "restore",
        "--if-db-not-exists",
        "--if-replica-exists",
        "/data/app.db",
    ] {
        assert!(cmd.contains(&want), "restore: {cmd:?}");
    }
    let sidecar = container(&pod["containers"], "replicad");
    let cmd = strings(&sidecar["command"]);
    assert!(cmd.contains(&"replicate"), "{cmd:?}");
    let stop = strings(&sidecar["lifecycle"]["preStop"]["exec"]["command"]);
    assert!(
        stop.contains(&"sync") && stop.contains(&"--wait"),
        "{stop:?}"
    );
    assert_eq!(
        sidecar["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    assert_eq!(
        sidecar["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
    );
    assert_eq!(
        sidecar["readinessProbe"]["httpGet"]["port"].as_u64(),
        Some(9090)
    );

    // Non-root everywhere; no container may escalate.
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    for c in [init, sidecar, container(&pod["containers"], "app")] {
        assert_eq!(
            c["securityContext"]["allowPrivilegeEscalation"].as_bool(),
            Some(false),
            "{c:?}"
        );
    }

    // Secrets only by reference: every credential comes from a secretKeyRef, and the chart
    // renders no Secret.
    assert!(
        of_kind(&docs, "Secret").is_empty(),
        "the chart must not hold secrets"
    );
    for c in [init, sidecar] {
        let env = c["env"].as_sequence().expect("env");
        assert!(!env.is_empty());
        for e in env {
            assert_eq!(
                e["valueFrom"]["secretKeyRef"]["name"].as_str(),
                Some("replicad-s3")
            );
        }
    }

    // The configuration loads, and the grace period outlives its shutdown sync.
    let cms = of_kind(&docs, "ConfigMap");
    let yml = cms[0]["data"]["replicad.yml"]
        .as_str()
        .expect("replicad.yml");
    let dir = crate::common::TestDir::new("helm");
    let path = dir.join("replicad.yml");
    std::fs::write(&path, yml).unwrap();
    let config = load_as_replicad_would(&path);
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        grace > config.shutdown_sync_timeout.as_secs() + 10,
        "grace {grace} s against a shutdown sync of {:?}",
        config.shutdown_sync_timeout
    );
    assert_eq!(config.dbs.len(), 1);
    assert_eq!(config.dbs[0].path, Path::new("/data/app.db"));

    // Optional parts are off by default.
    assert!(of_kind(&docs, "ServiceMonitor").is_empty());
    assert!(s["spec"]["volumeClaimTemplates"].is_null());
}

/// Loads a configuration as `replicad replicate` would, with the credentials the Secret
/// would put in the environment.
fn load_as_replicad_would(path: &Path) -> replicad::config::Config {
    let out = Command::new(crate::common::bin())
        .args(["databases", "--config"])
        .arg(path)
        .env("AWS_ACCESS_KEY_ID", "id")
        .env("AWS_SECRET_ACCESS_KEY", "secret")
        .output()
        .expect("run replicad databases");
    assert!(
        out.status.success(),
        "replicad refuses the chart's configuration: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(path).unwrap();
    let text = text
        .replace("${AWS_ACCESS_KEY_ID}", "id")
        .replace("${AWS_SECRET_ACCESS_KEY}", "secret");
    replicad::config::Config::parse(&text, "chart", false)
        .expect("the chart's configuration parses")
}

#[test]
fn the_chart_adds_a_service_monitor_and_a_volume_claim_when_asked() {
    let Some(helm) = helm() else {
        return;
    };
    let docs = render(
        &helm,
        &[
            "serviceMonitor.enabled=true",
            "persistence.enabled=true",
            "persistence.size=5Gi",
            "replicad.settings.min-sync-interval=0s",
        ],
    );
    let sm = of_kind(&docs, "ServiceMonitor");
    assert_eq!(sm.len(), 1);
    let ep = &sm[0]["spec"]["endpoints"][0];
    assert_eq!(ep["port"].as_str(), Some("replicad"));
    assert_eq!(ep["path"].as_str(), Some("/metrics"));
    // The Service it selects exposes that port.
    let svc = of_kind(&docs, "Service");
    let ports = svc[0]["spec"]["ports"].as_sequence().unwrap();
    assert!(ports.iter().any(|p| p["name"].as_str() == Some("replicad")));

    let s = of_kind(&docs, "StatefulSet")[0];
    let claim = &s["spec"]["volumeClaimTemplates"][0];
    assert_eq!(claim["metadata"]["name"].as_str(), Some("data"));
    assert_eq!(
        claim["spec"]["resources"]["requests"]["storage"].as_str(),
        Some("5Gi")
    );
    let volumes = s["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .unwrap();
    assert!(
        volumes.iter().all(|v| v["name"].as_str() != Some("data")),
        "the claim replaces the emptyDir"
    );
    let yml = of_kind(&docs, "ConfigMap")[0]["data"]["replicad.yml"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(yml.contains("min-sync-interval: 0s"), "{yml}");
}
