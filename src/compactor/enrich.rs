//! What enrichment adds to an event, worked out once per chunk: the GeoIP properties of
//! each client address (as values and as ready-made JSON text, for both ways of
//! applying a record, [`super::apply`] and [`super::splice`]) and whether the project
//! keeps addresses at all.

use serde_json::{Map, Value};

/// What the project asks of enrichment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProjectSettings {
    pub anonymize_ips: bool,
}

/// The GeoIP properties of one address, with the `$initial_geoip_*` names `$set_once`
/// uses, looked up once per chunk for all the events from that address, and ready to
/// splice into event text.
#[derive(Debug, Default)]
pub struct Geo {
    pub found: crate::geoip::Properties,
    pub initial: Vec<String>,
    /// Each value of `found` as JSON text.
    pub json: Vec<String>,
    /// `found` as the `$set` and `$set_once` objects enrichment adds, as values and as
    /// text.
    pub objects: [Value; 2],
    pub texts: [String; 2],
    /// Every key starts with `$geoip_` (so its initial name with `$initial_geoip_`):
    /// then text without [`GEO_KEY_STARTS`] holds none of them.
    pub prefixed: bool,
    /// The address as a JSON string, for `$ip`.
    pub ip: Option<String>,
}

/// How the keys of GeoIP properties start in JSON text, in `$set` and `$set_once`.
pub const GEO_KEY_STARTS: [&str; 2] = ["\"$geoip_", "\"$initial_geoip_"];

impl Geo {
    pub fn new(found: crate::geoip::Properties) -> Geo {
        // "$geoip_city_name" becomes "$initial_geoip_city_name".
        let initial: Vec<String> = found
            .iter()
            .map(|(k, _)| match k.strip_prefix('$') {
                Some(rest) => format!("$initial_{rest}"),
                None => k.to_string(),
            })
            .collect();
        let json = found
            .iter()
            .map(|(_, v)| serde_json::to_string(v).unwrap_or_else(|_| "null".into()))
            .collect();
        let set: Map<String, Value> = found
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let set_once: Map<String, Value> = initial
            .iter()
            .zip(&found)
            .map(|(k, (_, v))| (k.clone(), v.clone()))
            .collect();
        let objects = [Value::Object(set), Value::Object(set_once)];
        let texts = objects
            .each_ref()
            .map(|o| serde_json::to_string(o).unwrap_or_else(|_| "{}".into()));
        let prefixed = found
            .iter()
            .all(|(k, _)| k.starts_with(&GEO_KEY_STARTS[0][1..]));
        Geo {
            found,
            initial,
            json,
            objects,
            texts,
            prefixed,
            ip: None,
        }
    }

    /// The same, for events from `ip`.
    pub fn with_ip(mut self, ip: std::net::IpAddr) -> Geo {
        self.ip = Some(format!("\"{ip}\""));
        self
    }
}
