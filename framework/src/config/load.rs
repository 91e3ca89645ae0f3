//! [`PipelineConfig`] from a TOML file and `MILLRACE_*` environment variables, layered over the
//! defaults (file, then environment: a variable wins), then validated like a configuration built in
//! code. An error names the field path (`bounds.max_concurrency`) and where the bad value came from.
//!
//! Variables: `MILLRACE_<FIELD>`, with `__` between the parts of a nested field
//! (`MILLRACE_BOUNDS__MAX_CONCURRENCY=64`, `MILLRACE_DELIVERY__EXACTLY_ONCE__TRANSACTIONAL_ID=billing-0`),
//! and, for Kafka client properties, `MILLRACE_KAFKA_<NAME>`, `MILLRACE_CONSUMER_<NAME>`,
//! `MILLRACE_PRODUCER_<NAME>` with `_` for `.` (`MILLRACE_KAFKA_SASL_PASSWORD` sets `sasl.password`,
//! as the `millrace` CLI reads them). Variables whose first part names no field (the project's
//! scripts use `MILLRACE_CACHE`, ...) are not configuration and are left alone.

use super::PipelineConfig;
use crate::error::ConfigError;
use figment::providers::{Format as _, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::Deserialize as _;
use std::path::Path;

/// Prefix of the environment variables [`PipelineConfig::load`] reads.
pub const ENV_PREFIX: &str = "MILLRACE_";

/// The top-level fields a variable may set (its first part), Kafka properties aside.
const FIELDS: [&str; 25] = [
    "bootstrap_servers",
    "group_id",
    "topics",
    "name",
    "ordering",
    "bounds",
    "commit_interval",
    "commit_every_records",
    "drain_timeout",
    "attempt_timeout",
    "cancel_grace",
    "retry",
    "dlq",
    "circuit_breaker",
    "dedup",
    "delivery",
    "kafka",
    "consumer",
    "producer",
    "stall_timeout",
    "blocked_poll_threshold",
    "startup_timeout",
    "fail_on_missing_topic",
    "http",
    "rate_limit",
];

/// The sections of Kafka client properties, and the prefix of their variables.
const PROPERTY_SECTIONS: [(&str, &str); 3] =
    [("kafka", "KAFKA_"), ("consumer", "CONSUMER_"), ("producer", "PRODUCER_")];

impl PipelineConfig {
    /// Loads a configuration from the TOML file `file` (if given) and the `MILLRACE_*` environment
    /// variables (see [`ENV_PREFIX`] and the module docs), over the defaults of
    /// [`PipelineConfig::new`], and validates it. The brokers default to `KAFKA_BOOTSTRAP_SERVERS`
    /// (else `127.0.0.1:9092`) and the name to the group id. Durations are written as `"500ms"`,
    /// `"30s"`, `"7d"`.
    ///
    /// ```toml
    /// group_id = "billing"
    /// topics = ["orders"]
    /// commit_interval = "500ms"
    ///
    /// [bounds]
    /// max_concurrency = 64
    ///
    /// [dedup]
    /// dir = "/var/lib/billing/dedup"
    ///
    /// [kafka]
    /// "security.protocol" = "SASL_SSL"
    /// ```
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with_env(file, std::env::vars())
    }

    /// Like [`load`](Self::load), with `vars` in place of the process environment.
    pub fn load_with_env(
        file: Option<&Path>,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut figment = Figment::new();
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::new("config file", format!("{} is not a readable file", path.display())));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        finish(figment.merge(EnvLayer(env_dict(vars))))
    }

    /// A configuration from TOML text alone (no environment), validated.
    ///
    /// ```
    /// use millrace::PipelineConfig;
    ///
    /// let config = PipelineConfig::from_toml("group_id = 'billing'\ntopics = ['orders']\ncommit_interval = '250ms'")?;
    /// assert_eq!(config.commit_interval, std::time::Duration::from_millis(250));
    ///
    /// let bad = PipelineConfig::from_toml("group_id = 'g'\ntopics = ['t']\n[bounds]\nmax_concurency = 8");
    /// assert_eq!(bad.unwrap_err().field, "bounds.max_concurency");
    /// # Ok::<(), millrace::error::ConfigError>(())
    /// ```
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        finish(Figment::from(Toml::string(text)))
    }

    /// What a file or the environment starts from: the defaults, with no group or topics (which
    /// [`validate`](Self::validate) then asks for by name).
    pub(super) fn unset() -> Self {
        Self::new(Self::bootstrap_from_env(), "", Vec::<String>::new())
    }
}

fn finish(figment: Figment) -> Result<PipelineConfig, ConfigError> {
    let mut config: PipelineConfig = figment.extract().map_err(named)?;
    // As `PipelineConfig::exactly_once` does: one transaction per 100 ms unless the interval is set.
    if config.exactly_once_settings().is_some() && figment.find_value("commit_interval").is_err() {
        config.commit_interval = std::time::Duration::from_millis(100);
    }
    if config.name.is_empty() {
        config.name = config.group_id.clone();
    }
    config.validate()?;
    Ok(config)
}

/// The first of figment's errors as a [`ConfigError`] naming the field and where its value came from.
fn named(errors: figment::Error) -> ConfigError {
    let error = errors.into_iter().next().expect("a figment error holds at least one");
    let field = if error.path.is_empty() { "config".to_owned() } else { error.path.join(".") };
    let from = error.metadata.as_ref().map(|m| match &m.source {
        Some(figment::Source::File(path)) => path.display().to_string(),
        _ => m.interpolate(&Profile::Default, &error.path),
    });
    let reason = match from {
        Some(from) => format!("{} (in {from})", error.kind),
        None => error.kind.to_string(),
    };
    ConfigError::new(field, reason)
}

/// The configuration the `MILLRACE_*` variables among `vars` spell, as nested tables.
fn env_dict(vars: impl IntoIterator<Item = (String, String)>) -> Dict {
    let mut root = Dict::new();
    for (name, value) in vars {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else { continue };
        if let Some((section, property)) =
            PROPERTY_SECTIONS.iter().find_map(|(s, p)| rest.strip_prefix(p).map(|prop| (*s, prop)))
        {
            let property = property.to_ascii_lowercase().replace('_', ".");
            insert(&mut root, &[section, &property], Value::from(value));
            continue;
        }
        let lower = rest.to_ascii_lowercase();
        let path: Vec<&str> = lower.split("__").collect();
        if FIELDS.contains(&path[0]) {
            let parsed = value.parse::<Value>().unwrap_or_else(|_| Value::from(value));
            insert(&mut root, &path, parsed);
        }
    }
    root
}

fn insert(dict: &mut Dict, path: &[&str], value: Value) {
    match path {
        [] => {}
        [last] => {
            dict.insert((*last).to_owned(), value);
        }
        [first, rest @ ..] => {
            let entry = dict.entry((*first).to_owned()).or_insert_with(|| Value::from(Dict::new()));
            if !matches!(entry, Value::Dict(..)) {
                *entry = Value::from(Dict::new());
            }
            if let Value::Dict(_, inner) = entry {
                insert(inner, rest, value);
            }
        }
    }
}

/// The environment's layer, named so that an error says which variable held the bad value.
struct EnvLayer(Dict);

impl Provider for EnvLayer {
    fn metadata(&self) -> Metadata {
        Metadata::named("environment")
            .interpolater(|_: &Profile, keys: &[&str]| format!("{ENV_PREFIX}{}", keys.join("__").to_ascii_uppercase()))
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.0.clone()))
    }
}

/// `topics` as a list, or as one comma-separated string (`MILLRACE_TOPICS=orders,payments`).
pub(super) fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => s.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned).collect(),
        OneOrMany::Many(v) => v,
    })
}

#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;
