//! `notify`: webhooks and the heartbeat ping of a real daemon, received by a loopback HTTP
//! server that records every request (and fails the first ones on demand).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::Duration;

use crate::common::http::{free_port, get_blocking, sample};
use crate::common::{
    self, TestDir, assert_same_content, max_replica_txid, restore_ok, s, spawn_replicate,
    wait_until,
};

/// One request the receiver got.
#[derive(Clone, Debug)]
struct Req {
    method: String,
    path: String,
    /// Header names lower-cased.
    headers: Vec<(String, String)>,
    body: String,
}

/// A loopback HTTP server: answers 500 to the first `fail` POSTs, then 200.
struct Receiver {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<Req>>>,
}

impl Receiver {
    fn start(fail: usize) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let got: Arc<Mutex<Vec<Req>>> = Arc::default();
        let failing = Arc::new(AtomicUsize::new(fail));
        let log = got.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let Some(req) = read_request(&mut conn) else {
                    continue;
                };
                let fail = req.method == "POST"
                    && failing
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                let status = if fail {
                    "500 Internal Server Error"
                } else {
                    "200 OK"
                };
                let _ = write!(
                    conn,
                    "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                if !fail {
                    log.lock().unwrap().push(req);
                }
            }
        });
        Receiver { addr, got }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The JSON bodies of the POSTs accepted so far.
    fn events(&self) -> Vec<serde_json::Value> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.method == "POST")
            .map(|r| serde_json::from_str(&r.body).unwrap())
            .collect()
    }

    fn event(&self, name: &str) -> Option<serde_json::Value> {
        self.events().into_iter().find(|e| e["event"] == name)
    }

    /// GETs of `path` accepted so far.
    fn pings(&self, path: &str) -> usize {
        let got = self.got.lock().unwrap();
        got.iter()
            .filter(|r| r.method == "GET" && r.path == path)
            .count()
    }

    fn first_post(&self) -> Req {
        let got = self.got.lock().unwrap();
        got.iter().find(|r| r.method == "POST").unwrap().clone()
    }
}

fn read_request(conn: &mut std::net::TcpStream) -> Option<Req> {
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut r = BufReader::new(conn.try_clone().ok()?);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some(Req {
        method,
        path,
        headers,
        body: String::from_utf8(body).ok()?,
    })
}

/// The body of `GET path` on the daemon's HTTP listener.
fn get(port: u16, path: &str) -> String {
    get_blocking(port, path).1
}

fn metrics(port: u16) -> String {
    get(port, "/metrics")
}

fn insert(c: &rusqlite::Connection, tag: &str) {
    for i in 0..5 {
        c.execute("INSERT INTO t(v) VALUES (?1)", [format!("{tag}-{i}")])
            .unwrap();
    }
}

fn config(
    dir: &TestDir,
    db: &Path,
    replica: &Path,
    port: u16,
    hook: &Receiver,
    dead: u16,
) -> String {
    let text = format!(
        "addr: \"127.0.0.1:{port}\"\nmonitor-interval: 50ms\nheartbeat-interval: 100ms\n\
         max-lag: 1s\nlevels:\n  - interval: 200ms\nnotify:\n  heartbeat-url: {ping}\n  heartbeat-interval: 1s\n  \
         webhooks:\n    - name: ops\n      url: {url}\n      headers:\n        \
         Authorization: Bearer tok-xyz\n      retries: 3\n    - name: dead\n      \
         url: http://127.0.0.1:{dead}/dead-secret\n      events: [start]\n      retries: 0\n\
         dbs:\n  - path: {}\n    replicas:\n      - name: r0\n        url: {}\n",
        db.display(),
        replica.display(),
        ping = hook.url("/ping/secret-uuid"),
        url = hook.url("/hook/secret-token"),
    );
    let path = dir.join("replicad.yml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// Start (delivered after two refused attempts), heartbeat pings while ready, a replica
/// failing (pings withheld) and recovering, a re-seed, and the stop; a webhook that cannot be
/// reached is counted and never holds replication; no URL token or header value is logged.
#[test]
fn webhooks_and_heartbeat_follow_a_replica_failing_and_recovering() {
    let dir = TestDir::new("webhooks");
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let c = common::http::make_db(&db);
    insert(&c, "first");
    let hook = Receiver::start(2);
    let port = free_port();
    let dead = free_port();
    let cfg = config(&dir, &db, &replica, port, &hook, dead);
    let d = spawn_replicate(dir.path(), &["--config", &cfg]);

    wait_until(&dir, "the start event", || hook.event("start").is_some());
    let start = hook.event("start").unwrap();
    assert_eq!(start["databases"], 1, "{start}");
    assert!(start["time"].as_str().unwrap().ends_with('Z'), "{start}");
    let first = hook.first_post();
    assert_eq!(first.path, "/hook/secret-token");
    let header = |name: &str| {
        first
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(header("authorization").as_deref(), Some("Bearer tok-xyz"));
    assert_eq!(header("content-type").as_deref(), Some("application/json"));
    wait_until(&dir, "the retries and the dead webhook counted", || {
        let m = metrics(port);
        sample(
            &m,
            "replicad_webhook_attempt_errors_total",
            "webhook=\"ops\"",
        ) == Some(2.0)
            && sample(
                &m,
                "replicad_webhook_deliveries_total",
                "result=\"delivered\",webhook=\"ops\"",
            ) == Some(1.0)
            && sample(
                &m,
                "replicad_webhook_deliveries_total",
                "result=\"failed\",webhook=\"dead\"",
            ) == Some(1.0)
    });
    wait_until(&dir, "two heartbeat pings", || {
        hook.pings("/ping/secret-uuid") >= 2
    });

    // A replica that cannot be written: failing after max-lag, pings withheld.
    let next = max_replica_txid(&replica) + 1;
    let obstacle = replica
        .join("ltx/0")
        .join(format!("{next:016x}-{next:016x}.ltx"));
    std::fs::create_dir_all(&obstacle).unwrap();
    std::fs::write(obstacle.join("keep"), b"x").unwrap();
    insert(&c, "blocked");
    wait_until(&dir, "the replica-failing event", || {
        hook.event("replica-failing").is_some()
    });
    let failing = hook.event("replica-failing").unwrap();
    assert_eq!(failing["db"], s(&db), "{failing}");
    assert_eq!(failing["replica"], "r0", "{failing}");
    assert!(
        failing["replica_url"]
            .as_str()
            .unwrap()
            .contains(s(&replica)),
        "{failing}"
    );
    assert!(!failing["error"].as_str().unwrap().is_empty(), "{failing}");
    wait_until(&dir, "a withheld ping", || {
        sample(
            &metrics(port),
            "replicad_heartbeat_pings_total",
            "result=\"withheld\"",
        )
        .is_some_and(|n| n >= 1.0)
    });
    assert!(
        d.log_text().contains("heartbeat withheld"),
        "{}",
        d.log_text()
    );
    // Not ready: no ping over more than two intervals, and a withheld ping is tried again at
    // the next check (1 s here), not at once (it looped every 10 ms).
    let withheld = || {
        sample(
            &metrics(port),
            "replicad_heartbeat_pings_total",
            "result=\"withheld\"",
        )
        .unwrap_or(0.0)
    };
    let during = hook.pings("/ping/secret-uuid");
    let withheld_before = withheld();
    sleep(Duration::from_millis(2500));
    assert_eq!(
        hook.pings("/ping/secret-uuid"),
        during,
        "pinged while not ready"
    );
    let tries = withheld() - withheld_before;
    assert!(tries <= 4.0, "{tries} withheld pings in 2.5 s");

    // Cause removed: recovered, and the pings resume.
    std::fs::remove_dir_all(&obstacle).unwrap();
    wait_until(&dir, "the replica-recovered event", || {
        hook.event("replica-recovered").is_some()
    });
    let pings = hook.pings("/ping/secret-uuid");
    wait_until(&dir, "the pings to resume", || {
        hook.pings("/ping/secret-uuid") > pings
    });

    // A wiped replica, once staging no longer holds its first segments (L1 compaction every
    // 200 ms prunes them), is seeded again with a snapshot, and said so.
    wait_until(&dir, "staging to be pruned", || {
        !dir.join(".app.db-replicad/ltx/0/0000000000000001-0000000000000001.ltx")
            .exists()
    });
    common::wipe_dir(&replica);
    insert(&c, "after-wipe");
    wait_until(&dir, "the reseed event", || hook.event("reseed").is_some());
    assert_eq!(hook.event("reseed").unwrap()["replica"], "r0");

    insert(&c, "last");
    let scraped = format!("{}{}", metrics(port), get(port, "/status"));
    for secret in ["secret-token", "secret-uuid", "tok-xyz", "dead-secret"] {
        assert!(!scraped.contains(secret), "{secret} in /metrics or /status");
    }
    let log = d.log.clone();
    d.stop_ok();
    let stop = hook
        .event("stop")
        .expect("the stop event is sent before exit");
    assert!(stop["error"].is_null(), "{stop}");
    assert_eq!(stop["unprotected"], serde_json::json!([]), "{stop}");
    let text = std::fs::read_to_string(log).unwrap();
    for secret in ["secret-token", "secret-uuid", "tok-xyz", "dead-secret"] {
        assert!(!text.contains(secret), "{secret} logged:\n{text}");
    }
    assert!(
        text.contains("webhook call failed") && text.contains(&format!("127.0.0.1:{dead}")),
        "{text}"
    );
    // Exactly these events, in this order, each once.
    let names: Vec<String> = hook
        .events()
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "start",
            "replica-failing",
            "replica-recovered",
            "reseed",
            "stop"
        ],
        "{:#?}",
        hook.events()
    );
    let out = dir.join("restored.db");
    restore_ok(s(&replica), &out, None);
    assert_same_content(&db, &out, "restored after the webhook run");
}
