//! Checks of the deployment files (`Dockerfile`, `deploy/systemd`, `deploy/kubernetes`): they
//! cannot be run here (no Docker, systemd or cluster), so their content is checked instead —
//! the manifests parse, the configuration in the ConfigMap is one replicad accepts, the probes
//! target replicad's endpoints, nothing runs as root, and the stop timeouts leave room for the
//! shutdown sync.

use std::fs;
use std::path::{Path, PathBuf};

use replicad::config::{Config, DEFAULT_SHUTDOWN_SYNC_TIMEOUT};
use serde_norway::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every document of every `deploy/kubernetes/*.yaml`, with its file name.
fn manifests() -> Vec<(PathBuf, Value)> {
    let dir = root().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    let mut docs = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        for doc in text.split("\n---\n") {
            let value: Value =
                serde_norway::from_str(doc).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            // A document of comments only is null.
            if !value.is_null() {
                docs.push((file.clone(), value));
            }
        }
    }
    docs
}

fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

fn only<'a>(docs: &'a [(PathBuf, Value)], k: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|(_, d)| kind(d) == k)
        .map(|(_, d)| d)
        .collect();
    assert_eq!(found.len(), 1, "expected one {k}");
    found[0]
}

pub(crate) fn strings(v: &Value) -> Vec<&str> {
    v.as_sequence()
        .map(|s| s.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

pub(crate) fn container<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn mounts(c: &Value) -> Vec<(&str, &str)> {
    c["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap(),
                m["mountPath"].as_str().unwrap(),
            )
        })
        .collect()
}

/// The configuration in the ConfigMap.
fn configmap_config(docs: &[(PathBuf, Value)]) -> String {
    only(docs, "ConfigMap")["data"]["replicad.yml"]
        .as_str()
        .expect("ConfigMap data.replicad.yml")
        .to_string()
}

#[test]
fn every_manifest_has_an_api_version_kind_and_name() {
    for (file, doc) in manifests() {
        assert!(
            doc["apiVersion"].as_str().is_some(),
            "{}: apiVersion",
            file.display()
        );
        assert!(!kind(&doc).is_empty(), "{}: kind", file.display());
        assert!(
            doc["metadata"]["name"].as_str().is_some(),
            "{}: metadata.name",
            file.display()
        );
    }
    let docs = manifests();
    for k in ["Deployment", "ConfigMap"] {
        only(&docs, k);
    }
}

#[test]
fn deployment_is_a_single_writer_with_restore_and_sidecar() {
    let docs = manifests();
    let d = only(&docs, "Deployment");
    assert_eq!(d["spec"]["replicas"].as_u64(), Some(1));
    assert_eq!(d["spec"]["strategy"]["type"].as_str(), Some("Recreate"));
    let pod = &d["spec"]["template"]["spec"];

    // Restore before anything starts: only when the volume has no database and the replica
    // has backups (a first deploy has none).
    let init = container(&pod["initContainers"], "restore");
    let cmd = strings(&init["command"]);
    assert!(cmd.contains(&"restore"), "{cmd:?}");
    assert!(cmd.contains(&"--if-db-not-exists"), "{cmd:?}");
    assert!(cmd.contains(&"--if-replica-exists"), "{cmd:?}");
    assert!(cmd.contains(&"/data/app.db"), "{cmd:?}");
    assert!(cmd.contains(&"/etc/replicad/replicad.yml"), "{cmd:?}");

    // The sidecar replicates with the same configuration.
    let sidecar = container(&pod["containers"], "replicad");
    let cmd = strings(&sidecar["command"]);
    assert!(cmd.contains(&"replicate"), "{cmd:?}");
    assert!(cmd.contains(&"/etc/replicad/replicad.yml"), "{cmd:?}");

    // The app, the restore and the sidecar share the data volume at /data.
    let app = container(&pod["containers"], "app");
    for c in [init, sidecar, app] {
        assert!(
            mounts(c).contains(&("data", "/data")),
            "{:?} does not mount data at /data",
            c["name"]
        );
    }
    for c in [init, sidecar] {
        assert!(mounts(c).contains(&("replicad-config", "/etc/replicad")));
    }
    let volumes = pod["volumes"].as_sequence().unwrap();
    let data = volumes
        .iter()
        .find(|v| v["name"].as_str() == Some("data"))
        .expect("volume data");
    assert!(
        data.get("emptyDir").is_some() || data.get("persistentVolumeClaim").is_some(),
        "data must be an emptyDir or a PVC"
    );
    let config = volumes
        .iter()
        .find(|v| v["name"].as_str() == Some("replicad-config"))
        .expect("volume replicad-config");
    assert_eq!(
        config["configMap"]["name"],
        only(&docs, "ConfigMap")["metadata"]["name"]
    );

    // Credentials come from a Secret, in both replicad containers.
    for c in [init, sidecar] {
        for var in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
            let env = c["env"]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|e| e["name"].as_str() == Some(var))
                .unwrap_or_else(|| panic!("{var} not set in {:?}", c["name"]));
            assert!(env["valueFrom"]["secretKeyRef"]["name"].as_str().is_some());
        }
    }
}

#[test]
fn probes_target_replicad_endpoints() {
    let docs = manifests();
    let pod = &only(&docs, "Deployment")["spec"]["template"]["spec"];
    let sidecar = container(&pod["containers"], "replicad");
    let live = &sidecar["livenessProbe"]["httpGet"];
    let ready = &sidecar["readinessProbe"]["httpGet"];
    assert_eq!(live["path"].as_str(), Some("/healthz"));
    assert_eq!(ready["path"].as_str(), Some("/readyz"));
    assert_eq!(live["port"].as_u64(), Some(9090));
    assert_eq!(ready["port"].as_u64(), Some(9090));

    // The configuration listens on that port, on an address the kubelet reaches (the pod IP):
    // replicad binds 127.0.0.1 for a bare ":9090".
    let text = configmap_config(&docs);
    let cfg: Value = serde_norway::from_str(&text).unwrap();
    let addr = cfg["addr"].as_str().expect("addr in replicad.yml");
    let addr: std::net::SocketAddr = addr
        .parse()
        .unwrap_or_else(|e| panic!("addr {addr:?} needs an explicit host: {e}"));
    assert_eq!(addr.port(), 9090);
    assert!(addr.ip().is_unspecified(), "{addr} is not reachable");
}

#[test]
fn pod_runs_as_non_root_and_outlives_the_shutdown_sync() {
    let docs = manifests();
    let pod = &only(&docs, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    let uid = pod["securityContext"]["runAsUser"].as_u64().unwrap();
    assert_ne!(uid, 0);
    for list in ["initContainers", "containers"] {
        for c in pod[list].as_sequence().unwrap() {
            assert_eq!(
                c["securityContext"]["allowPrivilegeEscalation"].as_bool(),
                Some(false),
                "{:?}",
                c["name"]
            );
            assert_ne!(c["securityContext"]["runAsUser"].as_u64(), Some(0));
        }
    }
    // SIGTERM: replicad does a final sync and drains uploads for up to
    // shutdown-sync-timeout; the kubelet must not SIGKILL it before.
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    let cfg = Config::parse(&configmap_config(&docs), "configmap", false).unwrap();
    assert!(
        grace > cfg.shutdown_sync_timeout.as_secs(),
        "terminationGracePeriodSeconds {grace} <= shutdown-sync-timeout {:?}",
        cfg.shutdown_sync_timeout
    );
}

#[test]
fn prestop_syncs_through_the_control_socket() {
    let docs = manifests();
    let pod = &only(&docs, "Deployment")["spec"]["template"]["spec"];
    let sidecar = container(&pod["containers"], "replicad");
    let cmd = strings(&sidecar["lifecycle"]["preStop"]["exec"]["command"]);
    assert_eq!(
        cmd,
        [
            "replicad",
            "sync",
            "--config",
            "/etc/replicad/replicad.yml",
            "--wait",
            "/data/app.db"
        ]
    );
    // The daemon serves the socket the hook asks, in a writable directory of the sidecar.
    let cfg = Config::parse(&configmap_config(&docs), "configmap", false).unwrap();
    assert!(cfg.socket.enabled, "socket.enabled in replicad.yml");
    assert_eq!(cfg.socket.path, Path::new("/tmp/replicad.sock"));
    assert_eq!(cfg.socket.permissions, 0o600);
    assert!(mounts(sidecar).iter().any(|(_, p)| *p == "/tmp"));
    assert!(cfg.dbs.iter().any(|d| d.path == Path::new("/data/app.db")));
}

#[test]
fn configmap_config_parses() {
    let docs = manifests();
    let text = configmap_config(&docs);
    // Without expansion `${AWS_ACCESS_KEY_ID}` is taken literally, which is fine for a parse.
    let cfg = Config::parse(&text, "configmap", false).unwrap_or_else(|e| panic!("{e}"));
    // The HTTP endpoint (probes) is on.
    assert_eq!(cfg.addr.map(|a| a.port()), Some(9090));
    assert_eq!(cfg.dbs.len(), 1);
    assert_eq!(cfg.dbs[0].path, Path::new("/data/app.db"));
    assert_eq!(cfg.dbs[0].replicas.len(), 1);
    // The credentials come from the environment (the Secret), never from the ConfigMap.
    assert!(text.contains("access-key-id: ${AWS_ACCESS_KEY_ID}"));
    assert!(text.contains("secret-access-key: ${AWS_SECRET_ACCESS_KEY}"));
}

#[test]
fn systemd_unit_waits_for_the_shutdown_sync() {
    let text = fs::read_to_string(root().join("deploy/systemd/replicad.service")).unwrap();
    let value = |key: &str| -> &str {
        let prefix = format!("{key}=");
        let found: Vec<&str> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix(prefix.as_str()))
            .collect();
        assert_eq!(found.len(), 1, "{key}= set {} times", found.len());
        found[0].trim()
    };
    assert_eq!(value("Type"), "notify");
    assert_eq!(
        value("ExecStart"),
        "/usr/local/bin/replicad replicate --config /etc/replicad.yml"
    );
    assert_eq!(value("Restart"), "always");
    assert_eq!(value("KillSignal"), "SIGTERM");
    let stop: u64 = value("TimeoutStopSec")
        .parse()
        .expect("TimeoutStopSec in seconds");
    assert!(
        stop > DEFAULT_SHUTDOWN_SYNC_TIMEOUT.as_secs(),
        "TimeoutStopSec={stop} must exceed the shutdown sync timeout"
    );
    assert_eq!(value("NoNewPrivileges"), "true");
    assert_eq!(value("ProtectSystem"), "strict");
    assert_eq!(value("ReadWritePaths"), "/var/lib/app");
    assert_eq!(value("PrivateTmp"), "true");
    assert_eq!(value("ProtectHome"), "true");
}

#[test]
fn dockerfile_builds_locked_and_runs_as_non_root() {
    let text = fs::read_to_string(root().join("Dockerfile")).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let froms: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("FROM "))
        .collect();
    assert_eq!(froms.len(), 2, "multi-stage: {froms:?}");
    assert!(froms[0].starts_with("rust:1.95-bookworm"), "{froms:?}");
    assert!(froms[1].starts_with("debian:bookworm-slim"), "{froms:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("cargo build --release --locked")),
        "cargo build --release --locked"
    );
    assert!(lines.iter().any(|l| l.contains("ca-certificates")));
    // The last USER (the one the container runs as) is not root.
    let user = lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("USER");
    let user = user.trim();
    assert!(!["root", "0", "0:0"].contains(&user), "USER {user}");
    assert_eq!(user.split(':').next(), Some("65532"));
    assert!(lines.contains(&r#"ENTRYPOINT ["replicad"]"#));
    assert!(lines.contains(&r#"CMD ["replicate", "--config", "/etc/replicad.yml"]"#));
    // The build context keeps target/ and .git out.
    let ignore = fs::read_to_string(root().join(".dockerignore")).unwrap();
    for entry in ["target", ".git"] {
        assert!(ignore.lines().any(|l| l.trim() == entry), "{entry}");
    }
}
