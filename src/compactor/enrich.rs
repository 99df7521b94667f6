//! What enrichment adds to an event, worked out once per chunk: the GeoIP properties of
//! each client address (as values and as ready-made JSON text, for both ways of
//! applying a record, [`super::apply`] and [`super::splice`]) and whether the project
//! keeps addresses at all.

use std::collections::HashMap;
use std::net::IpAddr;

use serde_json::{Map, Value};

use super::chunk::{Action, Item};
use super::Compactor;

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

impl Compactor {
    /// The GeoIP properties of every address in the chunk, each looked up once: a
    /// chunk's events often come from a few clients.
    pub(super) fn geo(&self, items: &[Item]) -> HashMap<IpAddr, Geo> {
        let mut out = HashMap::new();
        for item in items {
            if let Action::Apply(r) = &item.action {
                if let Some(ip) = r.ip {
                    out.entry(ip)
                        .or_insert_with(|| Geo::new(self.geoip.lookup(ip)).with_ip(ip));
                }
            }
        }
        out
    }

    /// The settings of each project with events in the chunk, each read once.
    pub(super) fn project_settings(&self, items: &[Item]) -> HashMap<u64, ProjectSettings> {
        let projects = self.projects.load();
        let mut out = HashMap::new();
        for item in items {
            if let Action::Apply(r) = &item.action {
                out.entry(r.project).or_insert_with(|| {
                    projects
                        .by_id(r.project)
                        .map_or_else(ProjectSettings::default, |p| ProjectSettings {
                            anonymize_ips: p.anonymize_ips,
                        })
                });
            }
        }
        out
    }
}
