//! The Debian package, as an operator uses it: built by `systemd/debian/build.sh` from
//! the tested binary, its contents, conffiles and maintainer scripts checked, `lintian`
//! clean (what it notes is explained in `systemd/debian/lintian-overrides`), installed
//! with `apt` (`debian`), then the installed binary run with the installed unit's own
//! `ExecStart=` under the unit's view of the machine (`sandbox`): a key made with
//! `flagpost key new`, flags created through the management API and through the
//! console, an event, `flagpost backup` as the service's user through the admin socket
//! and from the stopped database, a restart, the layout before `--flags-dir` refused as
//! issue 42 found it, an upgrade between two builds of default versions, a reinstall
//! over a deleted conffile and flags left in `/etc`, a removal that keeps the data and a
//! purge that leaves the machine as it was.
//!
//! It installs a package system-wide, so it needs root (as `.ci/run` runs), dpkg,
//! apt and lintian, and refuses to run over a flagpost already installed or over any
//! folder of one left behind.

mod debian;
mod sandbox;

use std::path::Path;
use std::process::Command;

use serde_json::json;

use crate::ops::tool;
use crate::util::*;
use debian::{apt, owner, run};
use sandbox::{Service, Unit};

const REPO: &str = env!("CARGO_MANIFEST_DIR");
const PROJECTS: &str = "/etc/flagpost/projects.json";
const FLAGS: &str = "/var/lib/flagpost/flags/1.json";
const BACKUPS: &str = "/var/backups/flagpost";
const BACKUP: &str = "/var/backups/flagpost/ci";
const STOPPED_BACKUP: &str = "/var/backups/flagpost/ci-stopped";
const ENV: &str = "/etc/flagpost/flagpost.env";
/// Where flags were kept before `--flags-dir`.
const OLD_FLAGS: &str = "/etc/flagpost/flags";
/// The util client's `Host: localhost` makes this the console's own origin.
const ORIGIN: &str = "http://localhost";

#[test]
#[ignore = "needs root, dpkg, lintian: run by .ci/run, cargo test -- --include-ignored"]
fn the_package_installs_and_runs_as_the_unit_confines_it() {
    let _cleanup = fresh_machine();
    let dir = tempfile::tempdir().unwrap();
    // build.sh's default version, as an operator's rebuilds get it.
    let (v1, version1) = debian::build(&dir.path().join("v1"));
    debian::check_package(&v1);

    apt(&["install", &v1]);
    let api_key = debian::check_installed();
    let unit = Unit::read(Path::new(&debian::installed_unit()));
    let bin = unit.exec_start[0].clone();
    assert_eq!(bin, "/usr/bin/flagpost");
    let mut service = Service::start(&unit);
    let probe = service.inside("touch /etc/flagpost/probe 2>&1; touch /usr/probe 2>&1");
    let said = text(&probe.stdout);
    assert_eq!(said.matches("Read-only file system").count(), 2, "{said}");
    assert!(
        !service.log().contains("cannot be written"),
        "{}",
        service.log()
    );

    let bearer = format!("Bearer {}", personal_key(&service, &bin));
    create_flags(&service, &bearer);
    let event = json!({"api_key": api_key, "event": "installed", "distinct_id": "ops"});
    let r = service.send(Req::post("/capture/", event.to_string()));
    assert_eq!(r.text(), "{\"status\":1}");
    backup(&bin, BACKUP, "taken by the running server");
    assert_eq!(service.stop(), Some(0), "{}", service.log());
    backup(&bin, STOPPED_BACKUP, "taken from the stopped database");

    old_layout_refuses_writes(&unit, &bearer);
    restart_keeps_everything(&unit, &bearer, &api_key);
    // Built minutes after the first, so its default version is higher.
    let (v2, version2) = debian::build(&dir.path().join("v2"));
    let newer = ["--compare-versions", &version2, "gt", &version1];
    run(Command::new("dpkg").args(newer));
    upgrade_keeps_everything(&v2);
    reinstall_takes_old_flags(&v2);
    // The unit as the upgrade left it, not as it was before.
    let unit = Unit::read(Path::new(&debian::installed_unit()));
    restart_keeps_everything(&unit, &bearer, &api_key);
    remove_then_purge();
}

/// Refuses to touch a machine with flagpost on it; the guard undoes the test's changes.
fn fresh_machine() -> Cleanup {
    // SAFETY: geteuid reads the process's effective user id and nothing else.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "installing a package needs root");
    let tools = [
        "apt-get",
        "dpkg-deb",
        "dpkg-shlibdeps",
        "lintian",
        "unshare",
        "setpriv",
    ];
    for t in tools.into_iter().chain(["nsenter", "ip"]) {
        tool(t);
    }
    let status = Command::new("dpkg").args(["--status", "flagpost"]).output();
    let installed = status.unwrap().status.success();
    assert!(!installed, "flagpost is installed already; remove it first");
    // The test purges what it installed: a folder here already is someone's data.
    for left in ["/etc/flagpost", "/var/lib/flagpost", BACKUPS] {
        assert!(
            !Path::new(left).exists(),
            "{left} exists already: move it away before running this test"
        );
    }
    let user = Command::new("getent").args(["passwd", "flagpost"]).status();
    Cleanup {
        made_user: !user.unwrap().success(),
    }
}

/// Puts the machine back as it was, even when the test fails half-way.
struct Cleanup {
    made_user: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // The purge keeps what the package did not make: the old-layout flags folder
        // the test made, the backups it took, then their folder if nothing else is in it.
        let _ = std::fs::remove_dir_all(OLD_FLAGS);
        let _ = Command::new("dpkg").args(["--purge", "flagpost"]).output();
        for made in [BACKUP, STOPPED_BACKUP] {
            let _ = std::fs::remove_dir_all(made);
        }
        let _ = std::fs::remove_dir(BACKUPS);
        if self.made_user {
            let _ = Command::new("userdel").arg("flagpost").output();
            let _ = Command::new("groupdel").arg("flagpost").output();
        }
    }
}

/// A personal key made as the docs say (as root, stored hashed in `/etc`), once the
/// running server takes it.
fn personal_key(service: &Service, bin: &str) -> String {
    let args = ["key", "new", "--project", "1", "--label", "ci"];
    let out = run(Command::new(bin)
        .args(args)
        .args(["--data-dir", "/etc/flagpost"]));
    let key = out.trim().to_owned();
    assert!(key.starts_with("phx_"), "{key}");
    assert_eq!(owner(PROJECTS), ("root".into(), "flagpost".into(), 0o640));
    let stored = std::fs::read_to_string(PROJECTS).unwrap();
    assert!(
        !stored.contains(&key) && stored.contains("\"sha256\""),
        "{stored}"
    );
    let bearer = format!("Bearer {key}");
    wait_for("the server to take the new key", || {
        let list = Req::get("/api/projects/1/feature_flags/").header("Authorization", &bearer);
        (service.send(list).status == 200).then_some(())
    });
    key
}

fn flag(key: &str) -> String {
    json!({"key": key, "filters": {"groups": [{"rollout_percentage": 100}]}}).to_string()
}

fn create_with_api(service: &Service, bearer: &str, key: &str) -> Resp {
    service.send(
        Req::post("/api/projects/1/feature_flags/", flag(key))
            .header("Authorization", bearer)
            .header("Content-Type", "application/json"),
    )
}

/// One flag through PostHog's API, one through the console, both in the state directory.
fn create_flags(service: &Service, bearer: &str) {
    let r = create_with_api(service, bearer, "from-api");
    assert_eq!(r.status, 201, "{}\n{}", r.text(), service.log());
    let key = bearer.strip_prefix("Bearer ").unwrap();
    let r = service.send(
        Req::post("/console/api/session", json!({"key": key}).to_string())
            .header("Content-Type", "application/json")
            .header("Origin", ORIGIN),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let cookie = r.header("set-cookie").unwrap().split(';').next().unwrap();
    let token = r.json()["token"].as_str().unwrap().to_owned();
    let r = service.send(
        Req::post("/console/api/feature_flags/", flag("from-console"))
            .header("Cookie", cookie)
            .header("Origin", ORIGIN)
            .header("X-Flagpost-Token", &token)
            .header("Content-Type", "application/json"),
    );
    assert_eq!(r.status, 201, "{}\n{}", r.text(), service.log());
    assert_eq!(owner(FLAGS).0, "flagpost");
    let flags = std::fs::read_to_string(FLAGS).unwrap();
    let both = flags.contains("\"from-api\"") && flags.contains("\"from-console\"");
    assert!(both, "{flags}");
}

/// `flagpost backup` as the docs say, as the service's user: through the admin socket
/// the sandboxed server writes it, with the server stopped the command does; either way
/// into the backups folder, and nothing in the state directory left to another owner.
fn backup(bin: &str, to: &str, source: &str) {
    let db = "/var/lib/flagpost/db";
    let said = run(Command::new("runuser")
        .args(["-u", "flagpost", "--", bin])
        .args(["backup", "--db", db, "--to", to]));
    assert!(said.contains(source), "{said}");
    assert_eq!(owner(to).0, "flagpost");
    assert!(Path::new(to).join("manifest.json").exists(), "{said}");
    let everything =
        run(Command::new("find").args(["/var/lib/flagpost", "!", "-user", "flagpost"]));
    assert_eq!(everything, "", "not the service's");
}

/// The layout before `--flags-dir`, the flags under the read-only `/etc`, as issue 42
/// found it: every write fails, and the server says why when it starts.
fn old_layout_refuses_writes(unit: &Unit, bearer: &str) {
    let mut old = unit.clone();
    let at = old.exec_start.iter().position(|a| a == "--flags-dir");
    let at = at.expect("the unit gives --flags-dir");
    old.exec_start.drain(at..at + 2);
    let mut service = Service::start(&old);
    let warning = "the flags directory /etc/flagpost/flags cannot be written";
    assert!(service.log().contains(warning), "{}", service.log());
    let r = create_with_api(&service, bearer, "refused");
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!(r.json()["code"], "flags_file_unusable");
    assert_eq!(service.stop(), Some(0), "{}", service.log());
}

/// An upgrade keeps the configuration (an edited conffile too), the flags and the data.
fn upgrade_keeps_everything(deb: &str) {
    let edited = std::fs::read_to_string(ENV).unwrap() + "FLAGPOST_RETENTION_DAYS=400\n";
    std::fs::write(ENV, &edited).unwrap();
    let files = || [PROJECTS, FLAGS].map(|f| std::fs::read(f).unwrap());
    let before = files();
    apt(&["install", deb]);
    assert_eq!(files(), before);
    assert_eq!(std::fs::read_to_string(ENV).unwrap(), edited);
}

/// Installed again over what an administrator may leave: the conffile deleted (dpkg
/// keeps it deleted, and the postinst must not trip on it), and the flags where a
/// deployment before `--flags-dir` kept them, which the postinst copies into the
/// empty state directory.
fn reinstall_takes_old_flags(deb: &str) {
    std::fs::remove_file(ENV).unwrap();
    std::fs::create_dir(OLD_FLAGS).unwrap();
    let flags = std::fs::read(FLAGS).unwrap();
    std::fs::rename(FLAGS, Path::new(OLD_FLAGS).join("1.json")).unwrap();
    let said = apt(&["install", "--reinstall", deb]);
    assert!(
        said.contains("copied the flag files of /etc/flagpost/flags"),
        "{said}"
    );
    assert!(!Path::new(ENV).exists());
    assert_eq!(std::fs::read(FLAGS).unwrap(), flags);
    assert_eq!(owner(FLAGS).0, "flagpost");
    std::fs::remove_dir_all(OLD_FLAGS).unwrap();
}

/// Removing keeps the data; purging takes it, and leaves the backups alone.
fn remove_then_purge() {
    apt(&["remove", "flagpost"]);
    assert!(!Path::new("/usr/bin/flagpost").exists());
    assert!(Path::new(PROJECTS).exists() && Path::new(FLAGS).exists());
    assert!(Path::new("/var/lib/flagpost/db").exists());
    apt(&["purge", "flagpost"]);
    for gone in ["/etc/flagpost", "/var/lib/flagpost"] {
        assert!(!Path::new(gone).exists(), "{gone} survived the purge");
    }
    assert!(Path::new(BACKUP).join("manifest.json").exists());
}

/// Started again (after a stop or an upgrade): both flags, the key, the event, and
/// `/decide` answering with the flags; then stopped as systemd stops it.
fn restart_keeps_everything(unit: &Unit, bearer: &str, api_key: &str) {
    let mut service = Service::start(unit);
    everything_kept(&service, bearer, api_key);
    assert_eq!(service.stop(), Some(0), "{}", service.log());
}

fn everything_kept(service: &Service, bearer: &str, api_key: &str) {
    let r =
        service.send(Req::get("/api/projects/1/feature_flags/").header("Authorization", bearer));
    assert_eq!(r.status, 200, "{}", r.text());
    let mut keys: Vec<String> = r.json()["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["key"].as_str().unwrap().to_owned())
        .collect();
    keys.sort();
    assert_eq!(keys, ["from-api", "from-console"]);
    let events = || {
        let r = service.send(
            Req::get("/api/projects/1/events/?distinct_id=ops").header("Authorization", bearer),
        );
        let found = r.json()["results"].as_array().map_or(0, Vec::len);
        (found == 1).then_some(())
    };
    wait_for("the event, stored", events);
    let decide = json!({"token": api_key, "distinct_id": "ops"});
    let r = service.send(Req::post("/decide/?v=3", decide.to_string()));
    assert_eq!(
        r.json()["featureFlags"],
        json!({"from-api": true, "from-console": true})
    );
}
