//! The `notify` map, and Litestream's top-level `heartbeat-url` / `heartbeat-interval` pair.

use super::*;
use crate::config::notify::{DEFAULT_HEARTBEAT_PING_INTERVAL, NotifyEvent};

#[test]
fn notify_off_by_default() {
    let c = parse(MINIMAL).unwrap();
    assert!(!c.notify.is_enabled());
    assert_eq!(c.notify.heartbeat_interval, DEFAULT_HEARTBEAT_PING_INTERVAL);
}

#[test]
fn webhooks_and_heartbeat_with_their_defaults() {
    let text = format!(
        "notify:\n  heartbeat-url: https://hc-ping.com/0123-secret-uuid\n  heartbeat-interval: 2m\n  \
         webhooks:\n    - url: https://hooks.example.com/T000/B000/secret-token\n    \
         - name: pager\n      url: http://127.0.0.1:9000/hook\n      headers:\n        \
         Authorization: Bearer hunter2\n      events: [replica-failing, stop]\n      \
         timeout: 3s\n      retries: 0\n{MINIMAL}"
    );
    let c = parse(&text).unwrap();
    let n = &c.notify;
    assert!(n.is_enabled());
    assert_eq!(n.heartbeat_interval, Duration::from_secs(120));
    let ping = n.heartbeat_url.as_ref().unwrap();
    assert_eq!(ping.expose(), "https://hc-ping.com/0123-secret-uuid");
    assert_eq!(ping.host(), "https://hc-ping.com");
    let (a, b) = (&n.webhooks[0], &n.webhooks[1]);
    assert_eq!(a.name, "webhook-0");
    assert_eq!(a.events, NotifyEvent::ALL.to_vec());
    assert_eq!((a.timeout, a.retries), (Duration::from_secs(10), 5));
    assert!(a.headers.is_empty());
    assert_eq!(b.name, "pager");
    assert_eq!(b.url.host(), "http://127.0.0.1:9000");
    assert_eq!(b.events, [NotifyEvent::ReplicaFailing, NotifyEvent::Stop]);
    assert_eq!((b.timeout, b.retries), (Duration::from_secs(3), 0));
    assert_eq!(b.headers[0].0, "Authorization");
    assert_eq!(b.headers[0].1.0, "Bearer hunter2");
    // Neither the tokens in the URLs nor the header value show in Debug output.
    let debug = format!("{c:?}");
    for secret in ["secret-uuid", "secret-token", "hunter2", "9000/hook"] {
        assert!(!debug.contains(secret), "{secret} in {debug}");
    }
    // A replicad key: the file is no Litestream file (its default codec stays zstd).
    assert!(!super::super::load::litestream_file(&text));
}

#[test]
fn litestream_top_level_heartbeat_pair() {
    let c = parse(&format!(
        "heartbeat-url: https://hc-ping.com/uuid\nheartbeat-interval: 2m\n{MINIMAL}"
    ))
    .unwrap();
    assert_eq!(
        c.notify.heartbeat_url.as_ref().unwrap().expose(),
        "https://hc-ping.com/uuid"
    );
    assert_eq!(c.notify.heartbeat_interval, Duration::from_secs(120));
    // Not the upload tasks' heartbeat: that keeps its default.
    assert_eq!(
        c.dbs[0].settings.heartbeat_interval,
        DbSettings::default().heartbeat_interval
    );
    // Without heartbeat-url, the top-level heartbeat-interval is the upload heartbeat.
    let c = parse(&format!("heartbeat-interval: 2m\n{MINIMAL}")).unwrap();
    assert_eq!(
        c.dbs[0].settings.heartbeat_interval,
        Duration::from_secs(120)
    );
    assert!(c.notify.heartbeat_url.is_none());
    // Litestream's file with only heartbeat-url: the default ping interval.
    let c = parse(&format!(
        "heartbeat-url: https://hc-ping.com/uuid\n{MINIMAL}"
    ))
    .unwrap();
    assert_eq!(c.notify.heartbeat_interval, DEFAULT_HEARTBEAT_PING_INTERVAL);
}

/// A webhook given as a bare URL, or headers as a string: the error never quotes the value
/// (a token in a URL path, a credential in a header).
#[test]
fn misshapen_notify_values_are_never_echoed() {
    for text in [
        format!("notify:\n  webhooks:\n    - https://hooks.example.com/T/B/SECRET1\n{MINIMAL}"),
        format!("notify:\n  webhooks: https://hooks.example.com/T/B/SECRET1\n{MINIMAL}"),
        format!("notify: https://hooks.example.com/T/B/SECRET1\n{MINIMAL}"),
        format!(
            "notify:\n  webhooks:\n    - url: https://example.com/x\n      headers: Bearer SECRET1\n{MINIMAL}"
        ),
        format!(
            "notify:\n  webhooks:\n    - url: https://example.com/x\n      headers: {{Authorization: [SECRET1]}}\n{MINIMAL}"
        ),
    ] {
        let (_, msg) = fail(&text);
        assert!(!msg.contains("SECRET1"), "{msg}");
        assert!(msg.contains("notify"), "{msg}");
    }
    // Commands that never run the daemon skip `notify` (and its variables).
    let text = format!("notify:\n  webhooks:\n    - url: \"\"\n{MINIMAL}");
    assert!(parse(&text).is_err());
    let c = super::super::yaml::parse_yaml_with(&text, "/etc/replicad.yml", true).unwrap();
    assert!(!c.notify.is_enabled());
}

#[test]
fn bad_notify_input_is_named() {
    for (text, line, parts) in [
        (
            format!("notify:\n  webhooks:\n    - url: ftp://example.com/x\n{MINIMAL}"),
            3,
            vec!["scheme ftp", "key `url` in notify.webhooks[0]"],
        ),
        (
            format!("notify:\n  webhooks:\n    - url: https://u:pw@example.com/x\n{MINIMAL}"),
            3,
            vec!["credentials in the URL", "headers"],
        ),
        (
            format!(
                "notify:\n  webhooks:\n    - url: https://example.com/x\n      events: [replica-fail]\n{MINIMAL}"
            ),
            3,
            vec!["unknown event \"replica-fail\"", "replica-failing", "lease-lost"],
        ),
        (
            format!("notify:\n  webhooks:\n    - name: x\n{MINIMAL}"),
            3,
            vec!["missing key `url` in notify.webhooks[0]"],
        ),
        (
            format!(
                "notify:\n  webhooks:\n    - url: https://example.com/a\n    - url: https://example.com/b\n      name: webhook-0\n{MINIMAL}"
            ),
            4,
            vec!["two webhooks are named \"webhook-0\"", "notify.webhooks[1]"],
        ),
        (
            format!("notify:\n  heartbeat-url: https://x.example/p\n  heartbeat-interval: 500ms\n{MINIMAL}"),
            3,
            vec!["at least 1s", "key `heartbeat-interval` in notify"],
        ),
        (
            format!("notify:\n  webhook:\n    - url: https://example.com/x\n{MINIMAL}"),
            2,
            vec!["unknown key `webhook` in notify", "`webhooks`"],
        ),
        (
            format!(
                "notify:\n  webhooks:\n    - url: https://example.com/x\n      retries: 99\n{MINIMAL}"
            ),
            4,
            vec!["from 0 to 20"],
        ),
        (
            format!("heartbeat-url: https://x.example/p\nheartbeat-interval: 100ms\n{MINIMAL}"),
            1,
            vec!["heartbeat ping interval (as in Litestream)", "at least 1s"],
        ),
        (
            format!(
                "heartbeat-url: https://x.example/p\nnotify:\n  heartbeat-url: https://y.example/q\n{MINIMAL}"
            ),
            1,
            vec!["same setting: keep one"],
        ),
        (
            format!("notify:\n  heartbeat-interval: 1m\n{MINIMAL}"),
            2,
            vec!["does nothing without `heartbeat-url`"],
        ),
        (
            format!(
                "notify:\n  webhooks:\n    - url: https://example.com/x\n      headers: {{A: 1, a: 2}}\n{MINIMAL}"
            ),
            3,
            vec!["header \"a\" is given twice"],
        ),
        (
            "dbs:\n  - path: /data/a.db\n    notify: {}\n    replica:\n      url: file:///backup/a\n"
                .to_string(),
            3,
            vec!["key `notify` in dbs[0]", "top-level only"],
        ),
    ] {
        let (l, msg) = fail(&text);
        for p in &parts {
            assert!(msg.contains(p), "{msg:?} does not contain {p:?}\n{text}");
        }
        assert!(!msg.contains(":pw@"), "{msg}");
        // Rules over several keys name the line where their map starts.
        assert_eq!(l, Some(line), "{msg}");
    }
}
