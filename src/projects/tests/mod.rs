//! The projects file: parsing, indexes, key shapes and lookups (plain, hashed, secret,
//! scoped).

use super::*;

#[test]
fn parses_and_indexes() {
    let p = Projects::parse(
        br#"{"projects":[{"id":1,"name":"a","api_key":"phc_a","personal_api_keys":["phx_a"]},
                         {"id":2,"api_key":"phc_b"}]}"#,
    )
    .unwrap();
    assert_eq!(p.len(), 2);
    assert_eq!(p.by_api_key("phc_a").unwrap().id, 1);
    assert_eq!(p.by_personal_key("phx_a").unwrap().id, 1);
    assert!(p.by_api_key("phx_a").is_none());
    assert_eq!(p.by_id(2).unwrap().api_key, "phc_b");
}

#[test]
fn rejects_bad_files() {
    for (bad, why) in [
        (r#"{"projects":[{"id":1,"api_key":"phx_a"}]}"#, "personal"),
        (r#"{"projects":[{"id":1,"api_key":""}]}"#, "1-64"),
        (
            r#"{"projects":[{"id":1,"api_key":"a"},{"id":1,"api_key":"b"}]}"#,
            "duplicate",
        ),
        (
            r#"{"projects":[{"id":1,"api_key":"a"},{"id":2,"api_key":"a"}]}"#,
            "another",
        ),
        (
            r#"{"projects":[{"id":1,"api_key":"a","personal_api_keys":["phc_x"]}]}"#,
            "phx_",
        ),
        (
            r#"{"projects":[{"id":1,"api_key":"a","typo":1}]}"#,
            "unknown field",
        ),
    ] {
        let err = Projects::parse(bad.as_bytes()).unwrap_err().to_string();
        assert!(err.contains(why), "{bad}: {err}");
    }
}

#[test]
fn hashed_keys_authenticate_with_their_label() {
    let hash = hash_key("phx_secret");
    // Python's hashlib.sha256(b"phx_secret").hexdigest(), what PostHog's
    // `hash_key_value` writes after `sha256$`.
    assert_eq!(
        hash,
        "30e09a05dca2e5dca49128b7f09bba629763a8f4f386abb74d71d12a87209d3b"
    );
    let file = format!(
        r#"{{"projects":[{{"id":1,"api_key":"phc_a","personal_api_keys":["phx_plain",
            {{"sha256":"{hash}","label":"ci"}}]}},
            {{"id":2,"api_key":"phc_b","personal_api_keys":[{{"sha256":"sha256${}"}}]}}]}}"#,
        hash_key("phx_other").to_uppercase()
    );
    let p = Projects::parse(file.as_bytes()).unwrap();
    let (project, caller) = p.personal_key("phx_secret").unwrap();
    assert_eq!((project.id, caller.label.as_str()), (1, "ci"));
    let (_, caller) = p.personal_key("phx_plain").unwrap();
    assert_eq!(caller.label, "phx_...lain");
    let (project, caller) = p.personal_key("phx_other").unwrap();
    assert_eq!(project.id, 2);
    assert_eq!(
        caller.label,
        format!("key sha256:{}", &hash_key("phx_other")[..8])
    );
    assert!(p.personal_key("phx_secreT").is_none());
    assert_eq!(p.by_personal_key("phx_secret").unwrap().id, 1);
    for bad in [
        r#"{"sha256":"abc"}"#,
        r#"{"sha256":"x","label":"l","more":1}"#,
    ] {
        let file =
            format!(r#"{{"projects":[{{"id":1,"api_key":"a","personal_api_keys":[{bad}]}}]}}"#);
        assert!(Projects::parse(file.as_bytes()).is_err(), "{bad}");
    }
}

#[test]
fn new_keys_are_well_formed_and_accepted() {
    let project = new_key(false).unwrap();
    assert!(
        project.starts_with("phc_") && project.len() == 4 + 43,
        "{project}"
    );
    assert!(key_shape_is_valid(&project));
    let personal = new_key(true).unwrap();
    assert!(
        personal.starts_with("phx_") && personal.len() == 4 + 48,
        "{personal}"
    );
    assert!(
        !key_shape_is_valid(&personal),
        "a personal key never ingests"
    );
    let file = format!(
        r#"{{"projects":[{{"id":1,"api_key":"{project}","personal_api_keys":["{personal}"]}}]}}"#
    );
    let parsed = Projects::parse(file.as_bytes()).unwrap();
    assert_eq!(parsed.by_api_key(&project).unwrap().id, 1);
    assert_eq!(parsed.by_personal_key(&personal).unwrap().id, 1);
    // Every character of the alphabet turns up, none outside it, no key twice.
    let keys: Vec<String> = (0..200).map(|_| new_key(false).unwrap()).collect();
    let unique: std::collections::HashSet<&String> = keys.iter().collect();
    assert_eq!(unique.len(), keys.len());
    let mut seen: std::collections::BTreeSet<u8> = Default::default();
    for key in &keys {
        seen.extend(key.bytes().skip(4));
    }
    let alphabet: std::collections::BTreeSet<u8> = KEY_ALPHABET.iter().copied().collect();
    assert_eq!(seen, alphabet);
}

#[test]
fn key_shapes() {
    assert!(key_shape_is_valid("phc_abc"));
    assert!(!key_shape_is_valid(""));
    assert!(!key_shape_is_valid("phx_abc"));
    assert!(!key_shape_is_valid(&"a".repeat(65)));
    assert!(key_shape_is_valid(&"a".repeat(64)));
    assert!(!key_shape_is_valid("phc_é"));
}

#[test]
fn secret_keys_and_scoped_personal_keys() {
    let file = format!(
        r#"{{"projects":[{{"id":1,"api_key":"phc_a",
            "secret_api_keys":["phs_plain", {{"sha256":"{}","label":"next"}}],
            "personal_api_keys":[{{"sha256":"{}","label":"ro","scopes":["feature_flag:read"]}},
                                 {{"sha256":"{}","label":"all"}}]}}]}}"#,
        hash_key("phs_hashed"),
        hash_key("phx_ro"),
        hash_key("phx_all")
    );
    let p = Projects::parse(file.as_bytes()).unwrap();
    assert_eq!(
        p.secret_key("phs_plain").map(|(p, l)| (p.id, l)),
        Some((1, "phs_...lain".into()))
    );
    assert_eq!(
        p.secret_key("phs_hashed").map(|(p, l)| (p.id, l)),
        Some((1, "next".into()))
    );
    assert!(p.secret_key("phs_other").is_none());
    assert!(
        p.personal_key("phs_plain").is_none(),
        "a secret key is no personal key"
    );
    let (_, ro) = p.personal_key("phx_ro").unwrap();
    assert!(ro.allows("feature_flag:read"));
    assert!(!ro.allows("feature_flag:write"));
    assert!(!ro.allows("query:read"));
    let (_, all) = p.personal_key("phx_all").unwrap();
    assert!(all.allows("feature_flag:write") && all.allows("query:read"));
    let writer = Caller {
        project: 1,
        label: "w".into(),
        scopes: Some(Arc::from(vec!["feature_flag:write".to_owned()])),
    };
    assert!(writer.allows("feature_flag:read"), "write includes read");
    assert!(!writer.allows("cohort:read"));
    let star = Caller {
        scopes: Some(Arc::from(vec!["*".to_owned()])),
        ..writer
    };
    assert!(star.allows("cohort:write"));
    assert!(!key_shape_is_valid("phs_abc"), "a secret key never ingests");
    let secret = new_secret_key().unwrap();
    assert!(
        secret.starts_with("phs_") && secret.len() == 4 + 48,
        "{secret}"
    );
}

#[test]
fn rejects_bad_secret_keys_and_scopes() {
    for (bad, why) in [
        (r#""secret_api_keys":["phx_a"]"#, "phs_"),
        (
            r#""secret_api_keys":["phs_a","phs_b","phs_c"]"#,
            "at most 2",
        ),
        (r#""secret_api_keys":["phs_a","phs_a"]"#, "listed twice"),
        (
            r#""personal_api_keys":[{"sha256":"0000000000000000000000000000000000000000000000000000000000000000","scopes":[]}]"#,
            "at least one scope",
        ),
        (
            r#""personal_api_keys":[{"sha256":"0000000000000000000000000000000000000000000000000000000000000000","scopes":["flags"]}]"#,
            "is not one",
        ),
    ] {
        let file = format!(r#"{{"projects":[{{"id":1,"api_key":"phc_a",{bad}}}]}}"#);
        let err = Projects::parse(file.as_bytes()).unwrap_err().to_string();
        assert!(err.contains(why), "{bad}: {err}");
    }
}

#[test]
fn one_hash_cannot_be_both_a_personal_and_a_secret_key() {
    let hash = hash_key("phs_shared");
    let personal = format!(r#"{{"sha256":"{hash}","label":"p"}}"#);
    let secret = format!(r#"{{"sha256":"{hash}","label":"s"}}"#);
    for file in [
        format!(
            r#"{{"projects":[{{"id":7,"api_key":"phc_a","personal_api_keys":[{personal}],
                "secret_api_keys":[{secret}]}}]}}"#
        ),
        // Across projects, in either order.
        format!(
            r#"{{"projects":[{{"id":1,"api_key":"phc_a","secret_api_keys":[{secret}]}},
                {{"id":7,"api_key":"phc_b","personal_api_keys":[{personal}]}}]}}"#
        ),
        format!(
            r#"{{"projects":[{{"id":1,"api_key":"phc_a","personal_api_keys":[{personal}]}},
                {{"id":7,"api_key":"phc_b","secret_api_keys":[{secret}]}}]}}"#
        ),
    ] {
        let err = Projects::parse(file.as_bytes()).unwrap_err().to_string();
        assert!(
            err.contains("(id 7)") && err.contains("both personal_api_keys and secret_api_keys"),
            "{err}"
        );
    }
    // A hashed personal entry of a key without the prefix never matches.
    let file = format!(
        r#"{{"projects":[{{"id":1,"api_key":"phc_a","personal_api_keys":[{personal}]}}]}}"#
    );
    let p = Projects::parse(file.as_bytes()).unwrap();
    assert!(p.personal_key("phs_shared").is_none());
}

#[test]
fn upstream_secret_keys_are_kept_and_never_shown() {
    let file = r#"{"projects":[{"id":1,"api_key":"phc_a","upstream_secret_key":"phs_abcdefgh"},
        {"id":2,"api_key":"phc_b","upstream_secret_key":"phx_personal"},
        {"id":3,"api_key":"phc_c"}]}"#;
    let projects = Projects::parse(file.as_bytes()).unwrap();
    let one = projects.by_id(1).unwrap();
    let key = one.upstream_secret_key.as_ref().unwrap();
    assert_eq!(key.expose(), "phs_abcdefgh");
    let shown = format!("{one:?}");
    assert!(!shown.contains("abcdefgh"), "{shown}");
    assert_eq!(
        projects
            .by_id(2)
            .unwrap()
            .upstream_secret_key
            .as_ref()
            .unwrap()
            .expose(),
        "phx_personal"
    );
    assert!(projects.by_id(3).unwrap().upstream_secret_key.is_none());
    for bad in [r#""phc_x""#, r#""phs_""#, r#""phs_a b""#, "7"] {
        let file =
            format!(r#"{{"projects":[{{"id":1,"api_key":"phc_a","upstream_secret_key":{bad}}}]}}"#);
        let err = Projects::parse(file.as_bytes()).unwrap_err().to_string();
        assert!(
            err.contains("upstream_secret_key") || err.contains("invalid type"),
            "{bad}: {err}"
        );
    }
}

/// Scope names as PostHog writes them, and names that only look like them: an empty
/// or capitalised object, another action, no action, a missing object.
#[test]
fn scope_names_are_posthogs() {
    let ok = [
        "*",
        "feature_flag:read",
        "feature_flag:write",
        "query:read",
        "cohort:write",
    ];
    for scope in ok {
        assert_eq!(check_scopes(&[scope.to_owned()]), Ok(()), "{scope}");
    }
    let bad = [
        ":read",
        ":write",
        "Feature_flag:read",
        "feature-flag:read",
        "feature_flag1:read",
        "feature_flag:delete",
        "feature_flag:Read",
        "feature_flag:",
        "feature_flag",
        "feature_flag:read:write",
        "",
        "**",
    ];
    for scope in bad {
        let refused = check_scopes(&["feature_flag:read".to_owned(), scope.to_owned()]);
        assert!(
            refused.is_err_and(|e| e.contains(&format!("{scope:?}"))),
            "{scope}"
        );
    }
}
