//! What a project tells its browser clients at start: posthog-js's remote config
//! (`/array/<key>/config`, `config.js`) and the same fields at the end of every
//! `/decide` and `/flags` answer. The project's switches in `projects.json`
//! (`remote_config`) turn on what PostHog's project settings control; features whose
//! data flagpost does not keep (session replay, console logs, conversations, product
//! tours) are always off, so the clients send nothing that would be thrown away.
//!
//! The bodies are written straight to JSON text: they end every decide answer, and
//! a handful of switches needs no value tree.

use serde::Deserialize;

/// Compression schemes the capture endpoints accept, advertised so clients compress.
pub const SUPPORTED_COMPRESSION: &str = r#"["gzip","gzip-js","lz64"]"#;
/// Where posthog-js sends events: the intake it uses before the config arrives, so a
/// page load's events all take one path. (PostHog's config names `/i/v0/e/`, which
/// flagpost serves too.)
pub const ANALYTICS_ENDPOINT: &str = "/e/";
/// Where exceptions go when autocaptured: the ordinary intake.
pub const EXCEPTIONS_ENDPOINT: &str = "/e/";
/// What `/decide` always said before remote config existed, and still says.
pub const DECIDE_ONLY: &str =
    r#""config":{"enable_collect_everything":true},"toolbarParams":{},"isAuthenticated":false,"#;

/// A project's switches, `"remote_config": {...}` in `projects.json`. Every switch is
/// off unless set, as in a new PostHog project.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Switches {
    /// Turn autocapture off (PostHog: "Autocapture" disabled).
    pub autocapture_opt_out: bool,
    /// Heatmaps: posthog-js sends `$$heatmap` events.
    pub heatmaps: bool,
    /// Exception autocapture: `$exception` events for uncaught errors.
    pub autocapture_exceptions: bool,
    /// Web vitals autocapture: `$web_vitals` events.
    pub web_vitals: bool,
    /// The web vitals to capture (`LCP`, `CLS`, `FCP`, `INP`); unset means all.
    pub web_vitals_allowed_metrics: Option<Vec<String>>,
    /// Network timing ("capture performance"). posthog-js records it only inside
    /// session replay, which flagpost does not keep; kept for parity with PostHog.
    pub capture_performance: bool,
    /// Dead click autocapture: `$dead_click` events.
    pub capture_dead_clicks: bool,
}

/// What the server knows about a project besides its switches, gathered in one place
/// (`http::remote_config::facts`) for every answer that carries the client config.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Facts {
    /// The project has a survey the clients should load (`surveys: true`).
    pub surveys: bool,
}

/// `/array/<key>/config`: the JSON object posthog-js reads, in PostHog's field order.
pub fn remote_config(token: &str, switches: &Switches, facts: Facts) -> Vec<u8> {
    let mut out = Vec::with_capacity(768);
    out.extend_from_slice(br#"{"token":"#);
    json(&mut out, token);
    out.push(b',');
    members(&mut out, switches, facts, true);
    out.push(b'}');
    out
}

/// `/array/<key>/config.js`: the script PostHog answers, which files the config (and
/// the site apps, none here) under the token for posthog-js to find.
pub fn remote_config_js(token: &str, switches: &Switches, facts: Facts) -> Vec<u8> {
    let mut quoted = Vec::new();
    json(&mut quoted, token);
    // The key is a JSON string; a `</script>` inside it cannot end a script element
    // because keys are checked to be plain ASCII, but `<` is escaped all the same.
    let quoted = String::from_utf8_lossy(&quoted).replace('<', "\\u003c");
    let config =
        String::from_utf8_lossy(&remote_config(token, switches, facts)).replace('<', "\\u003c");
    format!(
        "(function() {{\n  window._POSTHOG_REMOTE_CONFIG = window._POSTHOG_REMOTE_CONFIG || {{}};\n  \
         window._POSTHOG_REMOTE_CONFIG[{quoted}] = {{\n    config: {config},\n    siteApps: []\n  }}\n}})();"
    )
    .into_bytes()
}

/// The members `/decide` and `/flags` end with, as JSON text without braces (the
/// [`crate::flags::Tail`]'s `common`).
pub fn decide_tail(switches: &Switches, facts: Facts) -> String {
    let mut out = Vec::with_capacity(640);
    out.extend_from_slice(DECIDE_ONLY.as_bytes());
    members(&mut out, switches, facts, false);
    // Every piece written is JSON text built from strings, so it is UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// The client config members. `remote` adds what only the remote config carries
/// (`hasFeatureFlags`); decide answers have their own flags.
fn members(out: &mut Vec<u8>, s: &Switches, facts: Facts, remote: bool) {
    let mut field = |name: &str, value: &[u8]| {
        if !matches!(out.last(), Some(b'{' | b',') | None) {
            out.push(b',');
        }
        out.push(b'"');
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
        out.extend_from_slice(value);
    };
    field("supportedCompression", SUPPORTED_COMPRESSION.as_bytes());
    if remote {
        // Rules reload at any time without the client knowing: always let it ask.
        field("hasFeatureFlags", b"true");
    }
    field("captureDeadClicks", boolean(s.capture_dead_clicks));
    let performance = if s.capture_performance || s.web_vitals {
        let mut p = br#"{"network_timing":"#.to_vec();
        p.extend_from_slice(boolean(s.capture_performance));
        p.extend_from_slice(br#","web_vitals":"#);
        p.extend_from_slice(boolean(s.web_vitals));
        p.extend_from_slice(br#","web_vitals_allowed_metrics":"#);
        json(&mut p, &s.web_vitals_allowed_metrics);
        p.push(b'}');
        p
    } else {
        b"false".to_vec()
    };
    field("capturePerformance", &performance);
    field("autocapture_opt_out", boolean(s.autocapture_opt_out));
    let exceptions = if s.autocapture_exceptions {
        format!(r#"{{"endpoint":"{EXCEPTIONS_ENDPOINT}"}}"#).into_bytes()
    } else {
        b"false".to_vec()
    };
    field("autocaptureExceptions", &exceptions);
    field(
        "analytics",
        format!(r#"{{"endpoint":"{ANALYTICS_ENDPOINT}"}}"#).as_bytes(),
    );
    field("elementsChainAsString", b"true");
    let tracking = format!(
        r#"{{"autocaptureExceptions":{},"suppressionRules":[]}}"#,
        s.autocapture_exceptions
    );
    field("errorTracking", tracking.as_bytes());
    // Console logs go to /i/v1/logs, replay to /s/, conversations and product tours
    // to their own APIs: none of them is kept, so none is ever on.
    field("logs", br#"{"captureConsoleLogs":false}"#);
    field("sessionRecording", b"false");
    field("heatmaps", boolean(s.heatmaps));
    field("conversations", b"false");
    field("surveys", boolean(facts.surveys));
    field("productTours", b"false");
    field("defaultIdentifiedOnly", b"true");
    field("siteApps", b"[]");
}

fn boolean(b: bool) -> &'static [u8] {
    if b {
        b"true"
    } else {
        b"false"
    }
}

fn json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing plain data into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn parse(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn everything_off_by_default() {
        let config = parse(&remote_config(
            "phc_k",
            &Switches::default(),
            Facts::default(),
        ));
        assert_eq!(
            config,
            json!({
                "token": "phc_k",
                "supportedCompression": ["gzip", "gzip-js", "lz64"],
                "hasFeatureFlags": true,
                "captureDeadClicks": false,
                "capturePerformance": false,
                "autocapture_opt_out": false,
                "autocaptureExceptions": false,
                "analytics": {"endpoint": "/e/"},
                "elementsChainAsString": true,
                "errorTracking": {"autocaptureExceptions": false, "suppressionRules": []},
                "logs": {"captureConsoleLogs": false},
                "sessionRecording": false,
                "heatmaps": false,
                "conversations": false,
                "surveys": false,
                "productTours": false,
                "defaultIdentifiedOnly": true,
                "siteApps": []
            })
        );
    }

    #[test]
    fn switches_turn_features_on() {
        let switches = Switches {
            autocapture_opt_out: true,
            heatmaps: true,
            autocapture_exceptions: true,
            web_vitals: true,
            web_vitals_allowed_metrics: Some(vec!["LCP".into()]),
            capture_performance: false,
            capture_dead_clicks: true,
        };
        let c = parse(&remote_config("k", &switches, Facts { surveys: true }));
        assert_eq!(c["autocapture_opt_out"], true);
        assert_eq!(c["heatmaps"], true);
        assert_eq!(c["captureDeadClicks"], true);
        assert_eq!(c["surveys"], true);
        assert_eq!(c["autocaptureExceptions"], json!({"endpoint": "/e/"}));
        assert_eq!(c["errorTracking"]["autocaptureExceptions"], true);
        assert_eq!(
            c["capturePerformance"],
            json!({"network_timing": false, "web_vitals": true, "web_vitals_allowed_metrics": ["LCP"]})
        );
    }

    #[test]
    fn decide_tail_is_the_config_without_the_token() {
        let tail = decide_tail(&Switches::default(), Facts::default());
        let body = parse(format!("{{{tail}}}").as_bytes());
        assert_eq!(body["config"], json!({"enable_collect_everything": true}));
        assert_eq!(body["isAuthenticated"], false);
        assert_eq!(body["sessionRecording"], false);
        assert!(body.get("token").is_none());
        assert!(body.get("hasFeatureFlags").is_none());
        let mut config = parse(&remote_config("k", &Switches::default(), Facts::default()));
        let config = config.as_object_mut().unwrap();
        for (k, v) in body.as_object().unwrap() {
            if let Some(same) = config.get(k) {
                assert_eq!(same, v, "{k}");
            }
        }
    }

    #[test]
    fn config_js_files_the_config_under_the_token() {
        let js = String::from_utf8(remote_config_js(
            "phc_k",
            &Switches::default(),
            Facts::default(),
        ))
        .unwrap();
        assert!(js.starts_with("(function() {\n  window._POSTHOG_REMOTE_CONFIG = window._POSTHOG_REMOTE_CONFIG || {};\n  window._POSTHOG_REMOTE_CONFIG[\"phc_k\"] = {\n    config: {\"token\":\"phc_k\","), "{js}");
        assert!(js.ends_with("},\n    siteApps: []\n  }\n})();"), "{js}");
    }

    /// The value tree and the direct writer agree byte for byte with a project's tail;
    /// no version says `quotaLimited` (PostHog writes it only when a quota was hit) and
    /// every version carries its `requestId`.
    #[test]
    fn both_response_writers_end_with_the_tail() {
        use crate::flags::{response_bytes_with, response_with, Evaluation, Tail};
        let switches = Switches {
            heatmaps: true,
            ..Switches::default()
        };
        let common = decide_tail(&switches, Facts::default());
        let tail = Tail {
            evaluated_at: Some(1_700_000_000_123),
            common: &common,
        };
        let id = uuid::Uuid::nil();
        for version in 0..=5 {
            let eval = Evaluation::default();
            let tree = serde_json::to_string(&response_with(version, &eval, id, &tail)).unwrap();
            let direct = String::from_utf8(response_bytes_with(version, &eval, id, &tail)).unwrap();
            assert_eq!(tree, direct, "version {version}");
            let body = parse(direct.as_bytes());
            assert_eq!(body["evaluatedAt"], 1_700_000_000_123_i64);
            assert_eq!(body["heatmaps"], true);
            assert!(body.get("quotaLimited").is_none(), "{version}");
            assert_eq!(body["requestId"], id.to_string(), "{version}");
        }
    }

    #[test]
    fn switches_parse_with_defaults_and_refuse_typos() {
        let s: Switches = serde_json::from_str(r#"{"heatmaps": true}"#).unwrap();
        assert_eq!(
            s,
            Switches {
                heatmaps: true,
                ..Switches::default()
            }
        );
        assert!(serde_json::from_str::<Switches>(r#"{"heatmap": true}"#).is_err());
    }
}
