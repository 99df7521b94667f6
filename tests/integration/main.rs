//! End-to-end tests against the real binary over loopback. One test binary, as
//! every file here is a module of it.

mod admin;
mod backpressure;
mod backup;
mod capture;
mod capture_v1;
mod console;
mod console_find;
mod console_insights;
mod console_origins;
mod crash;
mod damage;
mod decide;
mod docs;
mod feed;
mod flag_files;
mod full_disk;
mod fuzz_regressions;
mod geoip;
mod hints;
mod host;
mod hostile;
mod layers;
mod layout;
mod manage;
mod nodes;
mod ops;
mod package;
mod read_api;
mod refusals;
mod sdk;
mod security;
mod sink;
mod startup;
mod surveys;
mod util;
