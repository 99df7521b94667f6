//! Behind the shipped nginx site, a client cannot choose its address with a spoofed
//! leftmost `X-Forwarded-For` entry: not to escape the failed-key limit, and not to
//! lock a victim out.

use crate::ops::{from_client, Nginx};
use crate::util::*;

const FLAGS: &str = "/api/projects/1/feature_flags/";

fn guess(nginx: &Nginx, client: &str, spoofed: &str, key: &str) -> Resp {
    let req = Req::get(FLAGS).header("Authorization", &format!("Bearer {key}"));
    nginx.request(from_client(req, client, spoofed))
}

#[test]
#[ignore = "needs nginx: run by .ci/run, cargo test -- --include-ignored"]
fn a_spoofed_leftmost_forwarded_entry_neither_escapes_the_limit_nor_locks_out_its_victim() {
    let server = Server::start();
    let nginx = Nginx::start(server.addr);
    let (attacker, victim) = ("81.2.69.160", "2.125.160.216");
    // Each guess claims another address, the victim's among them.
    let mut statuses = Vec::new();
    for i in 0..30 {
        let spoofed = match i % 3 {
            0 => victim.to_owned(),
            _ => format!("203.0.113.{i}"),
        };
        statuses.push(guess(&nginx, attacker, &spoofed, &format!("phx_guess_{i}")).status);
    }
    let checked = statuses.iter().filter(|&&s| s == 401).count();
    assert!(
        (20..=21).contains(&checked),
        "the attacker's own address was limited: {statuses:?}"
    );
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    // The victim, whose address the attacker wrote on the left, is not locked out.
    let r = guess(&nginx, victim, "", PERSONAL_ONE);
    assert_eq!(r.status, 200, "{}", r.text());
    // The attacker is, even with the right key and a clean header.
    let r = guess(&nginx, attacker, victim, PERSONAL_ONE);
    assert_eq!(r.status, 429, "{}", r.text());
}
