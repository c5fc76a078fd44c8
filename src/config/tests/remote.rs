//! SFTP and WebDAV replicas: Litestream's keys and URL forms, replicad's host key keys, keys
//! of other backends refused, secrets kept out of `Debug`.

use super::*;
use crate::storage::object::Service;
use crate::storage::sftp::HostKeyCheck;

const HOST_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";

#[test]
fn sftp_replica_by_litestreams_keys() {
    let text = format!(
        "dbs:
  - path: /data/a.db
    replica:
      type: sftp
      host: backup.example.com:2222
      user: backup
      password: hunter2-secret
      key-path: /etc/replicad/id_ed25519
      host-key: {HOST_KEY}
      concurrent-writes: false
      path: /srv/backups/a
"
    );
    let c = parse(&text).unwrap();
    let r = &c.dbs[0].replicas[0];
    assert_eq!(
        (r.name.as_str(), r.url.as_str()),
        (
            "sftp",
            "sftp://backup@backup.example.com:2222/srv/backups/a"
        )
    );
    let s = r.sftp.clone().unwrap();
    assert_eq!(
        (s.host.as_str(), s.port, s.user.as_str()),
        ("backup.example.com", 2222, "backup")
    );
    assert_eq!(s.host_key, HostKeyCheck::Key(HOST_KEY.into()));
    assert_eq!(
        s.key_path.as_deref(),
        Some(std::path::Path::new("/etc/replicad/id_ed25519"))
    );
    assert!(!s.concurrent_writes);
    assert!(matches!(r.client(), Ok(AnyClient::Sftp(_))));
    let shown = format!("{c:?}");
    assert!(!shown.contains("hunter2-secret"), "{shown}");
}

#[test]
fn sftp_url_and_host_key_choices() {
    let c = parse(
        "dbs:\n  - path: /a.db\n    replica:\n      url: sftp://u@h/~/rel\n      known-hosts-path: /etc/ssh/ssh_known_hosts\n",
    )
    .unwrap();
    let s = c.dbs[0].replicas[0].sftp.clone().unwrap();
    assert_eq!((s.port, s.path.as_str()), (22, "rel"));
    assert_eq!(
        s.host_key,
        HostKeyCheck::KnownHosts(Some("/etc/ssh/ssh_known_hosts".into()))
    );
    let c = parse(
        "dbs:\n  - path: /a.db\n    replica:\n      type: sftp\n      host: h\n      user: u\n      insecure-skip-host-key-check: true\n",
    )
    .unwrap();
    assert_eq!(
        c.dbs[0].replicas[0].sftp.as_ref().unwrap().host_key,
        HostKeyCheck::Skip
    );
    assert_fail(
        &format!(
            "dbs:\n  - path: /a.db\n    replica:\n      type: sftp\n      host: h\n      user: u\n      host-key: {HOST_KEY}\n      insecure-skip-host-key-check: true\n"
        ),
        4,
        &["insecure-skip-host-key-check", "keep one"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: sftp\n      host: h\n",
        4,
        &["an sftp replica needs `user`"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      url: sftp://u:pw@h/x\n",
        4,
        &["credentials in a replica URL are refused"],
    );
}

#[test]
fn webdav_replica_by_keys_and_by_url() {
    let c = parse(
        "dbs:\n  - path: /a.db\n    replica:\n      type: webdav\n      webdav-url: https://dav.example.com/remote.php/dav/files/u/\n      webdav-username: u\n      webdav-password: dav-secret\n      path: backups/a\n",
    )
    .unwrap();
    let r = &c.dbs[0].replicas[0];
    assert_eq!(
        (r.name.as_str(), r.url.as_str()),
        (
            "webdav",
            "webdavs://dav.example.com/remote.php/dav/files/u/backups/a"
        )
    );
    let o = r.object.clone().unwrap();
    assert_eq!(o.service, Service::Webdav);
    assert_eq!(o.username.as_deref(), Some("u"));
    assert!(!format!("{c:?}").contains("dav-secret"));
    let c = parse("dbs:\n  - path: /a.db\n    replica:\n      url: webdav://127.0.0.1:8080/x/y\n")
        .unwrap();
    let o = c.dbs[0].replicas[0].object.clone().unwrap();
    assert_eq!(
        (o.endpoint.as_deref(), o.path.as_str()),
        (Some("http://127.0.0.1:8080"), "x/y")
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: webdav\n      path: x\n",
        4,
        &["a webdav replica needs `webdav-url`"],
    );
}

#[test]
fn keys_of_sftp_and_webdav_stay_with_them() {
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: s3\n      bucket: b\n      host-key: x\n",
        4,
        &["key `host-key` applies only to sftp replicas, not to a s3 replica"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: sftp\n      host: h\n      user: u\n      webdav-url: http://x\n",
        4,
        &["key `webdav-url` applies only to webdav replicas"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: webdav\n      webdav-url: http://x\n      bucket: b\n",
        4,
        &["key `bucket` applies only to s3 replicas, not to a webdav replica"],
    );
}

#[test]
fn litestream_url_with_user_key_and_no_credentials_in_urls() {
    // As Litestream: the `user` key completes a URL without one.
    let c = parse(
        "dbs:\n  - path: /a.db\n    replica:\n      url: sftp://h:2222/srv/a\n      user: bob\n",
    )
    .unwrap();
    let s = c.dbs[0].replicas[0].sftp.clone().unwrap();
    assert_eq!(
        (s.user.as_str(), s.port, s.path.as_str()),
        ("bob", 2222, "/srv/a")
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      url: sftp://h/srv/a\n",
        4,
        &["an sftp replica needs `user`"],
    );
    for url in [
        "sftp://bob:pa/ss@h/x",
        "webdav://u:pa/ss@h/x",
        "webdavs://u:pw@h/x",
    ] {
        let (_, msg) = fail(&format!(
            "dbs:\n  - path: /a.db\n    replica:\n      url: {url}\n"
        ));
        assert!(
            msg.contains("refused") || msg.contains("webdav[s]://"),
            "{url}: {msg}"
        );
        assert!(
            !msg.contains("pa/ss") && !msg.contains(":pw"),
            "{url}: {msg}"
        );
    }
    let (_, msg) = fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: webdav\n      webdav-url: https://u:s3cret@h/dav\n",
    );
    assert!(
        msg.contains("credentials in webdav-url are refused") && !msg.contains("s3cret"),
        "{msg}"
    );
}
