//! Trusted proxies: whose `X-Forwarded-For` is believed, and how it is read.

use super::*;

#[test]
fn untrusted_peer_cannot_choose_its_address() {
    let trusted = TrustedProxies::loopback_only();
    let peer = ip("203.0.113.7");
    assert_eq!(client_ip(peer, Some(b"81.2.69.160"), &trusted), peer);
    assert_eq!(client_ip(peer, None, &trusted), peer);
}

#[test]
fn trusted_peer_gives_the_rightmost_untrusted_address() {
    let trusted = TrustedProxies::loopback_only();
    let peer = ip("127.0.0.1");
    // nginx's $proxy_add_x_forwarded_for appended the real address to what the client
    // sent: the client's own entries on the left are never believed.
    let spoofed: &[u8] = b"6.6.6.6, 81.2.69.160";
    assert_eq!(client_ip(peer, Some(spoofed), &trusted), ip("81.2.69.160"));
    // Trusted hops on the right are passed over; the first other address is the client.
    let header: &[u8] = b"81.2.69.160, 10.0.0.1, 127.0.0.1";
    assert_eq!(client_ip(peer, Some(header), &trusted), ip("10.0.0.1"));
    let chain = TrustedProxies::parse("127.0.0.1, 10.0.0.0/8").unwrap();
    assert_eq!(client_ip(peer, Some(header), &chain), ip("81.2.69.160"));
    assert_eq!(
        client_ip(peer, Some(b"1.1.1.1, 81.2.69.160, 10.0.0.1"), &chain),
        ip("81.2.69.160")
    );
    // Every hop trusted: the leftmost is as far as the chain goes.
    assert_eq!(
        client_ip(peer, Some(b"10.0.0.2, 10.0.0.1"), &chain),
        ip("10.0.0.2")
    );
    assert_eq!(
        client_ip(ip("::1"), Some(b"2001:218::1"), &trusted),
        ip("2001:218::1")
    );
    // An entry that does not parse stops the walk at the last good one.
    assert_eq!(
        client_ip(peer, Some(b"6.6.6.6, garbage, 81.2.69.160"), &trusted),
        ip("81.2.69.160")
    );
    assert_eq!(
        client_ip(peer, Some(b"6.6.6.6, garbage, 10.0.0.1"), &chain),
        ip("10.0.0.1")
    );
    assert_eq!(client_ip(peer, None, &trusted), peer);
}

#[test]
fn an_ipv6_subscriber_is_its_64() {
    assert_eq!(
        subscriber(ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd")),
        ip("2001:db8:1:2::")
    );
    assert_eq!(subscriber(ip("::ffff:81.2.69.160")), ip("81.2.69.160"));
    assert_eq!(subscriber(ip("81.2.69.160")), ip("81.2.69.160"));
}

#[test]
fn malformed_forwarded_header_falls_back_to_peer() {
    let trusted = TrustedProxies::loopback_only();
    let peer = ip("127.0.0.1");
    let malformed: [&[u8]; 12] = [
        b"",
        b"   ",
        b"unknown",
        b", 81.2.69.160",
        b"81.2.69.160:",
        b"81.2.69.160:123456",
        b"81.2.69.160:80x",
        b"[::1",
        b"[::1]x",
        b"[81.2.69.160]",
        b"81.2.69",
        b"\xff\xfe81.2.69.160",
    ];
    for header in malformed {
        assert_eq!(
            forwarded_for(header),
            None,
            "{:?}",
            String::from_utf8_lossy(header)
        );
        // Read from the right, an entry that does not parse ends the walk there.
        if !header.contains(&b',') {
            assert_eq!(client_ip(peer, Some(header), &trusted), peer);
        }
    }
    assert_eq!(
        client_ip(peer, Some(b", 81.2.69.160"), &trusted),
        ip("81.2.69.160")
    );
    assert_eq!(
        client_ip(peer, Some(b"81.2.69.160,garbage"), &trusted),
        peer
    );
}

#[test]
fn forwarded_for_strips_ports_brackets_and_whitespace() {
    let cases: [(&[u8], &str); 8] = [
        (b"81.2.69.160", "81.2.69.160"),
        (b" \t81.2.69.160:5678 , 10.0.0.1", "81.2.69.160"),
        (b"[2001:218::1]:443", "2001:218::1"),
        (b"[::1]", "::1"),
        (b"2001:218::1", "2001:218::1"),
        (b"::ffff:81.2.69.160", "81.2.69.160"),
        (b"[::ffff:81.2.69.160]:80,x", "81.2.69.160"),
        (b"81.2.69.160,garbage", "81.2.69.160"),
    ];
    for (header, expected) in cases {
        assert_eq!(forwarded_for(header), Some(ip(expected)), "{expected}");
    }
}

#[test]
fn ipv4_mapped_peers_and_entries_are_judged_as_ipv4() {
    let loopback = TrustedProxies::loopback_only();
    assert!(loopback.contains(ip("::ffff:127.0.0.1")));
    assert!(loopback.contains(ip("::ffff:127.9.9.9")));
    // A dual-stack listener reports IPv4 peers this way; the result is canonical.
    let peer = ip("::ffff:203.0.113.7");
    assert_eq!(
        client_ip(peer, Some(b"1.2.3.4"), &loopback),
        ip("203.0.113.7")
    );
    let proxy = ip("::ffff:127.0.0.1");
    assert_eq!(client_ip(proxy, None, &loopback), ip("127.0.0.1"));
    assert_eq!(client_ip(proxy, Some(b"1.2.3.4"), &loopback), ip("1.2.3.4"));

    let mapped = TrustedProxies::parse("::ffff:10.0.0.0/104, ::ffff:192.0.2.1").unwrap();
    assert_eq!(
        mapped,
        TrustedProxies::parse("10.0.0.0/8,192.0.2.1/32").unwrap()
    );
    assert!(mapped.contains(ip("10.200.0.1")));
    assert!(mapped.contains(ip("::ffff:10.200.0.1")));
    assert!(!mapped.contains(ip("11.0.0.0")));
}

#[test]
fn loopback_only_is_the_default() {
    let trusted = TrustedProxies::default();
    assert_eq!(trusted, TrustedProxies::parse("127.0.0.0/8, ::1").unwrap());
    for yes in ["127.0.0.1", "127.255.255.255", "::1"] {
        assert!(trusted.contains(ip(yes)), "{yes}");
    }
    for no in [
        "128.0.0.1",
        "126.255.255.255",
        "10.0.0.1",
        "::2",
        "::",
        "0.0.0.0",
    ] {
        assert!(!trusted.contains(ip(no)), "{no}");
    }
}

#[test]
fn cidr_membership_edges() {
    let trusted =
        TrustedProxies::parse("10.0.0.0/8,192.168.1.0/24,203.0.113.9,2001:db8::/32").unwrap();
    for yes in [
        "10.0.0.0",
        "10.255.255.255",
        "192.168.1.0",
        "192.168.1.255",
        "203.0.113.9",
        "2001:db8::",
        "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
    ] {
        assert!(trusted.contains(ip(yes)), "{yes}");
    }
    for no in [
        "9.255.255.255",
        "11.0.0.0",
        "192.168.0.255",
        "192.168.2.0",
        "203.0.113.8",
        "203.0.113.10",
        "2001:db7:ffff:ffff:ffff:ffff:ffff:ffff",
        "2001:db9::",
        // IPv4-compatible (not mapped) ::10.0.0.1 is an IPv6 address, outside 10/8.
        "::a00:1",
    ] {
        assert!(!trusted.contains(ip(no)), "{no}");
    }

    let everything_v4 = TrustedProxies::parse("0.0.0.0/0").unwrap();
    assert!(everything_v4.contains(ip("255.255.255.255")));
    assert!(everything_v4.contains(ip("0.0.0.0")));
    assert!(!everything_v4.contains(ip("::1")));
    let everything_v6 = TrustedProxies::parse("::/0").unwrap();
    assert!(everything_v6.contains(ip("2001:db8::1")));
    assert!(!everything_v6.contains(ip("1.2.3.4")));

    // Host bits below the prefix are ignored.
    let loose = TrustedProxies::parse("10.1.2.3/8, 2001:db8::1/32").unwrap();
    assert_eq!(
        loose,
        TrustedProxies::parse("10.0.0.0/8,2001:db8::/32").unwrap()
    );
}

#[test]
fn trusted_proxy_list_syntax() {
    assert_eq!(TrustedProxies::parse("").unwrap().nets, vec![]);
    assert!(!TrustedProxies::parse(" , ")
        .unwrap()
        .contains(ip("127.0.0.1")));
    let spaced = TrustedProxies::parse(" 127.0.0.1 , ::1 ,10.0.0.0 / 8,").unwrap();
    assert_eq!(
        spaced,
        TrustedProxies::parse("127.0.0.1,::1,10.0.0.0/8").unwrap()
    );

    let bad = [
        "10.0.0.0/33",
        "::/129",
        "10.0.0.0/",
        "/8",
        "10.0.0.0/+8",
        "10.0.0.0/-1",
        "10.0.0.0/8/8",
        "10.0.0.0/0008",
        "1.2.3.4:80",
        "[::1]",
        "localhost",
    ];
    for entry in bad {
        match TrustedProxies::parse(&format!("127.0.0.1,{entry}")) {
            Err(Error::Proxy { entry: reported }) => assert_eq!(reported, entry.trim()),
            other => panic!("{entry}: expected a proxy error, got {other:?}"),
        }
    }
    let error = TrustedProxies::parse("10.0.0.0/33").unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid trusted proxy \"10.0.0.0/33\": expected an IP address or a CIDR network \
         such as 10.0.0.0/8"
    );
}
