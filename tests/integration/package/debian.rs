//! The package itself and what installing it made: `systemd/debian/build.sh` run on
//! the tested binary, the package's contents, conffiles, maintainer scripts and
//! lintian's verdict, and after `apt install` the user, the folders, their owners and
//! modes, the fresh keys and the installed unit.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::{PROJECTS, REPO};
use crate::ops::tool;
use crate::util::*;

/// Run a command; its stdout, or a failure with everything it said.
pub(super) fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

pub(super) fn apt(args: &[&str]) -> String {
    run(Command::new(tool("apt-get"))
        .args(["-y", "-q", "--no-install-recommends"])
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// Owner, group and permission bits of a path.
pub(super) fn owner(path: &str) -> (String, String, u32) {
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

/// The package as `build.sh` makes it by default; its path and version, which must
/// be Cargo.toml's, `+git`, the UTC time of the build and the commit.
pub(super) fn build(dir: &Path) -> (String, String) {
    let out = run(Command::new("bash")
        .arg(format!("{REPO}/systemd/debian/build.sh"))
        .args(["--bin", env!("CARGO_BIN_EXE_flagpost")])
        .args(["--compression", "gzip"])
        .arg("--out")
        .arg(dir));
    let deb = out.trim().to_owned();
    let arch = run(Command::new("dpkg").arg("--print-architecture"));
    let name = deb.rsplit('/').next().unwrap();
    let version = name
        .strip_prefix("flagpost_")
        .and_then(|n| n.strip_suffix(&format!("_{}.deb", arch.trim())))
        .unwrap_or_else(|| panic!("{deb}"))
        .to_owned();
    let build = version
        .strip_prefix(concat!(env!("CARGO_PKG_VERSION"), "+git"))
        .unwrap_or_else(|| panic!("{version}"));
    let (time, commit) = build.split_once('.').unwrap_or((build, ""));
    let digits = time.len() == 14 && time.bytes().all(|b| b.is_ascii_digit());
    assert!(digits && !commit.is_empty(), "{version}");
    (deb, version)
}

/// What the package holds and declares, before it goes anywhere near the machine.
pub(super) fn check_package(deb: &str) {
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
        "./usr/share/doc/flagpost/third-party-notices.gz",
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
    // dpkg keeps conffiles' sums itself, as dh_md5sums leaves them out.
    let sums = read("md5sums");
    assert!(sums.contains("  usr/bin/flagpost\n"), "{sums}");
    assert!(!sums.contains("etc/flagpost"), "{sums}");
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
pub(super) fn check_installed() -> String {
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
    let notices = run(Command::new("zcat").arg("/usr/share/doc/flagpost/third-party-notices.gz"));
    for shipped in [
        "Leon Sorokin",
        "\n  hyper 1.",
        "\n  tokio 1.",
        "Apache License",
    ] {
        assert!(notices.contains(shipped), "{shipped} missing:\n{notices}");
    }
    // Only what runs in the binary: not the test crates, not the proc-macros.
    for absent in ["\n  tempfile ", "\n  serde_derive "] {
        assert!(!notices.contains(absent), "{absent} listed");
    }
    let unit = installed_unit();
    let verify = Command::new(tool("systemd-analyze"))
        .args(["verify", "--man=no", &unit])
        .output()
        .unwrap();
    let said = text(&verify.stdout) + &text(&verify.stderr);
    assert!(verify.status.success() && said.is_empty(), "{said}");
    key
}

pub(super) fn installed_unit() -> String {
    let files = run(Command::new("dpkg").args(["--listfiles", "flagpost"]));
    let unit = files
        .lines()
        .find(|l| l.ends_with("/system/flagpost.service"));
    unit.expect("the package's unit").to_owned()
}
