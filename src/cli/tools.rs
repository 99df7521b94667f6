//! The commands that answer a question and exit: `eval` (what one user gets from each
//! flag, and why) and `key new` (a new random key for `projects.json`, or a personal key stored there
//! as a labelled hash).

use std::path::PathBuf;

use argh::FromArgs;
use serde_json::Value;

use super::or_env;

#[derive(FromArgs)]
/// Print each flag's value for one user and PostHog's reason for it, evaluated as /decide
/// evaluates them. Reads the data dir's flag files and the properties given here only,
/// so it works beside a running server; with --db, the person's and groups' stored
/// properties come first (the database of a stopped server). GeoIP properties are not
/// added.
#[argh(subcommand, name = "eval")]
pub(super) struct Eval {
    /// the project id
    #[argh(option)]
    project: u64,
    /// the user's distinct id
    #[argh(option)]
    distinct_id: String,
    /// a person property as KEY=VALUE, repeatable; VALUE is read as JSON when it is JSON (30, true, "x", ["a","b"]), else as text
    #[argh(option)]
    prop: Vec<String>,
    /// a group as TYPE=KEY (e.g. company=acme), repeatable
    #[argh(option)]
    group: Vec<String>,
    /// a property of a given group as TYPE:KEY=VALUE (e.g. company:seats=50), repeatable; VALUE as for --prop
    #[argh(option)]
    group_prop: Vec<String>,
    /// directory with flags/ and surveys/ [env FLAGPOST_DATA_DIR, default ./data]
    #[argh(option)]
    data_dir: Option<PathBuf>,
    /// the flag files [env FLAGPOST_FLAGS_DIR, default <data dir>/flags]
    #[argh(option)]
    flags_dir: Option<PathBuf>,
    /// a stopped server's database, to use the stored person and group properties; not read unless given
    #[argh(option)]
    db: Option<PathBuf>,
}

#[derive(FromArgs)]
/// Make keys for projects.json.
#[argh(subcommand, name = "key")]
pub(super) struct Key {
    #[argh(subcommand)]
    command: KeyCommand,
}

#[derive(FromArgs)]
#[argh(subcommand)]
enum KeyCommand {
    New(KeyNew),
}

#[derive(FromArgs)]
/// Print a new random project API key (phc_...) from the system's CSPRNG; with
/// --personal, a personal API key (phx_...) for the read and management APIs. Where it
/// goes in projects.json is said on standard error. With --project and --label, a
/// personal key whose SHA-256 is stored with that label in the project's
/// personal_api_keys instead, limited to --scope if given; with --secret, a project
/// secret key (phs_...) stored the same way in secret_api_keys (the rest of the file
/// kept as it is; a running server takes it within seconds): the key itself is printed
/// once and kept nowhere.
#[argh(subcommand, name = "new")]
struct KeyNew {
    /// the project the key is for, named in the hint
    #[argh(option)]
    project: Option<u64>,
    /// a personal API key (phx_...) instead of a project key
    #[argh(switch)]
    personal: bool,
    /// a project secret key (phs_...) that reads the project's flag definitions and nothing else (needs --project and --label)
    #[argh(switch)]
    secret: bool,
    /// a scope of the personal key, PostHog's names such as feature_flag:read (repeatable; none: every right; needs --label)
    #[argh(option)]
    scope: Vec<String>,
    /// store the new personal key's hash under this label in projects.json (needs --project; 1-40 characters, unique within the project)
    #[argh(option)]
    label: Option<String>,
    /// directory with projects.json, for --label [env FLAGPOST_DATA_DIR, default ./data]
    #[argh(option)]
    data_dir: Option<PathBuf>,
}

pub(super) fn eval(args: Eval) -> Result<(), String> {
    let data_dir = or_env(args.data_dir, "FLAGPOST_DATA_DIR")?.unwrap_or_else(|| "data".into());
    let mut req = flagpost::admin::Request {
        project: args.project,
        distinct_id: args.distinct_id,
        ..Default::default()
    };
    for prop in &args.prop {
        let (key, value) = split(prop, "--prop", "KEY=VALUE")?;
        req.person_properties
            .insert(key.to_owned(), value_of(value));
    }
    for group in &args.group {
        let (kind, key) = split(group, "--group", "TYPE=KEY")?;
        req.groups
            .insert(kind.to_owned(), Value::String(key.to_owned()));
    }
    for prop in &args.group_prop {
        let shape = "TYPE:KEY=VALUE";
        let (name, value) = split(prop, "--group-prop", shape)?;
        let (kind, key) = split_at(name, ':', prop, "--group-prop", shape)?;
        if !req.groups.contains_key(kind) {
            return Err(format!(
                "--group-prop {prop:?}: no --group {kind}=KEY given"
            ));
        }
        let props = req.group_properties.entry(kind.to_owned()).or_default();
        props.insert(key.to_owned(), value_of(value));
    }
    let flags_dir = super::flags_dir(args.flags_dir, &data_dir)?;
    let evaluation = flagpost::admin::eval(&data_dir, &flags_dir, args.db.as_deref(), &req)
        .map_err(|e| e.to_string())?;
    let rendered = flagpost::admin::render(&evaluation);
    super::Stdout::default().write(format_args!("{rendered}"))
}

/// `KEY=VALUE` split at its first `=`; the key must not be empty.
fn split<'a>(arg: &'a str, flag: &str, shape: &str) -> Result<(&'a str, &'a str), String> {
    split_at(arg, '=', arg, flag, shape)
}

/// `text` split at the first `at`, with a non-empty left side; errors quote `arg`.
fn split_at<'a>(
    text: &'a str,
    at: char,
    arg: &str,
    flag: &str,
    shape: &str,
) -> Result<(&'a str, &'a str), String> {
    match text.split_once(at) {
        Some((key, value)) if !key.is_empty() => Ok((key, value)),
        _ => Err(format!("{flag} {arg:?} is not {shape}")),
    }
}

/// A property value: JSON when it parses as JSON, else the text itself.
fn value_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

pub(super) fn key(args: Key) -> Result<(), String> {
    use flagpost::projects::{KeyList, NewKey};
    let KeyCommand::New(args) = args.command;
    let stored = match (&args.label, args.project) {
        (Some(_), None) => return Err("--label needs --project: the project the key is for".into()),
        (Some(label), Some(project)) => Some((label.as_str(), project)),
        (None, _) => None,
    };
    if args.secret && (stored.is_none() || args.personal) {
        return Err(
            "--secret needs --project and --label, and no --personal: a secret key \
                    is stored hashed in its project's secret_api_keys"
                .into(),
        );
    }
    if !args.scope.is_empty() && (stored.is_none() || args.secret) {
        return Err(
            "--scope needs --project and --label: the scopes are stored with a \
                    personal key's hash"
                .into(),
        );
    }
    let personal = args.personal || (stored.is_some() && !args.secret);
    let key = match args.secret {
        true => flagpost::projects::new_secret_key(),
        false => flagpost::projects::new_key(personal),
    }
    .map_err(|e| format!("the system's random number generator failed: {e}"))?;
    if let Some((label, project)) = stored {
        let data_dir = or_env(args.data_dir, "FLAGPOST_DATA_DIR")?.unwrap_or_else(|| "data".into());
        let path = data_dir.join("projects.json");
        let new = NewKey {
            list: if args.secret {
                KeyList::Secret
            } else {
                KeyList::Personal
            },
            label,
            scopes: &args.scope,
        };
        // Stored before the key is shown: a key that could not be stored is never seen.
        flagpost::projects::add_key(&path, project, &new, &key).map_err(|e| e.to_string())?;
        super::Stdout::default().line(format_args!("{key}"))?;
        eprintln!(
            "stored its SHA-256 as {label:?} in project {project} of {}; a running server \
             takes it within seconds. Keep the key now: it is not kept anywhere.",
            path.display()
        );
        return Ok(());
    }
    super::Stdout::default().line(format_args!("{key}"))?;
    let hint = match (personal, args.project) {
        (true, Some(id)) => {
            format!("add it to \"personal_api_keys\" of project {id} in projects.json")
        }
        (true, None) => "add it to a project's \"personal_api_keys\" in projects.json".into(),
        (false, Some(id)) => format!("in projects.json: {{\"id\": {id}, \"api_key\": \"{key}\"}}"),
        (false, None) => {
            format!("in projects.json: {{\"id\": <project id>, \"api_key\": \"{key}\"}}")
        }
    };
    eprintln!("{hint}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn props_are_json_when_they_are_json() {
        assert_eq!(value_of("30"), Value::from(30));
        assert_eq!(value_of("true"), Value::Bool(true));
        assert_eq!(value_of("[\"a\",1]"), serde_json::json!(["a", 1]));
        assert_eq!(value_of("\"30\""), Value::from("30"));
        assert_eq!(value_of("pro"), Value::from("pro"));
        assert_eq!(value_of("1.2.3"), Value::from("1.2.3"));
        assert_eq!(value_of(""), Value::from(""));
        assert_eq!(split("a=b=c", "--prop", "KEY=VALUE"), Ok(("a", "b=c")));
        assert_eq!(
            split("=b", "--prop", "KEY=VALUE"),
            Err("--prop \"=b\" is not KEY=VALUE".to_owned())
        );
    }
}
