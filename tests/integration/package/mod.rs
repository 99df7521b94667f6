//! The Debian package, as an operator uses it: built by `systemd/debian/build.sh` from
//! the tested binary, its contents, conffiles and maintainer scripts checked, `lintian`
//! clean (what it notes is explained in `systemd/debian/lintian-overrides`), installed
//! with `apt`, then the installed binary run with the installed unit's own `ExecStart=`
//! under the unit's view of the machine (`sandbox`): a key made with `flagpost key
//! new`, flags created through the management API and through the console, an event,
//! `flagpost backup` through the admin socket, a restart, an upgrade, a removal that
//! keeps the data and a purge that leaves the machine as it was.
//!
//! It installs a package system-wide, so it needs root (as `.ci/run` runs), dpkg,
//! apt and lintian, and refuses to run over a flagpost already installed.

mod sandbox;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::ops::tool;
use crate::util::*;
use sandbox::{Service, Unit};

const REPO: &str = env!("CARGO_MANIFEST_DIR");
const PROJECTS: &str = "/etc/flagpost/projects.json";
const FLAGS: &str = "/var/lib/flagpost/flags/1.json";
/// The util client's `Host: localhost` makes this the console's own origin.
const ORIGIN: &str = "http://localhost";

/// Run a command; its stdout, or a failure with everything it said.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

fn apt(args: &[&str]) -> String {
    run(Command::new(tool("apt-get"))
        .args(["-y", "-q", "--no-install-recommends"])
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// Owner, group and permission bits of a path.
fn owner(path: &str) -> (String, String, u32) {
    let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let name = |db: &str, id: u32| {
        let line = run(Command::new("getent").args([db, &id.to_string()]));
        line.split(':').next().unwrap().to_owned()
    };
    (
        name("passwd", meta.uid()),
        name("group", meta.gid()),
        meta.mode() & 0o7777,
    )
}

/// Puts the machine back as it was, even when the test fails half-way.
struct Cleanup {
    made_user: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "flagpost"]).output();
        let _ = std::fs::remove_dir_all("/var/backups/flagpost");
        if self.made_user {
            let _ = Command::new("userdel").arg("flagpost").output();
            let _ = Command::new("groupdel").arg("flagpost").output();
        }
    }
}

fn build(dir: &Path, version: &str) -> String {
    let out = run(Command::new("bash")
        .arg(format!("{REPO}/systemd/debian/build.sh"))
        .args([
            "--bin",
            env!("CARGO_BIN_EXE_flagpost"),
            "--version",
            version,
            "--compression",
            "gzip",
        ])
        .arg("--out")
        .arg(dir));
    let deb = out.trim().to_owned();
    let arch = run(Command::new("dpkg").arg("--print-architecture"));
    assert!(
        deb.ends_with(&format!("/flagpost_{version}_{}.deb", arch.trim())),
        "{deb}"
    );
    deb
}

/// What the package holds and declares, before it goes anywhere near the machine.
fn check_package(deb: &str) {
    let contents = run(Command::new(tool("dpkg-deb")).args(["--contents", deb]));
    let unit = [
        "./lib/systemd/system/flagpost.service",
        "./usr/lib/systemd/system/flagpost.service",
    ];
    assert!(unit.iter().any(|u| contents.contains(u)), "{contents}");
    for path in [
        "./usr/bin/flagpost",
        "./usr/lib/sysusers.d/flagpost.conf",
        "./usr/lib/tmpfiles.d/flagpost.conf",
        "./etc/flagpost/flagpost.env",
        "./usr/share/doc/flagpost/copyright",
        "./usr/share/doc/flagpost/changelog.gz",
        "./usr/share/doc/flagpost/examples/nginx.conf",
        "./usr/share/doc/flagpost/examples/clickhouse.conf",
        "./usr/share/man/man1/flagpost.1.gz",
    ] {
        assert!(
            contents.contains(&format!(" {path}\n")),
            "{path} missing:\n{contents}"
        );
    }
    // Keys are made at install, never shipped; nothing in /var either.
    assert!(!contents.contains("projects.json"), "{contents}");
    assert!(!contents.contains(" ./var/"), "{contents}");
    let control = tempfile::tempdir().unwrap();
    run(Command::new(tool("dpkg-deb"))
        .args(["--control", deb])
        .arg(control.path()));
    let read = |name: &str| std::fs::read_to_string(control.path().join(name)).unwrap();
    assert_eq!(read("conffiles"), "/etc/flagpost/flagpost.env\n");
    let fields = read("control");
    assert!(fields.contains("\nDepends: libc6 (>= "), "{fields}");
    for script in ["postinst", "prerm", "postrm"] {
        run(Command::new("sh")
            .arg("-n")
            .arg(control.path().join(script)));
    }
    assert!(read("postinst").contains("flagpost key new"));
    let lintian = run(Command::new(tool("lintian")).args(["--fail-on", "error,warning", deb]));
    let hints: Vec<&str> = lintian.lines().filter(|l| !l.starts_with("N:")).collect();
    assert!(hints.is_empty(), "lintian:\n{lintian}");
}

/// What the install made: the user, the folders and a projects.json of fresh keys.
fn check_installed() -> String {
    run(Command::new("getent").args(["passwd", "flagpost"]));
    let root_flagpost = |mode| ("root".to_owned(), "flagpost".to_owned(), mode);
    assert_eq!(owner("/etc/flagpost"), root_flagpost(0o750));
    assert_eq!(owner(PROJECTS), root_flagpost(0o640));
    assert_eq!(owner("/etc/flagpost/flagpost.env"), root_flagpost(0o640));
    let service = |mode| ("flagpost".to_owned(), "flagpost".to_owned(), mode);
    for dir in [
        "/var/lib/flagpost",
        "/var/lib/flagpost/flags",
        "/var/backups/flagpost",
    ] {
        assert_eq!(owner(dir), service(0o700), "{dir}");
    }
    let projects: Value = serde_json::from_slice(&std::fs::read(PROJECTS).unwrap()).unwrap();
    let key = projects["projects"][0]["api_key"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(key.starts_with("phc_") && key.len() > 30, "{key}");
    let demo = std::fs::read_to_string(format!("{REPO}/data/projects.json")).unwrap();
    assert!(!demo.contains(&key), "a demo key: {key}");
    let unit = installed_unit();
    let verify = Command::new(tool("systemd-analyze"))
        .args(["verify", "--man=no", &unit])
        .output()
        .unwrap();
    let said = text(&verify.stdout) + &text(&verify.stderr);
    assert!(verify.status.success() && said.is_empty(), "{said}");
    key
}

fn installed_unit() -> String {
    let files = run(Command::new("dpkg").args(["--listfiles", "flagpost"]));
    let unit = files
        .lines()
        .find(|l| l.ends_with("/system/flagpost.service"));
    unit.expect("the package's unit").to_owned()
}

#[test]
#[ignore = "needs root, dpkg, lintian: run by .ci/run, cargo test -- --include-ignored"]
fn the_package_installs_and_runs_as_the_unit_confines_it() {
    // SAFETY: geteuid reads the process's effective user id and nothing else.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "installing a package needs root"
    );
    for t in [
        "apt-get",
        "dpkg-deb",
        "dpkg-shlibdeps",
        "lintian",
        "unshare",
        "setpriv",
        "nsenter",
        "ip",
    ] {
        tool(t);
    }
    let installed = Command::new("dpkg")
        .args(["--status", "flagpost"])
        .output()
        .unwrap();
    assert!(
        !installed.status.success(),
        "flagpost is installed already; remove it first"
    );
    assert!(
        !Path::new("/etc/flagpost").exists(),
        "/etc/flagpost exists already"
    );
    let made_user = !Command::new("getent")
        .args(["passwd", "flagpost"])
        .status()
        .unwrap()
        .success();
    let _cleanup = Cleanup { made_user };

    let dir = tempfile::tempdir().unwrap();
    let version = env!("CARGO_PKG_VERSION");
    let v1 = build(&dir.path().join("v1"), &format!("{version}+ci1"));
    let v2 = build(&dir.path().join("v2"), &format!("{version}+ci2"));
    check_package(&v1);

    apt(&["install", &v1]);
    let api_key = check_installed();
    let unit = Unit::read(Path::new(&installed_unit()));
    assert_eq!(unit.exec_start[0], "/usr/bin/flagpost");
    let mut service = Service::start(&unit);
    let sandboxed = service.inside("touch /etc/flagpost/probe 2>&1; touch /usr/probe 2>&1");
    let said = text(&sandboxed.stdout);
    assert_eq!(said.matches("Read-only file system").count(), 2, "{said}");
    assert!(
        !service.log().contains("cannot be written"),
        "{}",
        service.log()
    );

    // A personal key, made as the docs say: as root, stored hashed in /etc.
    let personal = run(Command::new("flagpost").args([
        "key",
        "new",
        "--project",
        "1",
        "--label",
        "ci",
        "--data-dir",
        "/etc/flagpost",
    ]));
    let personal = personal.trim().to_owned();
    assert!(personal.starts_with("phx_"), "{personal}");
    assert_eq!(owner(PROJECTS), ("root".into(), "flagpost".into(), 0o640));
    let stored = std::fs::read_to_string(PROJECTS).unwrap();
    assert!(
        !stored.contains(&personal) && stored.contains("\"sha256\""),
        "{stored}"
    );
    let bearer = format!("Bearer {personal}");
    let list = || {
        let r = service
            .send(Req::get("/api/projects/1/feature_flags/").header("Authorization", &bearer));
        (r.status == 200).then(|| r.json())
    };
    wait_for("the server to take the new key", list);

    // A flag through PostHog's API, then one through the console.
    let flag =
        |key: &str| json!({"key": key, "filters": {"groups": [{"rollout_percentage": 100}]}});
    let r = service.send(
        Req::post(
            "/api/projects/1/feature_flags/",
            flag("from-api").to_string(),
        )
        .header("Authorization", &bearer)
        .header("Content-Type", "application/json"),
    );
    assert_eq!(r.status, 201, "{}\n{}", r.text(), service.log());
    let r = service.send(
        Req::post("/console/api/session", json!({"key": personal}).to_string())
            .header("Content-Type", "application/json")
            .header("Origin", ORIGIN),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let cookie = r
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let token = r.json()["token"].as_str().unwrap().to_owned();
    let r = service.send(
        Req::post(
            "/console/api/feature_flags/",
            flag("from-console").to_string(),
        )
        .header("Cookie", &cookie)
        .header("Origin", ORIGIN)
        .header("X-Flagpost-Token", &token)
        .header("Content-Type", "application/json"),
    );
    assert_eq!(r.status, 201, "{}\n{}", r.text(), service.log());
    assert_eq!(owner(FLAGS).0, "flagpost");
    let flags = std::fs::read_to_string(FLAGS).unwrap();
    assert!(
        flags.contains("\"from-api\"") && flags.contains("\"from-console\""),
        "{flags}"
    );

    let event = json!({"api_key": api_key, "event": "installed", "distinct_id": "ops"});
    let r = service.send(Req::post("/capture/", event.to_string()));
    assert_eq!(r.text(), "{\"status\":1}");

    // A backup through the admin socket, written by the server into its backups folder.
    let backup = run(Command::new("flagpost").args([
        "backup",
        "--db",
        "/var/lib/flagpost/db",
        "--to",
        "/var/backups/flagpost/ci",
    ]));
    assert!(backup.contains("taken by the running server"), "{backup}");
    assert_eq!(owner("/var/backups/flagpost/ci").0, "flagpost");
    assert!(
        Path::new("/var/backups/flagpost/ci/manifest.json").exists(),
        "{backup}"
    );

    assert_eq!(service.stop(), Some(0), "{}", service.log());

    // The layout before --flags-dir, the flags under the read-only /etc, as issue 42
    // found it: every write fails, and the server says why when it starts.
    let mut old = unit.clone();
    let at = old
        .exec_start
        .iter()
        .position(|a| a == "--flags-dir")
        .unwrap();
    old.exec_start.drain(at..at + 2);
    let service = Service::start(&old);
    assert!(
        service
            .log()
            .contains("the flags directory /etc/flagpost/flags cannot be written"),
        "{}",
        service.log()
    );
    let r = service.send(
        Req::post(
            "/api/projects/1/feature_flags/",
            flag("refused").to_string(),
        )
        .header("Authorization", &bearer)
        .header("Content-Type", "application/json"),
    );
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!(r.json()["code"], "flags_file_unusable");
    drop(service);

    let service = Service::start(&unit);
    everything_kept(&service, &bearer, &api_key);
    drop(service);

    // An upgrade keeps the configuration (an edited conffile too) and the data.
    let env = "/etc/flagpost/flagpost.env";
    let edited = std::fs::read_to_string(env).unwrap() + "FLAGPOST_RETENTION_DAYS=400\n";
    std::fs::write(env, &edited).unwrap();
    let before = (
        std::fs::read(PROJECTS).unwrap(),
        std::fs::read(FLAGS).unwrap(),
    );
    apt(&["install", &v2]);
    assert_eq!(
        (
            std::fs::read(PROJECTS).unwrap(),
            std::fs::read(FLAGS).unwrap()
        ),
        before
    );
    assert_eq!(std::fs::read_to_string(env).unwrap(), edited);
    let service = Service::start(&unit);
    everything_kept(&service, &bearer, &api_key);
    drop(service);

    // Removing keeps the data; purging takes it, and leaves the backups alone.
    apt(&["remove", "flagpost"]);
    assert!(!Path::new("/usr/bin/flagpost").exists());
    assert!(Path::new(PROJECTS).exists() && Path::new(FLAGS).exists());
    assert!(Path::new("/var/lib/flagpost/db").exists());
    apt(&["purge", "flagpost"]);
    for gone in ["/etc/flagpost", "/var/lib/flagpost"] {
        assert!(!Path::new(gone).exists(), "{gone} survived the purge");
    }
    assert!(Path::new("/var/backups/flagpost/ci/manifest.json").exists());
}

/// After a restart or an upgrade: both flags, the key, the event, and `/decide`.
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
