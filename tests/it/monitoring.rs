//! The monitoring files shipped in `deploy/`: the alert rules pass `promtool check rules` and
//! their unit tests (`promtool test rules`: each alert fires on synthetic series and clears),
//! and a real Prometheus (Debian's package) scraping a real replicad returns data for every
//! query of the Grafana dashboard and knows every metric the rules name.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::http::{free_port, get, make_db};
use crate::common::{self, Daemon, TestDir};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `name` on PATH, or `None` outside CI (where `.ci/run` installs Debian's `prometheus`).
fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is missing (.ci/run installs Debian's prometheus package)"
        );
        eprintln!("SKIPPED: {name} is not installed (apt-get install prometheus)");
    }
    found
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?}: {text}");
    text
}

/// The alert names of the rules file.
fn alert_names() -> Vec<String> {
    let text =
        std::fs::read_to_string(root().join("deploy/prometheus/replicad-rules.yml")).unwrap();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::to_string)
        .collect()
}

#[test]
fn alert_rules_pass_promtool_and_each_fires_and_clears() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let dir = root().join("deploy/prometheus");
    let out = run(Command::new(&promtool)
        .args(["check", "rules", "replicad-rules.yml"])
        .current_dir(&dir));
    let names = alert_names();
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", names.len())),
        "{out}"
    );
    run(Command::new(&promtool)
        .args(["test", "rules", "replicad-rules.test.yml"])
        .current_dir(&dir));
    // Every alert is tested both ways: a firing case (with its labels) and a cleared one.
    let tests = std::fs::read_to_string(dir.join("replicad-rules.test.yml")).unwrap();
    for name in &names {
        let cases: Vec<&str> = tests
            .split("- eval_time:")
            .filter(|c| c.contains(&format!("alertname: {name}\n")))
            .collect();
        assert!(
            cases.iter().any(|c| c.contains("exp_labels"))
                && cases.iter().any(|c| c.contains("exp_alerts: []")),
            "{name}: needs a firing and a cleared case in replicad-rules.test.yml"
        );
    }
}

struct Prometheus {
    child: Child,
    port: u16,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn query(port: u16, expr: &str) -> Value {
    let q: String = url::form_urlencoded::byte_serialize(expr.as_bytes()).collect();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let (code, body) = get(addr, &format!("/api/v1/query?query={q}")).await;
    assert_eq!(code, 200, "{expr}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["data"]["result"].clone()
}

/// The dashboard's queries, with its variables as Grafana would fill them for one job.
fn dashboard_queries(job: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("deploy/grafana/replicad.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).unwrap();
    assert!(dash["uid"].is_null(), "no hard-coded dashboard UID");
    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["datasource", "job"]);
    let mut out = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        let title = p["title"].as_str().unwrap().to_string();
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        for t in p["targets"].as_array().unwrap() {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
            let expr = t["expr"].as_str().unwrap();
            assert!(
                expr.contains("$job"),
                "{title}: {expr} ignores the job variable"
            );
            let expr = expr.replace("$job", job).replace("$__rate_interval", "30s");
            out.push((title.clone(), expr));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_replicad_and_every_dashboard_query_returns_data() {
    let Some(prometheus) = tool("prometheus") else {
        return;
    };
    let dir = TestDir::new("monitoring");
    let db = dir.join("app.db");
    let conn = make_db(&db);
    let port = free_port();
    // Notifications to a port nothing listens on: their failure counters have series too.
    let dead = free_port();
    let yml = format!(
        "addr: \"127.0.0.1:{port}\"\nverify-interval: 1s\nnotify:\n  heartbeat-url: \
         http://127.0.0.1:{dead}/ping\n  heartbeat-interval: 1s\n  webhooks:\n    - url: \
         http://127.0.0.1:{dead}/hook\n      retries: 0\ndbs:\n  - path: {}\n    replica:\n      \
         url: {}\n",
        db.display(),
        dir.join("replica").display()
    );
    std::fs::write(dir.join("replicad.yml"), yml).unwrap();
    let d: Daemon = common::spawn_replicate(
        dir.path(),
        &["--config", common::s(&dir.join("replicad.yml"))],
    );

    let prom_port = free_port();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: replicad\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let prom = Prometheus {
        child: Command::new(prometheus)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
        port: prom_port,
    };

    // Commits while Prometheus scrapes: rates and the lag series have moving data.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut scraped = 0;
    while scraped < 8 {
        assert!(
            Instant::now() < deadline,
            "Prometheus never scraped replicad: {}",
            std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
        );
        conn.execute("INSERT INTO t(v) VALUES ('x')", []).unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let up = tokio::net::TcpStream::connect(("127.0.0.1", prom.port)).await;
        if up.is_err() {
            continue;
        }
        let r = query(prom.port, "count_over_time(up{job=\"replicad\"}[1m])").await;
        scraped = r[0]["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
    }
    assert_eq!(
        query(prom.port, "up{job=\"replicad\"}").await[0]["value"][1],
        "1"
    );

    let mut empty = Vec::new();
    let queries = dashboard_queries("replicad");
    assert!(queries.len() >= 20, "{} queries", queries.len());
    for (title, expr) in &queries {
        if query(prom.port, expr)
            .await
            .as_array()
            .is_none_or(|a| a.is_empty())
        {
            empty.push(format!("{title}: {expr}"));
        }
    }
    assert!(
        empty.is_empty(),
        "queries without data:\n{}",
        empty.join("\n")
    );

    // Every metric an alert rule names is one replicad exports (a renamed metric would leave
    // its alert silent forever).
    let rules =
        std::fs::read_to_string(root().join("deploy/prometheus/replicad-rules.yml")).unwrap();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let metrics = get(addr, "/metrics").await.1;
    for word in rules.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("replicad_") {
            assert!(
                metrics.contains(&format!("\n{word}{{")),
                "the rules name {word}, which replicad does not export"
            );
        }
    }
    drop(prom);
    d.stop_ok();
}
